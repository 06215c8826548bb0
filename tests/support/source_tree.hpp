#pragma once

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

/// Files of the source tree (oracle scripts, fixtures) found at run time, for the test
/// binaries that are not compiled with COMPUTRON_SOURCE_DIR.
namespace computron::test {

/// A file of the source tree, looked for upward from the working directory and from the
/// test binary (ctest runs it in the build tree); empty when neither finds it.
inline std::string source_file(const std::string& relative) {
  namespace fs = std::filesystem;
  std::vector<fs::path> starts{fs::current_path()};
  std::error_code ec;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  for (auto& start : starts)
    for (auto p = start;; p = p.parent_path()) {
      if (fs::exists(p / relative)) return (p / relative).string();
      if (p == p.parent_path()) break;
    }
  return {};
}

}  // namespace computron::test
