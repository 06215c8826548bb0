// Strict reading of a config's JSON object: the checks that are not templates.
#include "serve/json_fields.hpp"

#include "common/error.hpp"

namespace computron::serve {

caf::error bad(const std::string& where, const std::string& why) {
  return make_error(ec::invalid_configuration, where + ": " + why);
}

caf::error mib_to_bytes(double mb, const std::string& where, const char* key, uint64_t& out) {
  constexpr double max_mb = 1024.0 * 1024 * 1024;
  if (!(mb >= 0 && mb <= max_mb))
    return bad(where, fmt::format("{} must be from 0 to {:.0f} (1 PiB)", key, max_mb));
  out = static_cast<uint64_t>(mb * mib);
  return {};
}

caf::error check_time(int64_t value, int64_t max, const std::string& where, const char* key) {
  if (value < 0 || value > max) return bad(where, fmt::format("{} must be from 0 to {}", key, max));
  return {};
}

caf::error check_keys(const nlohmann::json& j, const std::string& where,
                      std::set<std::string> allowed) {
  if (!j.is_object()) return bad(where, "must be a JSON object");
  for (auto& [k, _] : j.items())
    if (allowed.count(k) == 0) return bad(where, "unknown key '" + k + "'");
  return {};
}

}  // namespace computron::serve
