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

/// A fresh folder under temp_path, removed with everything in it when it goes.
class temp_dir {
 public:
  explicit temp_dir(const std::string& name = "dir") : path_(temp_path(name + "-" + next_id())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::string& path() const { return path_; }

 private:
  static std::string next_id() {
    static int n = 0;
    return std::to_string(n++);
  }
  std::string path_;
};

}  // namespace computron::test
