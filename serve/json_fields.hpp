#pragma once

// Strict reading of a config's JSON object, shared by every section of the serve config
// and by a model folder's config.json and computron.json: unknown keys, wrong types and
// out-of-range values are errors that name the key. The files themselves are read with
// common/json_file.hpp.
#include <cstdint>
#include <exception>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <caf/error.hpp>
#include <nlohmann/json.hpp>

namespace computron::serve {

/// Bytes in a MiB: the config gives sizes in MiB.
constexpr double mib = 1048576.0;

/// An invalid_configuration error: "WHERE: WHY".
caf::error bad(const std::string& where, const std::string& why);

/// A size in MiB as bytes. Bounded (1 PiB, beyond any device) because converting a double
/// past 2^64 to an integer is undefined (fuzzing found "capacity_mb": 2.7e64).
caf::error mib_to_bytes(double mb, const std::string& where, const char* key, uint64_t& out);

/// A time from the config, bounded so that it converts to nanoseconds and adds to a clock
/// without overflowing (about 11.6 days in milliseconds, 115 days in seconds).
caf::error check_time(int64_t value, int64_t max, const std::string& where, const char* key);

/// Rejects keys outside `allowed`, so a typo in a config is an error, not a silent default.
caf::error check_keys(const nlohmann::json& j, const std::string& where,
                      std::set<std::string> allowed);

/// Whether `v` is an integer that `T` holds exactly. nlohmann's get<T>() would truncate a
/// wider integer and, for a floating value, convert it with undefined behaviour (found by
/// the serve_config fuzz target: a device index of 1e30).
template <class T>
bool fits(const nlohmann::json& v) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  auto x = v.get<int64_t>();
  if constexpr (std::is_unsigned_v<T>)
    return x >= 0 && static_cast<uint64_t>(x) <= std::numeric_limits<T>::max();
  else
    return x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max();
}

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

/// Reads `key` of `j` into `out` when present, refusing a value of the wrong type or out of
/// the type's range with an error naming the key.
template <class T>
caf::error read(const nlohmann::json& j, const char* key, const std::string& where, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return {};
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return bad(where, std::string{key} + " must be true or false");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number()) return bad(where, std::string{key} + " must be a number");
      if (!it->is_number_integer()) return bad(where, std::string{key} + " must be an integer");
      if (std::is_unsigned_v<T> && !it->is_number_unsigned() && it->get<int64_t>() < 0)
        return bad(where, std::string{key} + " must not be negative");
      if (!fits<T>(*it))
        return bad(where,
                   fmt::format("{} must be an integer from {} to {}", key,
                               std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (!it->is_number()) return bad(where, std::string{key} + " must be a number");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return bad(where, std::string{key} + " must be a string");
    } else if constexpr (is_vector<T>::value && std::is_integral_v<typename T::value_type>) {
      using V = typename T::value_type;
      if (!it->is_array()) return bad(where, std::string{key} + " must be an array of integers");
      for (auto& v : *it)
        if (!fits<V>(v))
          return bad(where, fmt::format("{} must hold integers from {} to {}, not {}", key,
                                        std::numeric_limits<V>::min(),
                                        std::numeric_limits<V>::max(), v.dump()));
    }
    out = it->get<T>();
  } catch (const std::exception& e) {
    return bad(where, std::string{key} + ": " + e.what());
  }
  return {};
}

}  // namespace computron::serve
