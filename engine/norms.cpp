#include "engine/norms.hpp"

#include <cmath>
#include <vector>

#include "engine/host_elements.hpp"

namespace computron::engine {

const char* rms_norm_refusal(const rms_norm_args& a) {
  if (a.rows <= 0 || a.width <= 0) return "no rows or no width";
  if (a.width > (int64_t{1} << 30)) return "a row too wide";
  if (a.x == nullptr || a.weight == nullptr || a.out == nullptr) return "a null pointer";
  if (a.bias != nullptr && a.delta == nullptr) return "a bias without a delta";
  if (a.delta != nullptr && a.sum == nullptr) return "a delta without a sum";
  if (!(a.eps > 0)) return "eps must be positive";
  return nullptr;
}

const char* rms_norm_host_refusal(const rms_norm_args& a) {
  if (a.type == element_type::f16) return "f16 on the host (CPUs run f32 and bf16)";
  return rms_norm_refusal(a);
}

void rms_norm_host(const rms_norm_args& a, int64_t begin, int64_t end) {
  const auto w = static_cast<int32_t>(a.width);
  std::vector<float> x(static_cast<size_t>(w)), other(static_cast<size_t>(w)),
      weight(static_cast<size_t>(w)), bias;
  load(a.type, a.weight, 0, w, weight.data());
  if (a.bias != nullptr) {
    bias.resize(static_cast<size_t>(w));
    load(a.type, a.bias, 0, w, bias.data());
  }
  for (int64_t r = begin; r < end; ++r) {
    const int64_t at = r * a.width;
    load(a.type, a.x, at, w, x.data());
    if (a.delta != nullptr) {
      load(a.type, a.delta, at, w, other.data());
      for (int32_t i = 0; i < w; ++i) x[i] = round_to(a.type, x[i] + other[i]);
      if (!bias.empty())
        for (int32_t i = 0; i < w; ++i) x[i] = round_to(a.type, x[i] + bias[i]);
      store(a.type, a.sum, at, w, x.data());
    }
    // The mean square in f32, as the unfused path's (its sum runs in vector lanes; this
    // one in eight running sums, so the two may differ in the last bits).
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t i = 0;
    for (; i + 8 <= w; i += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += x[i + l] * x[i + l];
    for (; i < w; ++i) lanes[0] += x[i] * x[i];
    float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(w) + a.eps);
    for (int32_t j = 0; j < w; ++j)
      other[j] = round_to(a.type, weight[j] * round_to(a.type, x[j] * inv));
    store(a.type, a.out, at, w, other.data());
  }
}

}  // namespace computron::engine
