#include "text/generation_config.hpp"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/json_file.hpp"

namespace computron::text {

namespace fs = std::filesystem;
using json = nlohmann::json;

caf::expected<generation_defaults> read_generation_defaults(const std::string& folder) {
  generation_defaults d;
  fs::path file{folder};
  std::error_code err;
  if (fs::is_directory(file, err)) file /= "generation_config.json";
  if (!fs::exists(file, err)) return d;
  auto j = read_json_file(file);
  if (!j) return j.error();
  if (!j->is_object())
    return make_error(ec::invalid_configuration, file.string() + ": not a JSON object");
  auto bad = [&](const char* key, const char* why) {
    return make_error(ec::invalid_configuration,
                      fmt::format("{}: '{}' must be {}", file.string(), key, why));
  };
  // Each key: absent or null leaves the default unset.
  auto number = [&](const char* key, std::optional<double>& out, double lo,
                    double hi) -> caf::error {
    auto f = j->find(key);
    if (f == j->end() || f->is_null()) return {};
    if (!f->is_number() || !std::isfinite(f->get<double>()) || f->get<double>() < lo ||
        f->get<double>() > hi)
      return bad(key, "a number in range");
    out = f->get<double>();
    return {};
  };
  auto integer = [&](const char* key, std::optional<int64_t>& out, int64_t lo) -> caf::error {
    auto f = j->find(key);
    if (f == j->end() || f->is_null()) return {};
    if (!f->is_number_integer() || f->get<int64_t>() < lo) return bad(key, "an integer in range");
    out = f->get<int64_t>();
    return {};
  };
  if (auto e = number("temperature", d.temperature, 0, 100)) return e;
  if (auto e = number("top_p", d.top_p, 1e-9, 1)) return e;
  if (auto e = integer("top_k", d.top_k, -1)) return e;
  if (auto e = number("min_p", d.min_p, 0, 1)) return e;
  if (auto e = number("repetition_penalty", d.repetition_penalty, 1e-9, 100)) return e;
  if (auto e = integer("max_new_tokens", d.max_new_tokens, 1)) return e;
  return d;
}

}  // namespace computron::text
