#pragma once

#include <string_view>
#include <utility>

#include <fmt/format.h>

/// The one logging wrapper: library code logs through it, never to stdout. spdlog stays
/// out of headers (it is slow to compile and the sink is a process-wide choice).
namespace computron::log {

enum class level { debug, info, warn, error, off };

/// Writes one line to stderr when `lvl` is at or above the current threshold.
void write(level lvl, std::string_view message);

/// Sets the threshold (default: info; COMPUTRON_LOG_LEVEL=debug|info|warn|error|off).
void set_level(level lvl);

/// Parses "debug", "info", "warn", "error" or "off"; returns false on anything else.
bool parse_level(std::string_view text, level& out);

template <class... Ts>
void debug(fmt::format_string<Ts...> f, Ts&&... xs) {
  write(level::debug, fmt::format(f, std::forward<Ts>(xs)...));
}
template <class... Ts>
void info(fmt::format_string<Ts...> f, Ts&&... xs) {
  write(level::info, fmt::format(f, std::forward<Ts>(xs)...));
}
template <class... Ts>
void warn(fmt::format_string<Ts...> f, Ts&&... xs) {
  write(level::warn, fmt::format(f, std::forward<Ts>(xs)...));
}
template <class... Ts>
void error(fmt::format_string<Ts...> f, Ts&&... xs) {
  write(level::error, fmt::format(f, std::forward<Ts>(xs)...));
}

}  // namespace computron::log
