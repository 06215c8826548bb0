#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

/// Fuzz inputs as files without touching a disk: a memfd, named by its /proc path, for
/// the readers that take a path (they mmap or open it like any file).
namespace computron::fuzz {

class memfile {
 public:
  memfile() : fd_(memfd_create("computron-fuzz", 0)) {}
  ~memfile() {
    if (fd_ >= 0) close(fd_);
  }
  memfile(const memfile&) = delete;
  memfile& operator=(const memfile&) = delete;

  /// Replaces the contents; returns the path that reads them.
  std::string write(const uint8_t* data, size_t size) {
    if (fd_ < 0 || ftruncate(fd_, 0) != 0) return {};
    size_t done = 0;
    while (done < size) {
      auto n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) return {};
      done += static_cast<size_t>(n);
    }
    return "/proc/self/fd/" + std::to_string(fd_);
  }

 private:
  int fd_;
};

/// A folder of the target's own for the readers that take a folder, in memory where
/// there is a tmpfs (it is rewritten on every run), removed at exit.
class scratch_dir {
 public:
  explicit scratch_dir(const std::string& name) {
    std::string tmpl = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    tmpl += "/computron-fuzz-" + name + "-XXXXXX";
    if (mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~scratch_dir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  /// Empty when it could not be made.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Writes one input as two files of `dir` (a folder's two parts, such as a config and a
/// weights index): bytes 0-1 give the length of `first` (modulo what is left), the rest
/// is `second`. False for an input too short to split.
inline bool write_two_files(const std::string& dir, const uint8_t* data, size_t size,
                            const std::string& first, const std::string& second) {
  if (size < 2) return false;
  size_t first_len = (data[0] | (size_t{data[1]} << 8)) % (size - 1);
  auto put = [&](const std::string& name, const uint8_t* p, size_t n) {
    std::ofstream out{dir + "/" + name, std::ios::binary | std::ios::trunc};
    out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n));
  };
  put(first, data + 2, first_len);
  put(second, data + 2 + first_len, size - 2 - first_len);
  return true;
}

}  // namespace computron::fuzz
