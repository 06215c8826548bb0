// The host build of the fused residual add and RMSNorm (engine/norms.hpp) against the
// unfused arithmetic written out one op at a time, in f32 and bf16, and its refusals.
// Torch-free (the torch path's tests hold the decoder's outputs with and without it).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/host_elements.hpp"
#include "engine/norms.hpp"

using namespace computron::engine;

namespace {

/// Values of `type` (bf16 stored as its 16 bits) from floats, and back.
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (auto x : v) out.push_back(float_to_bf16(x));
  return out;
}

std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// The unfused path, one op at a time as libtorch rounds them: x + delta and + bias in the
/// type, the mean square in double here (the reference), the normalised row rounded to the
/// type, then times the weight, rounded.
void reference(element_type t, const std::vector<float>& x, const std::vector<float>* delta,
               const std::vector<float>* bias, const std::vector<float>& weight, int64_t width,
               float eps, std::vector<float>& sum, std::vector<float>& out) {
  const auto rows = static_cast<int64_t>(x.size()) / width;
  sum = x;
  out.assign(x.size(), 0);
  for (int64_t r = 0; r < rows; ++r) {
    double sq = 0;
    for (int64_t i = 0; i < width; ++i) {
      auto at = static_cast<size_t>(r * width + i);
      if (delta) {
        sum[at] = round_to(t, sum[at] + (*delta)[at]);
        if (bias) sum[at] = round_to(t, sum[at] + (*bias)[static_cast<size_t>(i)]);
      }
      sq += static_cast<double>(sum[at]) * sum[at];
    }
    auto inv = 1.0 / std::sqrt(sq / static_cast<double>(width) + eps);
    for (int64_t i = 0; i < width; ++i) {
      auto at = static_cast<size_t>(r * width + i);
      out[at] = round_to(
          t, weight[static_cast<size_t>(i)] * round_to(t, static_cast<float>(sum[at] * inv)));
    }
  }
}

}  // namespace

TEST_CASE("the fused residual add and RMSNorm equal the ops one at a time", "[engine][norms]") {
  std::mt19937 rng{3};
  for (auto type : {element_type::f32, element_type::bf16})
    for (int64_t width : {1, 7, 64, 2048})
      for (int with : {0, 1, 2}) {  // a norm alone, after a delta, after a delta and a bias
        INFO("type " << static_cast<int>(type) << " width " << width << " with " << with);
        const int64_t rows = 5;
        const auto n = static_cast<size_t>(rows * width);
        auto round_all = [&](std::vector<float> v) {
          for (auto& x : v) x = round_to(type, x);
          return v;
        };
        auto x = round_all(random_floats(rng, n, 3.0f));
        auto delta = round_all(random_floats(rng, n, 1.0f));
        auto bias = round_all(random_floats(rng, static_cast<size_t>(width), 0.5f));
        auto weight = round_all(random_floats(rng, static_cast<size_t>(width), 1.0f));
        const float eps = 1e-5f;
        std::vector<float> want_sum, want_out;
        reference(type, x, with > 0 ? &delta : nullptr, with > 1 ? &bias : nullptr, weight, width,
                  eps, want_sum, want_out);

        // The call's buffers in the type's own bytes.
        auto bytes = [&](const std::vector<float>& v) {
          std::vector<uint8_t> b;
          if (type == element_type::f32) {
            b.resize(v.size() * 4);
            std::memcpy(b.data(), v.data(), b.size());
          } else {
            auto h = to_bf16(v);
            b.resize(h.size() * 2);
            std::memcpy(b.data(), h.data(), b.size());
          }
          return b;
        };
        auto bx = bytes(x), bd = bytes(delta), bb = bytes(bias), bw = bytes(weight);
        std::vector<uint8_t> bsum(bx.size()), bout(bx.size());
        rms_norm_args a;
        a.type = type;
        a.rows = rows;
        a.width = width;
        a.x = bx.data();
        a.delta = with > 0 ? bd.data() : nullptr;
        a.sum = with > 0 ? bsum.data() : nullptr;
        a.bias = with > 1 ? bb.data() : nullptr;
        a.weight = bw.data();
        a.out = bout.data();
        a.eps = eps;
        REQUIRE(rms_norm_host_refusal(a) == nullptr);
        // In two ranges, as threads take them.
        rms_norm_host(a, 0, 2);
        rms_norm_host(a, 2, rows);
        std::vector<float> got_sum(n), got_out(n);
        load(type, bout.data(), 0, static_cast<int32_t>(n), got_out.data());
        if (with > 0) {
          load(type, bsum.data(), 0, static_cast<int32_t>(n), got_sum.data());
          CHECK(got_sum == want_sum);  // adds round the same way: exactly equal
        }
        // The mean square's sum in another order moves the scale by an ulp or so; in bf16
        // that may move an element to the next value of the type.
        double worst = 0, scale = 0;
        for (size_t i = 0; i < n; ++i) {
          worst = std::max(worst, static_cast<double>(std::fabs(got_out[i] - want_out[i])));
          scale = std::max(scale, static_cast<double>(std::fabs(want_out[i])));
        }
        CHECK(worst <= scale * (type == element_type::f32 ? 1e-6 : 1.6e-2));
      }
}

TEST_CASE("the fused norm refuses what it cannot compute", "[engine][norms]") {
  std::vector<float> x(8, 1.0f), out(8);
  rms_norm_args a;
  a.rows = 2;
  a.width = 4;
  a.x = x.data();
  a.weight = x.data();
  a.out = out.data();
  CHECK(rms_norm_host_refusal(a) == nullptr);
  auto b = a;
  b.type = element_type::f16;
  CHECK(std::string(rms_norm_host_refusal(b)).find("f16") != std::string::npos);
  b = a;
  b.bias = x.data();
  CHECK(std::string(rms_norm_refusal(b)) == "a bias without a delta");
  b = a;
  b.delta = x.data();
  CHECK(std::string(rms_norm_refusal(b)) == "a delta without a sum");
  b = a;
  b.rows = 0;
  CHECK(rms_norm_refusal(b) != nullptr);
  b = a;
  b.eps = 0;
  CHECK(rms_norm_refusal(b) != nullptr);
  // A row of zeros: eps keeps the scale finite, and the output is zeros.
  std::vector<float> zeros(8, 0.0f);
  a.x = zeros.data();
  rms_norm_host(a, 0, 2);
  for (auto v : out) CHECK(v == 0.0f);
}
