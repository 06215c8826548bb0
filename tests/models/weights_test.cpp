#include <catch2/catch.hpp>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/error.hpp"
#include "models/checkpoint.hpp"
#include "models/safetensors.hpp"
#include "models/weights.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::models;
using computron::test::temp_path;

namespace {

struct host_shard {
  gpu::tensor_table table;
  std::vector<std::byte> bytes;
  const std::byte* tensor(const std::string& n) const {
    return bytes.data() + table.find(n)->offset_bytes;
  }
};

host_shard seeded(const opt_spec& spec, gpu::dtype t, parallel_config par, shard_index s,
                  uint64_t seed) {
  auto table = shard_layout(spec, t, par, s);
  REQUIRE(table);
  host_shard h{*table, std::vector<std::byte>(table->total_bytes())};
  REQUIRE_FALSE(fill_seeded(spec, par, s, h.table, h.bytes.data(), seed));
  return h;
}

/// The unsharded seeded model as a safetensors checkpoint.
void write_full_checkpoint(const opt_spec& spec, gpu::dtype t, const std::string& path) {
  auto full = seeded(spec, t, {1, 1}, {0, 0}, 9);
  std::vector<safetensor> views;
  for (auto& e : full.table.entries())
    views.push_back({e.name, e.type, e.shape, full.bytes.data() + e.offset_bytes, e.size_bytes});
  REQUIRE_FALSE(write_safetensors(path, views, {{"format", "pt"}}));
}

}  // namespace

TEST_CASE("shard k of TP=n holds exactly slice k of the unsharded seeded weights",
          "[models][weights]") {
  auto spec = *find_spec("opt-tiny");
  auto full = seeded(spec, gpu::dtype::f32, {1, 1}, {0, 0}, 42);
  auto h = spec.hidden;
  for (int tp : {2, 4}) {
    for (int r = 0; r < tp; ++r) {
      auto part = seeded(spec, gpu::dtype::f32, {tp, 1}, {r, 0}, 42);
      auto rows = h / tp;
      // Column-parallel q_proj: rows [r*h/tp, (r+1)*h/tp) of the full matrix.
      CHECK(std::memcmp(part.tensor("layers.1.self_attn.q_proj.weight"),
                        full.tensor("layers.1.self_attn.q_proj.weight") + r * rows * h * 4,
                        static_cast<size_t>(rows * h * 4)) == 0);
      CHECK(std::memcmp(part.tensor("layers.1.fc1.bias"),
                        full.tensor("layers.1.fc1.bias") + r * (spec.ffn / tp) * 4,
                        static_cast<size_t>(spec.ffn / tp * 4)) == 0);
      // Row-parallel fc2: columns [r*ffn/tp, ...) of every row.
      auto cols = spec.ffn / tp;
      bool same = true;
      for (int64_t row = 0; row < h; ++row)
        same = same &&
               std::memcmp(part.tensor("layers.0.fc2.weight") + row * cols * 4,
                           full.tensor("layers.0.fc2.weight") + (row * spec.ffn + r * cols) * 4,
                           static_cast<size_t>(cols * 4)) == 0;
      CHECK(same);
      // Vocabulary-parallel embedding: rows [r*vocab/tp, ...) of the full table.
      auto vrows = spec.vocab / tp;
      CHECK(std::memcmp(part.tensor("embed_tokens.weight"),
                        full.tensor("embed_tokens.weight") + r * vrows * h * 4,
                        static_cast<size_t>(vrows * h * 4)) == 0);
      CHECK(part.table.find("embed_tokens.weight")->shape == std::vector<int64_t>{vrows, h});
    }
  }
  // Different seeds give different weights.
  auto other = seeded(spec, gpu::dtype::f32, {1, 1}, {0, 0}, 43);
  CHECK(other.bytes != full.bytes);
}

TEST_CASE("a vocabulary tp does not divide is padded with zero rows on the last rank",
          "[models][weights]") {
  auto spec = *find_spec("opt-tiny");
  spec.vocab = 509;  // prime: 128 rows per rank at tp 4, the last rank's 3 rows padding
  auto full = seeded(spec, gpu::dtype::f32, {1, 1}, {0, 0}, 42);
  const auto h = spec.hidden;
  for (int tp : {2, 4}) {
    const auto rows = vocab_rows(spec.vocab, tp);
    for (int r = 0; r < tp; ++r) {
      auto part = seeded(spec, gpu::dtype::f32, {tp, 2}, {r, 1}, 42);  // the head's copy
      auto real = std::min<int64_t>(rows, spec.vocab - r * rows);
      INFO("tp " << tp << " rank " << r);
      CHECK(part.table.find("embed_tokens.weight")->shape == std::vector<int64_t>{rows, h});
      CHECK(std::memcmp(part.tensor("embed_tokens.weight"),
                        full.tensor("embed_tokens.weight") + r * rows * h * 4,
                        static_cast<size_t>(real * h * 4)) == 0);
      // The padding (none but on the last rank): zeros.
      std::vector<std::byte> zeros(static_cast<size_t>((rows - real) * h * 4));
      if (!zeros.empty())
        CHECK(std::memcmp(part.tensor("embed_tokens.weight") + real * h * 4, zeros.data(),
                          zeros.size()) == 0);
      CHECK(zeros.empty() == (r + 1 < tp));
    }
  }
  // From a checkpoint, the same slices and the same padding.
  auto path = temp_path("odd_vocab.safetensors");
  write_full_checkpoint(spec, gpu::dtype::f32, path);
  auto file = checkpoint::open(path);
  REQUIRE(file);
  for (int r = 0; r < 4; ++r) {
    auto want = seeded(spec, gpu::dtype::f32, {4, 1}, {r, 0}, 9);
    std::vector<std::byte> got(want.bytes.size(), std::byte{0x5a});
    REQUIRE_FALSE(fill_from_checkpoint(spec, {4, 1}, {r, 0}, want.table, got.data(), *file));
    for (auto& e : want.table.entries())
      CHECK(std::memcmp(got.data() + e.offset_bytes, want.bytes.data() + e.offset_bytes,
                        e.size_bytes) == 0);
  }
  std::filesystem::remove(path);
}

TEST_CASE("a checkpoint sharded at registration equals the seeded shards",
          "[models][weights][safetensors]") {
  auto spec = *find_spec("opt-tiny");
  auto path = temp_path("full.safetensors");
  write_full_checkpoint(spec, gpu::dtype::bf16, path);
  auto raw = safetensors_file::open(path);
  REQUIRE(raw);
  CHECK(raw->metadata().at("format") == "pt");
  auto file = checkpoint::open(path);
  REQUIRE(file);
  for (auto [tp, pp] : {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    for (int r = 0; r < tp; ++r) {
      for (int s = 0; s < pp; ++s) {
        auto want = seeded(spec, gpu::dtype::bf16, {tp, pp}, {r, s}, 9);
        std::vector<std::byte> got(want.bytes.size());
        REQUIRE_FALSE(fill_from_checkpoint(spec, {tp, pp}, {r, s}, want.table, got.data(), *file));
        // Padding between tensors is not written by either; compare the tensors.
        for (auto& e : want.table.entries())
          CHECK(std::memcmp(got.data() + e.offset_bytes, want.bytes.data() + e.offset_bytes,
                            e.size_bytes) == 0);
      }
    }
  }
  std::filesystem::remove(path);
}

TEST_CASE("a checkpoint with a wrong shape or a missing tensor is refused by name",
          "[models][weights][safetensors]") {
  auto spec = *find_spec("opt-tiny");
  auto path = temp_path("wrong.safetensors");
  write_full_checkpoint(spec, gpu::dtype::f32, path);
  auto file = checkpoint::open(path);
  REQUIRE(file);
  auto bigger = spec;
  bigger.vocab = 600;
  auto t2 = *shard_layout(bigger, gpu::dtype::f32, {1, 1}, {0, 0});
  std::vector<std::byte> h2(t2.total_bytes());
  CHECK_THAT(render(fill_from_checkpoint(bigger, {1, 1}, {0, 0}, t2, h2.data(), *file)),
             Catch::Contains("has shape [512, 64] in the checkpoint, [600, 64] expected"));
  auto deeper = spec;
  deeper.layers = 3;
  auto t3 = *shard_layout(deeper, gpu::dtype::f32, {1, 1}, {0, 0});
  std::vector<std::byte> h3(t3.total_bytes());
  CHECK_THAT(render(fill_from_checkpoint(deeper, {1, 1}, {0, 0}, t3, h3.data(), *file)),
             Catch::Contains("checkpoint has no tensor 'layers.2."));
  // A tensor of integers cannot be served as weights.
  auto ints = temp_path("ints.safetensors");
  auto full = seeded(spec, gpu::dtype::f32, {1, 1}, {0, 0}, 9);
  std::vector<int32_t> values(static_cast<size_t>(spec.hidden));
  std::vector<safetensor> views;
  for (auto& e : full.table.entries())
    views.push_back({e.name, e.type, e.shape, full.bytes.data() + e.offset_bytes, e.size_bytes});
  for (auto& v : views)
    if (v.name == "final_layer_norm.weight") {
      v.type = gpu::dtype::i32;
      v.data = reinterpret_cast<const std::byte*>(values.data());
    }
  REQUIRE_FALSE(write_safetensors(ints, views));
  auto int_file = checkpoint::open(ints);
  REQUIRE(int_file);
  auto t4 = *shard_layout(spec, gpu::dtype::f32, {1, 2}, {0, 1});
  std::vector<std::byte> h4(t4.total_bytes());
  CHECK_THAT(render(fill_from_checkpoint(spec, {1, 2}, {0, 1}, t4, h4.data(), *int_file)),
             Catch::Contains("'final_layer_norm.weight' is i32 in the checkpoint, f32 expected"));
  std::filesystem::remove(path);
  std::filesystem::remove(ints);
}

TEST_CASE("a checkpoint in one float type is converted once into the served type",
          "[models][weights][safetensors]") {
  auto spec = *find_spec("opt-tiny");
  auto path = temp_path("f32.safetensors");
  write_full_checkpoint(spec, gpu::dtype::f32, path);
  auto file = checkpoint::open(path);
  REQUIRE(file);
  CHECK(file->dtype() == gpu::dtype::f32);
  auto full = seeded(spec, gpu::dtype::f32, {1, 1}, {0, 0}, 9);
  for (auto to : {gpu::dtype::bf16, gpu::dtype::f16}) {
    auto table = *shard_layout(spec, to, {2, 2}, {1, 1});
    std::vector<std::byte> host(table.total_bytes());
    REQUIRE_FALSE(fill_from_checkpoint(spec, {2, 2}, {1, 1}, table, host.data(), *file));
    // Every element is the rounding of the f32 value at its place in the full tensor.
    auto params = shard_params(spec, {2, 2}, {1, 1});
    bool same = true;
    for (auto& p : params) {
      auto e = table.find(p.name);
      auto f = full.table.find(p.name);
      uint64_t n = e->size_bytes / 2;
      for (uint64_t i = 0; i < n; ++i) {
        float x;
        std::memcpy(&x, full.bytes.data() + f->offset_bytes + global_index(p, 2, 1, i) * 4, 4);
        uint16_t h;
        std::memcpy(&h, host.data() + e->offset_bytes + i * 2, 2);
        same = same && h == (to == gpu::dtype::bf16 ? to_bf16(x) : to_f16(x));
      }
    }
    CHECK(same);
  }
  std::filesystem::remove(path);
}

TEST_CASE("seeded weights do not depend on how many threads fill them", "[models][weights]") {
  auto spec = *find_spec("opt-mini");
  for (auto t : {gpu::dtype::f32, gpu::dtype::bf16, gpu::dtype::f16}) {
    set_fill_threads(1);
    auto one = seeded(spec, t, {2, 1}, {1, 0}, 5);
    set_fill_threads(3);
    auto three = seeded(spec, t, {2, 1}, {1, 0}, 5);
    set_fill_threads(0);
    CHECK(one.bytes == three.bytes);
    // And every element is seeded_value of its place in the unsharded tensor.
    auto params = shard_params(spec, {2, 1}, {1, 0});
    bool same = true;
    for (auto& p : params) {
      auto e = one.table.find(p.name);
      auto w = gpu::size_of(t);
      for (uint64_t i = 0; i < e->size_bytes / w; i += 7) {
        float v = seeded_value(5, p.name, global_index(p, 2, 1, i), p.init);
        const auto* at = one.bytes.data() + e->offset_bytes + i * w;
        if (t == gpu::dtype::f32) {
          float x;
          std::memcpy(&x, at, 4);
          same = same && x == v;
        } else {
          uint16_t h;
          std::memcpy(&h, at, 2);
          same = same && h == (t == gpu::dtype::bf16 ? to_bf16(v) : to_f16(v));
        }
      }
    }
    CHECK(same);
  }
}

TEST_CASE("half-precision conversions round to nearest even", "[models][weights]") {
  CHECK(to_bf16(1.0f) == 0x3f80);
  CHECK(to_f16(1.0f) == 0x3c00);
  CHECK(to_f16(65504.0f) == 0x7bff);
  CHECK(to_f16(1e6f) == 0x7c00);  // overflow to infinity
  CHECK(to_f16(-2.0f) == 0xc000);
  CHECK(std::isnan(from_bf16(to_bf16(std::nanf("")))));
  CHECK(std::isnan(from_f16(to_f16(std::nanf("")))));
  CHECK(from_f16(to_f16(5.96e-8f)) == Approx(5.96e-8f).epsilon(0.01));  // smallest subnormal
  std::mt19937 rng{1};
  std::uniform_real_distribution<float> u{-100, 100};
  for (int i = 0; i < 10000; ++i) {
    float x = u(rng);
    CHECK(std::fabs(from_bf16(to_bf16(x)) - x) <= std::fabs(x) / 256);
    CHECK(std::fabs(from_f16(to_f16(x)) - x) <= std::fabs(x) / 2048 + 1e-7f);
  }
}
