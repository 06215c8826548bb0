// A binary that links libtorch. The torch 2.x wheels' libtorch.so exports copies of
// libstdc++'s std::filesystem functions and such a binary binds to them; their
// remove_all crashed on the H100 host (a call through a null pointer). Our own
// remove_tree (common/files.hpp) uses only libc: it must work here, wherever the
// standard library's symbols bind.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "common/files.hpp"

namespace fs = std::filesystem;

TEST_CASE("remove_tree works in a binary that links libtorch", "[models][link]") {
  auto fn = static_cast<std::uintmax_t (*)(const fs::path&, std::error_code&)>(&fs::remove_all);
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(fn), &info) != 0 && info.dli_fname != nullptr)
    WARN("std::filesystem::remove_all binds to " << info.dli_fname);
  auto dir = fs::temp_directory_path() / "computron-link-order-test";
  fs::create_directories(dir / "a");
  std::FILE* f = std::fopen((dir / "a" / "x").c_str(), "w");
  REQUIRE(f);
  std::fclose(f);
  std::string why;
  CHECK(computron::remove_tree(dir.string(), &why));
  CHECK(why.empty());
  CHECK_FALSE(fs::exists(dir));
}
