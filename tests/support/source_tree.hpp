#pragma once

#include <cstdlib>
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

/// The source-tree folder of the test file `file` (pass __FILE__), under
/// $COMPUTRON_SOURCE_DIR when set: __FILE__ is absolute, or relative to the build folder
/// where ccache rewrote it, so a relative one is looked for from the test binary's folders.
inline std::filesystem::path folder_of(const std::string& file) {
  namespace fs = std::filesystem;
  fs::path f{file};
  if (const char* s = std::getenv("COMPUTRON_SOURCE_DIR"); s && *s) {
    // The path inside the tree: from "tests/" on.
    auto text = f.parent_path().generic_string();
    auto at = text.rfind("tests/");
    if (at != std::string::npos) return fs::path{s} / text.substr(at);
  }
  if (f.is_absolute()) return f.parent_path();
  std::error_code err;
  auto exe = fs::read_symlink("/proc/self/exe", err);  // <build>/tests/<binary>
  for (auto& base : {exe.parent_path().parent_path(), exe.parent_path(), fs::current_path(err)})
    if (fs::exists(base / f, err)) return (base / f).parent_path();
  return f.parent_path();
}

}  // namespace computron::test
