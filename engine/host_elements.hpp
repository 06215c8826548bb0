#pragma once

// Elements of a step's tensors on the host: bf16 to and from float (as c10::BFloat16
// rounds), and runs of f32 or bf16 elements loaded into floats and stored back. Shared by
// the host builds of the engine's kernels (paged_attention.cpp, norms.cpp).
#include <cstdint>
#include <cstring>

#include "engine/paged_attention.hpp"

namespace computron::engine {

inline float bf16_to_float(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

/// Round to nearest, ties to even, as c10::BFloat16 does; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

/// `n` elements of type `t` from `p` + `at`, as floats.
inline void load(element_type t, const void* p, int64_t at, int32_t n, float* into) {
  if (t == element_type::f32) {
    std::memcpy(into, static_cast<const float*>(p) + at, sizeof(float) * static_cast<size_t>(n));
    return;
  }
  const auto* src = static_cast<const uint16_t*>(p) + at;
  for (int32_t i = 0; i < n; ++i) into[i] = bf16_to_float(src[i]);
}

inline void store(element_type t, void* p, int64_t at, int32_t n, const float* from) {
  if (t == element_type::f32) {
    std::memcpy(static_cast<float*>(p) + at, from, sizeof(float) * static_cast<size_t>(n));
    return;
  }
  auto* dst = static_cast<uint16_t*>(p) + at;
  for (int32_t i = 0; i < n; ++i) dst[i] = float_to_bf16(from[i]);
}

/// `x` as the type `t` holds it (bf16 rounds; f32 is itself): what each op of the unfused
/// path rounds its result to.
inline float round_to(element_type t, float x) {
  return t == element_type::bf16 ? bf16_to_float(float_to_bf16(x)) : x;
}

}  // namespace computron::engine
