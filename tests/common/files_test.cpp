#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "common/files.hpp"

namespace fs = std::filesystem;
using computron::remove_tree;

namespace {

void touch(const fs::path& p) {
  std::FILE* f = std::fopen(p.c_str(), "w");
  REQUIRE(f);
  std::fputs("x", f);
  std::fclose(f);
}

fs::path fresh(const std::string& name) {
  auto dir = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("remove_tree removes a folder with everything in it", "[common][files]") {
  auto dir = fresh("computron-files-test");
  fs::create_directories(dir / "a" / "b" / "c");
  touch(dir / "top");
  touch(dir / "a" / "b" / "c" / "deep");
  std::string why;
  CHECK(remove_tree(dir.string(), &why));
  CHECK(why.empty());
  CHECK_FALSE(fs::exists(dir));
  // A missing path is no error; a single file goes too.
  CHECK(remove_tree(dir.string()));
  auto file = fresh("computron-files-file") / "f";
  touch(file);
  CHECK(remove_tree(file.string()));
  CHECK_FALSE(fs::exists(file));
  fs::remove_all(file.parent_path());
}

TEST_CASE("remove_tree removes links without following them", "[common][files]") {
  auto outside = fresh("computron-files-outside");
  touch(outside / "keep");
  auto dir = fresh("computron-files-links");
  fs::create_directory_symlink(outside, dir / "link");
  CHECK(remove_tree(dir.string()));
  CHECK_FALSE(fs::exists(dir));
  CHECK(fs::exists(outside / "keep"));  // what the link pointed at is untouched
  fs::remove_all(outside);
}
