#include "text/chat_template.hpp"

#include <new>

#include "common/error.hpp"
#include "text/jinja/ast.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/parser.hpp"

namespace computron::text {

namespace {

caf::error to_error(const jinja::template_error& err) {
  // raise_exception's message (line -1) reaches the client as the template wrote it.
  if (err.line < 0) return make_error(err.code, err.message);
  return make_error(err.code,
                    "chat template line " + std::to_string(err.line) + ": " + err.message);
}

}  // namespace

chat_template::chat_template(std::shared_ptr<const jinja::program> program)
    : program_(std::move(program)) {}

caf::expected<std::shared_ptr<const chat_template>> chat_template::parse(
    const std::string& source) {
  try {
    auto program = std::make_shared<const jinja::program>(jinja::parse_program(source));
    return std::shared_ptr<const chat_template>{new chat_template{std::move(program)}};
  } catch (const jinja::template_error& err) {
    return to_error(err);
  } catch (const std::bad_alloc&) {
    return make_error(ec::out_of_host_memory, "chat template: out of memory while parsing");
  } catch (const std::exception& e) {
    return make_error(ec::invalid_configuration, std::string{"chat template: "} + e.what());
  }
}

template <class Json>
caf::expected<std::string> chat_template::render_json(const Json& context) const {
  if (!context.is_object())
    return make_error(ec::invalid_request, "chat template context must be a JSON object");
  try {
    return jinja::render_program(*program_, jinja::from_json(context));
  } catch (const jinja::template_error& err) {
    return to_error(err);
  } catch (const std::bad_alloc&) {
    return make_error(ec::out_of_host_memory, "chat template: out of memory while rendering");
  } catch (const std::exception& e) {
    return make_error(ec::invalid_request, std::string{"chat template: "} + e.what());
  }
}

caf::expected<std::string> chat_template::render(const nlohmann::json& context) const {
  return render_json(context);
}

caf::expected<std::string> chat_template::render(const nlohmann::ordered_json& context) const {
  return render_json(context);
}

}  // namespace computron::text
