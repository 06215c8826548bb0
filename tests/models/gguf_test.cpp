// common/gguf on GGUF files built here byte by byte: a valid one of each version, values
// dequantized by hand from ggml's block definitions, and one broken file per check the
// reader makes, each refused with an error that says what and where. The gguf Python
// package's own files are gguf_oracle_test.cpp's.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/gguf.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;

namespace {

/// A GGUF file's bytes, little-endian, appended field by field.
struct gguf_bytes {
  std::string b;

  explicit gguf_bytes(uint32_t version = 3, const char* magic = "GGUF") {
    b.append(magic, 4);
    u32(version);
  }
  gguf_bytes& uint(uint64_t v, int width) {
    for (int i = 0; i < width; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  gguf_bytes& u16(uint16_t v) { return uint(v, 2); }
  gguf_bytes& u32(uint32_t v) { return uint(v, 4); }
  gguf_bytes& u64(uint64_t v) { return uint(v, 8); }
  gguf_bytes& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  /// A key and its type id.
  gguf_bytes& key(const std::string& k, uint32_t type) { return str(k).u32(type); }
  /// A tensor info with one dimension per entry of `dims`.
  gguf_bytes& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                     uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (auto d : dims) u64(d);
    return u32(type).u64(offset);
  }
  /// Zeros up to the next multiple of `alignment`.
  gguf_bytes& pad(size_t alignment = 32) {
    b.append((alignment - b.size() % alignment) % alignment, '\0');
    return *this;
  }
  gguf_bytes& raw(const std::string& bytes) {
    b += bytes;
    return *this;
  }
};

/// Writes `bytes` to a fresh file and opens it.
caf::expected<gguf_file> open_bytes(const std::string& bytes) {
  static test::temp_dir dir{"gguf"};
  static int n = 0;
  auto path = dir.path() + "/" + std::to_string(n++) + ".gguf";
  std::ofstream{path, std::ios::binary}.write(bytes.data(),
                                              static_cast<std::streamsize>(bytes.size()));
  return gguf_file::open(path);
}

/// The error `bytes` are refused with.
std::string refusal(const std::string& bytes) {
  auto f = open_bytes(bytes);
  REQUIRE(!f);
  CHECK(is(f.error(), ec::invalid_request));
  return render(f.error());
}

/// Header, one string key, and one F32 tensor of 32 elements, 1.0 .. 32.0.
std::string valid_file(uint32_t version = 3) {
  gguf_bytes g{version};
  g.u64(1).u64(1);
  g.key("general.architecture", 8).str("llama");
  g.tensor("w", {32}, 0, 0).pad();
  for (int i = 1; i <= 32; ++i) {
    float f = static_cast<float>(i);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    g.u32(bits);
  }
  return g.b;
}

/// A header with no metadata and one tensor info, data padded to 32, then `data`.
std::string one_tensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                       const std::string& data) {
  gguf_bytes g;
  g.u64(1).u64(0).tensor("t", std::move(dims), type, offset).pad().raw(data);
  return g.b;
}

}  // namespace

TEST_CASE("gguf versions 2 and 3 read, a moved file keeps its views", "[models][gguf]") {
  for (uint32_t version : {2u, 3u}) {
    auto f = open_bytes(valid_file(version));
    REQUIRE(f);
    CHECK(f->version() == version);
    CHECK(f->alignment() == 32);
    gguf_file moved = std::move(*f);
    CHECK(moved.get_string("general.architecture").value() == "llama");
    auto* w = moved.find_tensor("w");
    REQUIRE(w != nullptr);
    CHECK(w->dims == std::vector<int64_t>{32});
    CHECK(w->size_bytes == 128);
    CHECK(reinterpret_cast<uintptr_t>(w->data) % 32 == 0);
    auto v = dequantize(*w);
    REQUIRE(v);
    for (int i = 0; i < 32; ++i) CHECK((*v)[static_cast<size_t>(i)] == i + 1.0f);
    CHECK(moved.find_tensor("x") == nullptr);
    CHECK(moved.find("x") == nullptr);
  }
}

TEST_CASE("gguf dequantizes ggml's blocks as ggml defines them", "[models][gguf]") {
  auto bytes = [](std::initializer_list<int> v) {
    std::string s;
    for (int x : v) s.push_back(static_cast<char>(x));
    return s;
  };
  std::string nibbles;  // byte j: low nibble j, high nibble 15 - j
  for (int j = 0; j < 16; ++j) nibbles.push_back(static_cast<char>(j | ((15 - j) << 4)));
  auto run = [](const std::string& file) {
    auto f = open_bytes(file);
    REQUIRE(f);
    auto v = dequantize(f->tensors().at(0));
    REQUIRE(v);
    return *v;
  };

  SECTION("Q4_1: q * d + m, low nibbles first") {
    // d = 0.5 (half 0x3800), m = -1 (0xbc00).
    auto v = run(one_tensor({32}, 3, 0, bytes({0x00, 0x38, 0x00, 0xbc}) + nibbles));
    for (int j = 0; j < 16; ++j) {
      CHECK(v[static_cast<size_t>(j)] == j * 0.5f - 1.0f);
      CHECK(v[static_cast<size_t>(j + 16)] == (15 - j) * 0.5f - 1.0f);
    }
  }
  SECTION("Q4_0: (q - 8) * d") {
    auto v = run(one_tensor({32}, 2, 0, bytes({0x00, 0x40}) + nibbles));  // d = 2
    for (int j = 0; j < 16; ++j) {
      CHECK(v[static_cast<size_t>(j)] == (j - 8) * 2.0f);
      CHECK(v[static_cast<size_t>(j + 16)] == (7 - j) * 2.0f);
    }
  }
  SECTION("Q8_0: q * d over signed bytes") {
    std::string qs;
    for (int j = 0; j < 32; ++j) qs.push_back(static_cast<char>(j * 8 - 128));
    auto v = run(one_tensor({32}, 8, 0, bytes({0x00, 0x34}) + qs));  // d = 0.25
    for (int j = 0; j < 32; ++j) CHECK(v[static_cast<size_t>(j)] == (j * 8 - 128) * 0.25f);
  }
  SECTION("F16 and BF16: subnormals, signs, infinities") {
    auto h = run(one_tensor({4}, 1, 0, bytes({0x01, 0x00, 0x00, 0x80, 0x00, 0x7c, 0xff, 0x7b})));
    CHECK(h[0] == 5.9604644775390625e-8f);
    CHECK((h[1] == 0.0f && std::signbit(h[1])));
    CHECK(std::isinf(h[2]));
    CHECK(h[3] == 65504.0f);
    auto b = run(one_tensor({2}, 30, 0, bytes({0x80, 0x3f, 0x20, 0xc1})));
    CHECK(b[0] == 1.0f);
    CHECK(b[1] == -10.0f);
  }
}

TEST_CASE("gguf refuses broken files, saying what and where", "[models][gguf]") {
  auto valid = valid_file();
  SECTION("magic and version") {
    auto bad = valid;
    bad[3] = 'X';
    CHECK_THAT(refusal(bad), Catch::Contains("does not start with \"GGUF\""));
    CHECK_THAT(refusal(valid_file(1)), Catch::Contains("GGUF version 1 is not supported"));
    CHECK_THAT(refusal(valid_file(0x03000000)), Catch::Contains("big-endian"));
  }
  SECTION("truncation anywhere") {
    CHECK_THAT(refusal(valid.substr(0, 20)), Catch::Contains("shorter than the 24-byte header"));
    // Every cut inside the header and metadata is an error, never a crash.
    for (size_t n = 24; n < 90; ++n)
      CHECK_THAT(refusal(valid.substr(0, n)), Catch::Contains("byte"));
    CHECK_THAT(refusal(valid.substr(0, valid.size() - 1)),
               Catch::Contains("tensor 'w': 128 bytes at offset 0 run past the end of the file"));
  }
  SECTION("a string longer than the file") {
    gguf_bytes g;
    g.u64(0).u64(1).u64(1000000).raw("general.name");
    CHECK_THAT(refusal(g.b), Catch::Contains("metadata entry 0: a string of 1000000 bytes"));
    gguf_bytes v;
    v.u64(0).u64(1).key("name", 8).u64(1ull << 62);
    CHECK_THAT(refusal(v.b), Catch::Contains("metadata 'name': a string of"));
  }
  SECTION("counts beyond what the file could hold") {
    gguf_bytes t;
    t.u64(1000000000000000000ull).u64(0).pad();
    CHECK_THAT(refusal(t.b), Catch::Contains("1000000000000000000 tensors cannot fit"));
    gguf_bytes k;
    k.u64(0).u64(~0ull);
    CHECK_THAT(refusal(k.b), Catch::Contains("metadata entries cannot fit"));
    gguf_bytes a;
    a.u64(0).u64(1).key("tokenizer.ggml.tokens", 9).u32(8).u64(1ull << 40).str("x");
    CHECK_THAT(refusal(a.b), Catch::Contains("metadata 'tokenizer.ggml.tokens': 1099511627776 "
                                             "elements of string"));
    gguf_bytes s;
    s.u64(0).u64(1).key("tokens", 9).u32(8).u64(3).str("a").str("b").u64(50);
    CHECK_THAT(refusal(s.b), Catch::Contains("metadata 'tokens' element 2: a string of 50"));
  }
  SECTION("bad types and values") {
    gguf_bytes v;
    v.u64(0).u64(1).key("k", 13).u64(0);
    CHECK_THAT(refusal(v.b), Catch::Contains("metadata 'k' has type id 13"));
    gguf_bytes e;
    e.u64(0).u64(1).key("k", 9).u32(77).u64(0);
    CHECK_THAT(refusal(e.b), Catch::Contains("metadata 'k': array of type id 77"));
    gguf_bytes deep;
    deep.u64(0).u64(1).key("k", 9);
    for (int i = 0; i < 6; ++i) deep.u32(9).u64(1);
    deep.u32(0).u64(0);
    CHECK_THAT(refusal(deep.b), Catch::Contains("arrays nested deeper than 4"));
    gguf_bytes twice;
    twice.u64(0).u64(2).key("k", 0).raw("a").key("k", 0).raw("b");
    CHECK_THAT(refusal(twice.b), Catch::Contains("metadata 'k' appears twice"));
    gguf_bytes align;
    align.u64(0).u64(1).key("general.alignment", 4).u32(48);
    CHECK_THAT(refusal(align.b), Catch::Contains("general.alignment 48 is not a power of two"));
  }
  SECTION("bad tensor infos") {
    std::string block(34, '\0');
    CHECK_THAT(refusal(one_tensor({32}, 4, 0, block)), Catch::Contains("unknown ggml type id 4"));
    CHECK_THAT(refusal(one_tensor({}, 0, 0, block)), Catch::Contains("has 0 dimensions"));
    CHECK_THAT(refusal(one_tensor({1, 1, 1, 1, 1}, 0, 0, block)),
               Catch::Contains("has 5 dimensions"));
    CHECK_THAT(
        refusal(one_tensor({16}, 8, 0, block)),
        Catch::Contains("tensor 't': row length 16 is not a multiple of Q8_0's block of 32"));
    CHECK_THAT(refusal(one_tensor({1ull << 62, 4}, 0, 0, block)), Catch::Contains("overflow"));
    CHECK_THAT(refusal(one_tensor({~0ull}, 0, 0, block)), Catch::Contains("negative dimension"));
    CHECK_THAT(refusal(one_tensor({32}, 8, 4096, block)),
               Catch::Contains("tensor 't': 34 bytes at offset 4096 run past the end"));
    CHECK_THAT(refusal(one_tensor({1}, 0, 4, block)),
               Catch::Contains("tensor 't': offset 4 is not a multiple of the alignment 32"));
    gguf_bytes twice;
    twice.u64(2).u64(0).tensor("t", {1}, 0, 0).tensor("t", {1}, 0, 32).pad().raw(block);
    CHECK_THAT(refusal(twice.b), Catch::Contains("tensor 't' appears twice"));
  }
}

TEST_CASE("gguf maps types it cannot dequantize, and says so on dequantize", "[models][gguf]") {
  auto f = open_bytes(one_tensor({256}, 14, 0, std::string(210, '\0')));
  REQUIRE(f);
  auto& t = f->tensors().at(0);
  CHECK(gguf_type_name(t.type) == "Q6_K");
  CHECK(t.size_bytes == 210);
  auto v = dequantize(t);
  REQUIRE(!v);
  CHECK(render(v.error()) ==
        "invalid_request: tensor 't' is Q6_K: not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1 "
        "are)");
  CHECK(gguf_type_name(4) == "type 4");

  // A zero dimension: no bytes, nothing to write (the fuzzer's regression-empty-f32).
  auto empty = open_bytes(one_tensor({0, 3}, 0, 0, ""));
  REQUIRE(empty);
  CHECK(empty->tensors().at(0).size_bytes == 0);
  CHECK(dequantize(empty->tensors().at(0)).value().empty());

  // A caller's tensor whose bytes disagree with its dims is refused before any write.
  gguf_tensor bad{"b", 2, {64}, t.data, 18};
  CHECK_THAT(render(dequantize(bad).error()), Catch::Contains("has 18 bytes, Q4_0 of 64 needs 36"));
}

TEST_CASE("gguf getters check types and ranges", "[models][gguf]") {
  gguf_bytes g;
  g.u64(0).u64(6);
  g.key("big", 10).u64(~0ull);
  g.key("small", 3).u16(0xfffe);
  g.key("f", 6).u32(0x3fc00000);
  g.key("flags", 9).u32(7).u64(2).raw(std::string("\x01\x00", 2));
  g.key("ids", 9).u32(10).u64(2).u64(5).u64(~0ull);
  g.key("huge", 9).u32(12).u64(1).u64(0x7e37e43c8800759cull);  // 1e300
  auto f = open_bytes(g.b);
  REQUIRE(f);
  CHECK(f->get_int("small").value() == -2);
  CHECK_THAT(render(f->get_int("big").error()), Catch::Contains("does not fit in int64"));
  CHECK(f->get_float("f").value() == 1.5);
  CHECK_THAT(render(f->get_string("f").error()),
             Catch::Contains("metadata 'f' is float32, not a string"));
  CHECK_THAT(render(f->get_strings("flags").error()),
             Catch::Contains("metadata 'flags' is an array of bool, not an array of strings"));
  CHECK_THAT(render(f->get_ints("ids").error()), Catch::Contains("past int64"));
  CHECK_THAT(render(f->get_floats("huge").error()), Catch::Contains("past float32"));
  CHECK_THAT(render(f->get_bool("none").error()), Catch::Contains("no metadata 'none'"));
  auto* flags = f->find("flags");
  REQUIRE(flags != nullptr);
  CHECK(std::get<std::vector<bool>>(flags->data) == std::vector<bool>{true, false});
}
