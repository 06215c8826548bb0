#include "common/files.hpp"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace computron {

namespace {

// nftw's callback cannot carry state; errno of the first failure is enough.
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : errno;
}

}  // namespace

bool remove_tree(const std::string& path, std::string* why) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    if (why != nullptr) *why = std::strerror(errno);
    return false;
  }
  // Depth first (children before their folder), without following links.
  int rc = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc == 0) return true;
  if (why != nullptr) *why = std::strerror(rc > 0 ? rc : errno);
  return false;
}

}  // namespace computron
