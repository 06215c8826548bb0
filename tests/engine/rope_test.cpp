// The host build of the fused rotary embedding (engine/rope.hpp) against the unfused ops
// written out one at a time, in f32 and bf16, over strided inputs (a view of a fused q/k/v
// product), grouped kv heads and several columns; and its refusals. Torch-free.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/host_elements.hpp"
#include "engine/rope.hpp"

using namespace computron::engine;

namespace {

struct rope_shape {
  int64_t rows, columns, heads, kv_heads, head_dim;
};

/// A call over one q/k/v product's output [rows, columns, (heads + 2 kv heads) x d] in the
/// type's bytes at `product`: q, then k, then v in each column; no outputs set.
rope_args product_args(element_type type, rope_shape s, const uint8_t* product,
                       const int64_t* positions, const float* inv_freq) {
  const size_t esize = type == element_type::f32 ? 4 : 2;
  const int64_t width = (s.heads + 2 * s.kv_heads) * s.head_dim;
  rope_args a;
  a.type = type;
  a.rows = s.rows;
  a.columns = s.columns;
  a.heads = s.heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.q = product;
  a.q_row_stride = a.k_row_stride = s.columns * width;
  a.q_column_stride = a.k_column_stride = width;
  a.k = product + static_cast<size_t>(s.heads * s.head_dim) * esize;
  a.positions = positions;
  a.inv_freq = inv_freq;
  return a;
}

}  // namespace

TEST_CASE("the fused rotary embedding equals the ops one at a time", "[engine][rope]") {
  std::mt19937 rng{11};
  std::normal_distribution<float> normal(0, 2.0f);
  for (auto type : {element_type::f32, element_type::bf16}) {
    INFO("type " << static_cast<int>(type));
    const int64_t rows = 3, columns = 4, heads = 4, kv_heads = 2, d = 8, half = d / 2;
    // One product's output [rows, columns, (heads + 2 kv heads) x d]: q, then k, then v.
    const int64_t width = (heads + 2 * kv_heads) * d;
    std::vector<float> product(static_cast<size_t>(rows * columns * width));
    for (auto& x : product) x = round_to(type, normal(rng));
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      inv_freq[static_cast<size_t>(i)] =
          static_cast<float>(1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / d));
    std::vector<int64_t> positions;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < columns; ++c) positions.push_back(r * 100 + c * 7);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));

    // The reference: cos and sin rounded to the type, x cos and rotate_half(x) sin rounded,
    // their sum rounded, then q times the scale (in f32, as libtorch applies a double).
    auto reference = [&](int64_t offset_heads, int64_t n_heads, bool query) {
      std::vector<float> out(static_cast<size_t>(rows * n_heads * columns * d));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < columns; ++c)
          for (int64_t h = 0; h < n_heads; ++h)
            for (int64_t i = 0; i < d; ++i) {
              const float* x = product.data() + (r * columns + c) * width + (offset_heads + h) * d;
              float angle = static_cast<float>(positions[static_cast<size_t>(r * columns + c)]) *
                            inv_freq[static_cast<size_t>(i % half)];
              float cs = round_to(type, std::cos(angle)), sn = round_to(type, std::sin(angle));
              float rot = i < half ? -x[i + half] : x[i - half];
              float v = round_to(type, round_to(type, x[i] * cs) + round_to(type, rot * sn));
              if (query) v = round_to(type, v * static_cast<float>(scale));
              out[static_cast<size_t>(((r * n_heads + h) * columns + c) * d + i)] = v;
            }
      return out;
    };
    auto want_q = reference(0, heads, true);
    auto want_k = reference(heads, kv_heads, false);

    // The call's buffers in the type's own bytes.
    const size_t esize = type == element_type::f32 ? 4 : 2;
    std::vector<uint8_t> in(product.size() * esize);
    store(type, in.data(), 0, static_cast<int32_t>(product.size()), product.data());
    std::vector<uint8_t> q_out(want_q.size() * esize), k_out(want_k.size() * esize);
    auto a = product_args(type, {rows, columns, heads, kv_heads, d}, in.data(), positions.data(),
                          inv_freq.data());
    a.q_scale = scale;
    a.q_out = q_out.data();
    a.k_out = k_out.data();
    REQUIRE(rope_host_refusal(a) == nullptr);
    rope_host(a, 0, 5);
    rope_host(a, 5, rows * columns);
    std::vector<float> got_q(want_q.size()), got_k(want_k.size());
    load(type, q_out.data(), 0, static_cast<int32_t>(got_q.size()), got_q.data());
    load(type, k_out.data(), 0, static_cast<int32_t>(got_k.size()), got_k.data());
    // The same operations in the same order: equal (libm's cos and sin on both sides).
    CHECK(got_q == want_q);
    CHECK(got_k == want_k);
  }
}

TEST_CASE("the fused rotary embedding refuses what it cannot compute", "[engine][rope]") {
  std::vector<float> x(64);
  std::vector<int64_t> pos(2);
  rope_args a;
  a.rows = 1;
  a.columns = 2;
  a.heads = 2;
  a.kv_heads = 1;
  a.head_dim = 8;
  a.q = a.k = x.data();
  a.q_out = a.k_out = x.data();
  a.positions = pos.data();
  a.inv_freq = x.data();
  CHECK(rope_host_refusal(a) == nullptr);
  auto b = a;
  b.head_dim = 7;
  CHECK(std::string(rope_refusal(b)).find("even") != std::string::npos);
  b = a;
  b.type = element_type::f16;
  CHECK(std::string(rope_host_refusal(b)).find("f16") != std::string::npos);
  b = a;
  b.positions = nullptr;
  CHECK(std::string(rope_refusal(b)) == "a null pointer");
  b = a;
  b.kv_heads = 0;
  CHECK(rope_refusal(b) != nullptr);
  // A KV write needs its values and chunks; then the head-major keys may be left out.
  std::vector<int64_t> slots(2, -1);
  b = a;
  b.k_out = nullptr;
  CHECK(std::string(rope_refusal(b)) == "a null pointer");
  b.cache_slots = slots.data();
  CHECK(std::string(rope_refusal(b)).find("without values") != std::string::npos);
  b.v = x.data();
  CHECK(std::string(rope_refusal(b)).find("no chunk") != std::string::npos);
  b.cache_chunks = 1;
  CHECK(std::string(rope_refusal(b)).find("without memory") != std::string::npos);
  b.cache[0] = {x.data(), x.data(), 8};
  CHECK(rope_host_refusal(b) == nullptr);
}

TEST_CASE("the fused rotary embedding writes keys and values into KV slots of several chunks",
          "[engine][rope]") {
  // Two rows of three columns over two chunks of 4 slots, 2 kv heads of d 4: row 0's
  // columns go to chunk 1 slots 3, 0 and 2 (its blocks out of order), row 1's first column
  // is padding and its others go to chunk 0 slots 1 and 2. What rotates into a slot must be
  // what the head-major keys hold for that column, and the value as it is.
  for (auto type : {element_type::f32, element_type::bf16}) {
    INFO("type " << static_cast<int>(type));
    const int64_t rows = 2, columns = 3, heads = 2, kv_heads = 2, d = 4, slots_per_chunk = 4;
    const int64_t width = (heads + 2 * kv_heads) * d;
    std::mt19937 rng{5};
    std::normal_distribution<float> normal(0, 1.0f);
    std::vector<float> product(static_cast<size_t>(rows * columns * width));
    for (auto& x : product) x = round_to(type, normal(rng));
    const size_t esize = type == element_type::f32 ? 4 : 2;
    std::vector<uint8_t> in(product.size() * esize);
    store(type, in.data(), 0, static_cast<int32_t>(product.size()), product.data());
    std::vector<float> inv_freq = {1.0f, 0.01f};
    std::vector<int64_t> positions = {0, 1, 2, 5, 6, 7};
    std::vector<int64_t> slots = {(1LL << 32) | 3, (1LL << 32) | 0, (1LL << 32) | 2, -1, 1, 2};
    const auto chunk_elems = kv_heads * slots_per_chunk * d;
    const float poison = -7.5f;  // exact in bf16 too
    std::vector<std::vector<uint8_t>> keys(2), values(2);
    for (auto* side : {&keys, &values})
      for (auto& c : *side) {
        std::vector<float> filled(static_cast<size_t>(chunk_elems), poison);
        c.resize(static_cast<size_t>(chunk_elems) * esize);
        store(type, c.data(), 0, static_cast<int32_t>(chunk_elems), filled.data());
      }
    std::vector<uint8_t> q_out(static_cast<size_t>(rows * heads * columns * d) * esize),
        k_out(static_cast<size_t>(rows * kv_heads * columns * d) * esize);
    auto a = product_args(type, {rows, columns, heads, kv_heads, d}, in.data(), positions.data(),
                          inv_freq.data());
    a.q_out = q_out.data();
    a.k_out = k_out.data();  // kept here, to compare with what went into the slots
    REQUIRE(rope_host_refusal(a) == nullptr);
    rope_host(a, 0, rows * columns);
    std::vector<uint8_t> q_plain = q_out;
    a.v = in.data() + static_cast<size_t>((heads + kv_heads) * d) * esize;
    a.v_row_stride = a.q_row_stride;
    a.v_column_stride = width;
    a.cache_slots = slots.data();
    a.cache_chunks = 2;
    for (int c = 0; c < 2; ++c)
      a.cache[c] = {keys[c].data(), values[c].data(), slots_per_chunk * d};
    a.k_out = nullptr;
    REQUIRE(rope_host_refusal(a) == nullptr);
    rope_host(a, 0, 4);
    rope_host(a, 4, rows * columns);
    CHECK(q_out == q_plain);  // the queries are the same with or without the write
    std::vector<float> rotated(k_out.size() / esize);
    load(type, k_out.data(), 0, static_cast<int32_t>(rotated.size()), rotated.data());
    std::vector<std::vector<float>> got_k(2, std::vector<float>(static_cast<size_t>(chunk_elems))),
        got_v = got_k;
    for (int c = 0; c < 2; ++c) {
      load(type, keys[c].data(), 0, static_cast<int32_t>(chunk_elems), got_k[c].data());
      load(type, values[c].data(), 0, static_cast<int32_t>(chunk_elems), got_v[c].data());
    }
    int written = 0;
    for (int64_t item = 0; item < rows * columns; ++item) {
      const int64_t r = item / columns, col = item % columns, slot = slots[item];
      if (slot < 0) continue;
      const auto c = static_cast<size_t>(slot >> 32);
      const int64_t at = (slot & 0xffffffff) * d;
      for (int64_t h = 0; h < kv_heads; ++h)
        for (int64_t i = 0; i < d; ++i) {
          const auto e = static_cast<size_t>(h * slots_per_chunk * d + at + i);
          CHECK(got_k[c][e] ==
                rotated[static_cast<size_t>(((r * kv_heads + h) * columns + col) * d + i)]);
          CHECK(got_v[c][e] == product[static_cast<size_t>((r * columns + col) * width +
                                                           (heads + kv_heads + h) * d + i)]);
          got_k[c][e] = got_v[c][e] = poison;  // seen: what is left must be untouched
          ++written;
        }
    }
    CHECK(written == 5 * kv_heads * d);
    for (int c = 0; c < 2; ++c)
      for (size_t e = 0; e < got_k[c].size(); ++e) {
        INFO("chunk " << c << " element " << e);
        CHECK(got_k[c][e] == poison);  // no other slot, and not the padding column's
        CHECK(got_v[c][e] == poison);
      }
  }
}

namespace {

/// Two chunks of `slots` KV slots, kv_heads x d elements each side, every element
/// `poison`, in the type's bytes.
struct kv_chunks {
  std::vector<std::vector<uint8_t>> keys, values;
  int64_t elems;

  kv_chunks(element_type type, int64_t kv_heads, int64_t slots, int64_t d, float poison)
      : keys(2), values(2), elems(kv_heads * slots * d) {
    const size_t esize = type == element_type::f32 ? 4 : 2;
    std::vector<float> filled(static_cast<size_t>(elems), poison);
    for (auto* side : {&keys, &values})
      for (auto& c : *side) {
        c.resize(static_cast<size_t>(elems) * esize);
        store(type, c.data(), 0, static_cast<int32_t>(elems), filled.data());
      }
  }
  /// Chunk c's keys or values as floats.
  std::vector<float> read(element_type type, bool key, int c) const {
    std::vector<float> out(static_cast<size_t>(elems));
    load(type, (key ? keys : values)[static_cast<size_t>(c)].data(), 0, static_cast<int32_t>(elems),
         out.data());
    return out;
  }
};

}  // namespace

TEST_CASE("the KV write without rotation copies keys and values into their slots",
          "[engine][rope]") {
  // OPT's KV write: two rows of three columns into two chunks of 4 slots (row 0's columns
  // to chunk 1 slots 3, 0 and 2; row 1's first is padding, its others chunk 0 slots 1 and
  // 2), 2 kv heads of an odd head dim (nothing rotates, so nothing needs halves). The q/k/v
  // product still holds query heads: the strides step over them, but the call reads none.
  for (auto type : {element_type::f32, element_type::bf16})
    for (bool through_table : {false, true})
      for (bool head_major : {false, true}) {
        INFO("type " << static_cast<int>(type) << ", table " << through_table << ", k_out "
                     << head_major);
        const int64_t rows = 2, columns = 3, heads = 2, kv_heads = 2, d = 5, slots_per_chunk = 4;
        const int64_t width = (heads + 2 * kv_heads) * d;
        std::mt19937 rng{9};
        std::normal_distribution<float> normal(0, 1.0f);
        std::vector<float> product(static_cast<size_t>(rows * columns * width));
        for (auto& x : product) x = round_to(type, normal(rng));
        const size_t esize = type == element_type::f32 ? 4 : 2;
        std::vector<uint8_t> in(product.size() * esize);
        store(type, in.data(), 0, static_cast<int32_t>(product.size()), product.data());
        std::vector<int64_t> slots = {(1LL << 32) | 3, (1LL << 32) | 0, (1LL << 32) | 2, -1, 1, 2};
        const float poison = -7.5f;  // exact in bf16 too
        kv_chunks kv(type, kv_heads, slots_per_chunk, d, poison);
        std::vector<uint8_t> k_out(static_cast<size_t>(rows * kv_heads * columns * d) * esize);

        auto a =
            product_args(type, {rows, columns, heads, kv_heads, d}, in.data(), nullptr, nullptr);
        a.rotate = false;
        a.heads = 0;
        a.q = nullptr;
        a.v = in.data() + static_cast<size_t>((heads + kv_heads) * d) * esize;
        a.v_row_stride = a.q_row_stride;
        a.v_column_stride = width;
        a.cache_slots = slots.data();
        a.cache_chunks = 2;
        std::vector<paged_kv_chunk> table;
        for (int c = 0; c < 2; ++c) {
          if (through_table)
            table.push_back({kv.keys[c].data(), kv.values[c].data(), slots_per_chunk * d});
          else
            a.cache[c] = {kv.keys[c].data(), kv.values[c].data(), slots_per_chunk * d};
        }
        if (through_table) a.cache_table = table.data();
        if (head_major) a.k_out = k_out.data();
        REQUIRE(rope_host_refusal(a) == nullptr);
        rope_host(a, 0, 4);
        rope_host(a, 4, rows * columns);

        auto key_in = [&](int64_t r, int64_t col, int64_t h, int64_t i) {
          return product[static_cast<size_t>((r * columns + col) * width + (heads + h) * d + i)];
        };
        if (head_major) {
          std::vector<float> got(k_out.size() / esize);
          load(type, k_out.data(), 0, static_cast<int32_t>(got.size()), got.data());
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t col = 0; col < columns; ++col)
              for (int64_t h = 0; h < kv_heads; ++h)
                for (int64_t i = 0; i < d; ++i)
                  CHECK(got[static_cast<size_t>(((r * kv_heads + h) * columns + col) * d + i)] ==
                        key_in(r, col, h, i));
        }
        std::vector<std::vector<float>> got_k = {kv.read(type, true, 0), kv.read(type, true, 1)};
        std::vector<std::vector<float>> got_v = {kv.read(type, false, 0), kv.read(type, false, 1)};
        int written = 0;
        for (int64_t item = 0; item < rows * columns; ++item) {
          const int64_t r = item / columns, col = item % columns, slot = slots[item];
          if (slot < 0) continue;
          const auto c = static_cast<size_t>(slot >> 32);
          const int64_t at = (slot & 0xffffffff) * d;
          for (int64_t h = 0; h < kv_heads; ++h)
            for (int64_t i = 0; i < d; ++i) {
              const auto e = static_cast<size_t>(h * slots_per_chunk * d + at + i);
              CHECK(got_k[c][e] == key_in(r, col, h, i));
              CHECK(got_v[c][e] == product[static_cast<size_t>((r * columns + col) * width +
                                                               (heads + kv_heads + h) * d + i)]);
              got_k[c][e] = got_v[c][e] = poison;  // seen: what is left must be untouched
              ++written;
            }
        }
        CHECK(written == 5 * kv_heads * d);
        for (int c = 0; c < 2; ++c)
          for (size_t e = 0; e < got_k[static_cast<size_t>(c)].size(); ++e) {
            INFO("chunk " << c << " element " << e);
            CHECK(got_k[static_cast<size_t>(c)][e] == poison);  // not the padding column's
            CHECK(got_v[static_cast<size_t>(c)][e] == poison);
          }
      }
}

TEST_CASE("the fused rotary embedding writes through a cache table as through inline chunks",
          "[engine][rope]") {
  for (auto type : {element_type::f32, element_type::bf16}) {
    INFO("type " << static_cast<int>(type));
    const int64_t rows = 2, columns = 2, heads = 4, kv_heads = 2, d = 8, slots_per_chunk = 4;
    const int64_t width = (heads + 2 * kv_heads) * d;
    std::mt19937 rng{3};
    std::normal_distribution<float> normal(0, 1.0f);
    std::vector<float> product(static_cast<size_t>(rows * columns * width));
    for (auto& x : product) x = round_to(type, normal(rng));
    const size_t esize = type == element_type::f32 ? 4 : 2;
    std::vector<uint8_t> in(product.size() * esize);
    store(type, in.data(), 0, static_cast<int32_t>(product.size()), product.data());
    std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
    std::vector<int64_t> positions = {3, 4, 40, 41};
    std::vector<int64_t> slots = {(1LL << 32) | 1, 2, -1, (1LL << 32) | 3};
    std::vector<uint8_t> q_out(static_cast<size_t>(rows * heads * columns * d) * esize);
    auto run = [&](bool through_table) {
      kv_chunks kv(type, kv_heads, slots_per_chunk, d, -7.5f);
      auto a = product_args(type, {rows, columns, heads, kv_heads, d}, in.data(), positions.data(),
                            inv_freq.data());
      a.q_out = q_out.data();
      a.v = in.data() + static_cast<size_t>((heads + kv_heads) * d) * esize;
      a.v_row_stride = a.q_row_stride;
      a.v_column_stride = width;
      a.cache_slots = slots.data();
      a.cache_chunks = 2;
      std::vector<paged_kv_chunk> table;
      for (int c = 0; c < 2; ++c) {
        if (through_table)
          table.push_back({kv.keys[c].data(), kv.values[c].data(), slots_per_chunk * d});
        else
          a.cache[c] = {kv.keys[c].data(), kv.values[c].data(), slots_per_chunk * d};
      }
      if (through_table) a.cache_table = table.data();
      REQUIRE(rope_host_refusal(a) == nullptr);
      rope_host(a, 0, rows * columns);
      return std::make_pair(kv.keys, kv.values);
    };
    CHECK(run(true) == run(false));
  }
}

TEST_CASE("the KV write refuses a call without rotation that has query heads or no slots",
          "[engine][rope]") {
  std::vector<float> x(64);
  std::vector<int64_t> slots(2, -1);
  rope_args a;
  a.rows = 1;
  a.columns = 2;
  a.heads = 0;
  a.kv_heads = 1;
  a.head_dim = 7;  // odd: nothing rotates
  a.rotate = false;
  a.k = a.v = x.data();
  a.cache_slots = slots.data();
  a.cache_chunks = 1;
  a.cache[0] = {x.data(), x.data(), 8};
  // No queries, positions or frequencies: none is read.
  CHECK(rope_host_refusal(a) == nullptr);
  auto b = a;
  b.heads = 2;
  CHECK(std::string(rope_refusal(b)).find("query heads") != std::string::npos);
  b = a;
  b.cache_slots = nullptr;
  b.k_out = x.data();
  CHECK(std::string(rope_refusal(b)).find("without slots") != std::string::npos);
  b = a;
  b.v = nullptr;
  CHECK(std::string(rope_refusal(b)).find("without values") != std::string::npos);
  b = a;
  b.k = nullptr;
  CHECK(std::string(rope_refusal(b)) == "a null pointer");
  // Rotating still needs its queries, and its halves.
  b = a;
  b.rotate = true;
  CHECK(rope_refusal(b) != nullptr);
  b.heads = 2;
  b.head_dim = 8;
  CHECK(std::string(rope_refusal(b)) == "a null pointer");

  // A cache table: the inline chunks are not read, only the count is checked.
  std::vector<paged_kv_chunk> table = {{x.data(), x.data(), 8}};
  b = a;
  b.cache[0] = {};
  CHECK(std::string(rope_refusal(b)).find("without memory") != std::string::npos);
  b.cache_table = table.data();
  CHECK(rope_host_refusal(b) == nullptr);
  b.cache_chunks = 0;
  CHECK(std::string(rope_refusal(b)).find("no chunk") != std::string::npos);
  b.cache_chunks = paged_max_chunks + 1;
  CHECK(std::string(rope_refusal(b)).find("no chunk") != std::string::npos);
}
