#include <catch2/catch.hpp>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/error.hpp"
#include "models/safetensors.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::models;
using computron::test::temp_path;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A file whose header is `json` followed by `data_bytes` zero bytes.
std::string with_header(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\0');
}

}  // namespace

TEST_CASE("safetensors round-trip tensors of every dtype", "[models][safetensors]") {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f};
  std::vector<uint16_t> b = {1, 2, 3};
  std::vector<int64_t> c = {-5, 1ll << 40};
  std::vector<uint8_t> d = {9};
  auto path = temp_path("rt.safetensors");
  REQUIRE_FALSE(write_safetensors(
      path,
      {{"a", gpu::dtype::f32, {2, 3}, reinterpret_cast<const std::byte*>(a.data()), 24},
       {"b", gpu::dtype::bf16, {3}, reinterpret_cast<const std::byte*>(b.data()), 6},
       {"c", gpu::dtype::i64, {2}, reinterpret_cast<const std::byte*>(c.data()), 16},
       {"d", gpu::dtype::u8, {}, reinterpret_cast<const std::byte*>(d.data()), 1},
       {"empty", gpu::dtype::f16, {0, 4}, nullptr, 0}},
      {{"producer", "computron"}}));
  auto f = safetensors_file::open(path);
  REQUIRE(f);
  CHECK(f->tensors().size() == 5);
  CHECK(f->metadata().at("producer") == "computron");
  auto ta = f->find("a");
  REQUIRE(ta != nullptr);
  CHECK(ta->type == gpu::dtype::f32);
  CHECK(ta->shape == std::vector<int64_t>{2, 3});
  CHECK(std::memcmp(ta->data, a.data(), 24) == 0);
  CHECK(std::memcmp(f->find("c")->data, c.data(), 16) == 0);
  CHECK(f->find("d")->shape.empty());
  CHECK(f->find("empty")->size_bytes == 0);
  CHECK(f->find("zzz") == nullptr);
  // The header is padded so that the data starts 8-byte aligned.
  auto raw = read_all(path);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i)
    header = (header << 8) | static_cast<uint8_t>(raw[static_cast<size_t>(i)]);
  CHECK(header % 8 == 0);
  std::filesystem::remove(path);
}

TEST_CASE("the writer refuses inconsistent tensors", "[models][safetensors]") {
  float x[2] = {1, 2};
  auto p = temp_path("bad-write.safetensors");
  auto size =
      write_safetensors(p, {{"x", gpu::dtype::f32, {3}, reinterpret_cast<std::byte*>(x), 8}});
  CHECK(is(size, ec::invalid_request));
  CHECK_THAT(render(size), Catch::Contains("dtype x shape needs 12"));
  auto dup =
      write_safetensors(p, {{"x", gpu::dtype::f32, {2}, reinterpret_cast<std::byte*>(x), 8},
                            {"x", gpu::dtype::f32, {2}, reinterpret_cast<std::byte*>(x), 8}});
  CHECK_THAT(render(dup), Catch::Contains("duplicate tensor 'x'"));
  CHECK(is(write_safetensors("/nonexistent-dir/x.safetensors", {}), ec::io_error));
  CHECK_FALSE(std::filesystem::exists(p));
}

TEST_CASE("corrupt and truncated files get clear errors", "[models][safetensors]") {
  auto p = temp_path("corrupt.safetensors");
  auto check_error = [&](const std::string& bytes, const char* expect) {
    write_raw(p, bytes);
    auto f = safetensors_file::open(p);
    REQUIRE_FALSE(f);
    CHECK_THAT(render(f.error()), Catch::Contains(expect));
  };
  check_error("abc", "shorter than the 8-byte header length");
  check_error(with_header("{", 0), "header is not JSON");
  check_error(with_header("[1, 2]", 0), "not a JSON object");
  check_error(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "header of");
  check_error(with_header(R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8),
              "unsupported dtype");
  check_error(with_header(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
              "8 bytes for 3 elements");
  check_error(with_header(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8),
              "outside the 8 data bytes");
  check_error(with_header(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
              "negative dimension");
  check_error(with_header(R"({"w": {"dtype": "F32", "shape": [1]}})", 4), "needs dtype, shape");
  check_error(
      with_header(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})",
          4),
      "overflows");
  auto missing = safetensors_file::open(temp_path("does-not-exist"));
  REQUIRE_FALSE(missing);
  CHECK(is(missing.error(), ec::io_error));
  std::filesystem::remove(p);
}

TEST_CASE("the header parser survives random corruption", "[models][safetensors][fuzz]") {
  float w[16] = {};
  auto good = temp_path("fuzz-src.safetensors");
  REQUIRE_FALSE(
      write_safetensors(good, {{"w", gpu::dtype::f32, {4, 4}, reinterpret_cast<std::byte*>(w), 64},
                               {"v", gpu::dtype::i32, {2}, reinterpret_cast<std::byte*>(w), 8}}));
  auto original = read_all(good);
  auto p = temp_path("fuzz.safetensors");
  std::mt19937 rng{2024};
  int opened = 0;
  for (int i = 0; i < 1500; ++i) {
    auto bytes = original;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng() % 256);
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());  // truncate too
    write_raw(p, bytes);
    auto f = safetensors_file::open(p);  // must return, never crash (ASan watches)
    if (f) {
      ++opened;
      for (auto& [name, t] : f->tensors()) CHECK(t.data + t.size_bytes <= t.data + bytes.size());
    }
  }
  CHECK(opened < 1500);  // most corruptions are caught
  std::filesystem::remove(p);
  std::filesystem::remove(good);
}
