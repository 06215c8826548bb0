#include "common/error.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>

namespace computron {

const char* to_string(ec code) {
  switch (code) {
    case ec::none:
      return "none";
    case ec::unspecified:
      return "unspecified";
    case ec::unknown_model:
      return "unknown_model";
    case ec::not_resident:
      return "not_resident";
    case ec::out_of_device_memory:
      return "out_of_device_memory";
    case ec::out_of_host_memory:
      return "out_of_host_memory";
    case ec::overloaded:
      return "overloaded";
    case ec::deadline_exceeded:
      return "deadline_exceeded";
    case ec::device_error:
      return "device_error";
    case ec::invalid_request:
      return "invalid_request";
    case ec::invalid_configuration:
      return "invalid_configuration";
    case ec::invalid_state:
      return "invalid_state";
    case ec::io_error:
      return "io_error";
    case ec::unavailable:
      return "unavailable";
    case ec::cancelled:
      return "cancelled";
  }
  return "unknown_error_code";
}

caf::error make_error(ec code) {
  return caf::error{static_cast<uint8_t>(code), error_category};
}

caf::error make_error(ec code, std::string context) {
  return caf::error{static_cast<uint8_t>(code), error_category,
                    caf::make_message(std::move(context))};
}

caf::error with_context(const caf::error& err, const std::string& prefix) {
  if (!err) return err;
  std::string text;
  // Ours and CAF's own errors (timeouts, a peer gone) keep code and category, which render()
  // names; the text of their context follows the new prefix.
  if (err.category() != error_category && err.category() != caf::atom("system"))
    text = caf::to_string(err);
  else if (err.context().match_elements<std::string>())
    text = err.context().get_as<std::string>(0);
  else if (!err.context().empty())
    text = caf::to_string(err.context());
  return caf::error{err.code(), err.category(),
                    caf::make_message(text.empty() ? prefix : prefix + ": " + text)};
}

bool is(const caf::error& err, ec code) {
  return err && err.category() == error_category && err.code() == static_cast<uint8_t>(code);
}

namespace {

std::string render_ours(uint8_t code, const caf::message& context) {
  std::string out = to_string(static_cast<ec>(code));
  if (context.match_elements<std::string>()) {
    const auto& text = context.get_as<std::string>(0);
    if (!text.empty()) {
      out += ": ";
      out += text;
    }
  } else if (!context.empty()) {
    out += ": ";
    out += caf::to_string(context);
  }
  return out;
}

}  // namespace

std::string render(const caf::error& err) {
  if (!err) return "no error";
  if (err.category() == error_category) return render_ours(err.code(), err.context());
  if (err.category() == caf::atom("system") &&
      (err.context().empty() || err.context().match_elements<std::string>())) {
    auto out = caf::to_string(static_cast<caf::sec>(err.code()));
    if (!err.context().empty() && !err.context().get_as<std::string>(0).empty())
      out += ": " + err.context().get_as<std::string>(0);
    return out;
  }
  return caf::to_string(err);
}

void register_errors(caf::actor_system_config& cfg) {
  cfg.add_error_category(error_category,
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                           return render_ours(code, ctx);
                         });
}

}  // namespace computron
