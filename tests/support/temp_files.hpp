#pragma once

#include <filesystem>
#include <string>

#include <unistd.h>

namespace computron::test {

/// A path in the temp directory unique to this process, so parallel ctest runs of the
/// same binary never share files.
inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("computron-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

}  // namespace computron::test
