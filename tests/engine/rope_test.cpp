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
    rope_args a;
    a.type = type;
    a.rows = rows;
    a.columns = columns;
    a.heads = heads;
    a.kv_heads = kv_heads;
    a.head_dim = d;
    a.q = in.data();
    a.q_row_stride = columns * width;
    a.q_column_stride = width;
    a.k = in.data() + static_cast<size_t>(heads * d) * esize;
    a.k_row_stride = columns * width;
    a.k_column_stride = width;
    a.positions = positions.data();
    a.inv_freq = inv_freq.data();
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
}
