#include "common/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/error.hpp"

namespace computron {

caf::expected<mapped_file> mapped_file::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(ec::io_error, fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ec::io_error, fmt::format("{} is not a regular file", path));
  }
  mapped_file f;
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ == 0) {  // mmap refuses a length of 0
    ::close(fd);
    return f;
  }
  void* map = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED)
    return make_error(ec::io_error, fmt::format("cannot map {}: {}", path, std::strerror(errno)));
  f.map_ = map;
  return f;
}

mapped_file::mapped_file(mapped_file&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)), size_(std::exchange(other.size_, 0)) {}

mapped_file& mapped_file::operator=(mapped_file&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, size_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

mapped_file::~mapped_file() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

}  // namespace computron
