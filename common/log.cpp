#include "common/log.hpp"

#include <cstdlib>
#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace computron::log {

namespace {

spdlog::level::level_enum to_spdlog(level lvl) {
  switch (lvl) {
    case level::debug:
      return spdlog::level::debug;
    case level::info:
      return spdlog::level::info;
    case level::warn:
      return spdlog::level::warn;
    case level::error:
      return spdlog::level::err;
    case level::off:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

spdlog::logger& logger() {
  // Function-local static: thread-safe initialisation, and the level from the
  // environment applies before the first line is written.
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("computron");
    l->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [computron] %v");
    level lvl = level::info;
    if (const char* env = std::getenv("COMPUTRON_LOG_LEVEL")) parse_level(env, lvl);
    l->set_level(to_spdlog(lvl));
    return l;
  }();
  return *instance;
}

}  // namespace

void write(level lvl, std::string_view message) {
  logger().log(to_spdlog(lvl), message);
}

void set_level(level lvl) {
  logger().set_level(to_spdlog(lvl));
}

bool parse_level(std::string_view text, level& out) {
  if (text == "debug")
    out = level::debug;
  else if (text == "info")
    out = level::info;
  else if (text == "warn")
    out = level::warn;
  else if (text == "error")
    out = level::error;
  else if (text == "off")
    out = level::off;
  else
    return false;
  return true;
}

}  // namespace computron::log
