#include "engine/cuda/rope.hpp"

#include <cuda_runtime.h>

#include "engine/cuda/elements.cuh"

namespace computron::engine::cuda {

namespace {

constexpr int rope_threads = 128;

/// Item blockIdx.x = row x columns + column: every query head's elements, then every key
/// head's, rounded to T where the unfused ops round (engine/rope.hpp); without rotation the
/// keys alone, copied.
template <typename T>
__global__ void __launch_bounds__(rope_threads) rope_kernel(rope_args a, float scale) {
  const int64_t item = blockIdx.x;
  const int64_t r = item / a.columns, c = item % a.columns;
  const int64_t d = a.head_dim, half = d / 2;
  // Without rotation there may be no positions to read.
  const float pos = a.rotate ? static_cast<float>(a.positions[item]) : 0.0f;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  T* q_out = static_cast<T*>(a.q_out);
  T* k_out = static_cast<T*>(a.k_out);
  // The KV write's destination (engine/rope.hpp): nowhere, or the item's slot in a chunk.
  const int64_t slot = a.cache_slots != nullptr ? a.cache_slots[item] : -1;
  const int32_t chunk = static_cast<int32_t>(slot >> 32);
  const bool writes = slot >= 0 && chunk < a.cache_chunks;
  const rope_kv_chunk into = writes ? rope_cache_chunk(a, chunk) : rope_kv_chunk{};
  T* cache_keys = static_cast<T*>(into.keys);
  T* cache_values = static_cast<T*>(into.values);
  const int64_t at = (slot & 0xffffffffLL) * d;
  // Query heads, key heads, then (with a KV write) the values, copied as they are.
  const int64_t total = (a.heads + a.kv_heads * (writes ? 2 : 1)) * d;
  for (int64_t e = threadIdx.x; e < total; e += rope_threads) {
    const int64_t h = e / d, i = e % d;
    if (h >= a.heads + a.kv_heads) {
      const int64_t head = h - a.heads - a.kv_heads;
      const T* v = static_cast<const T*>(a.v);
      cache_values[head * into.head_stride + at + i] =
          v[r * a.v_row_stride + c * a.v_column_stride + head * d + i];
      continue;
    }
    const bool query = h < a.heads;
    const int64_t head = query ? h : h - a.heads;
    const T* in = query ? q + r * a.q_row_stride + c * a.q_column_stride + head * d
                        : k + r * a.k_row_stride + c * a.k_column_stride + head * d;
    if (!a.rotate) {
      // heads is 0: a key, as it is.
      if (k_out != nullptr) k_out[((r * a.kv_heads + head) * a.columns + c) * d + i] = in[i];
      if (writes) cache_keys[head * into.head_stride + at + i] = in[i];
      continue;
    }
    const float angle = pos * a.inv_freq[i % half];
    const float cs = to_float(from_float<T>(cosf(angle)));
    const float sn = to_float(from_float<T>(sinf(angle)));
    const float x = to_float(in[i]);
    const float rotated = i < half ? -to_float(in[i + half]) : to_float(in[i - half]);
    // _rn: no contraction into a fused multiply-add, which the unfused ops (separate
    // kernels) never do; in f32 it would move the last bit.
    float v = to_float(from_float<T>(__fadd_rn(to_float(from_float<T>(__fmul_rn(x, cs))),
                                               to_float(from_float<T>(__fmul_rn(rotated, sn))))));
    if (query) {
      v = to_float(from_float<T>(__fmul_rn(v, scale)));
      q_out[((r * a.heads + head) * a.columns + c) * d + i] = from_float<T>(v);
    } else {
      if (k_out != nullptr)
        k_out[((r * a.kv_heads + head) * a.columns + c) * d + i] = from_float<T>(v);
      if (writes) cache_keys[head * into.head_stride + at + i] = from_float<T>(v);
    }
  }
}

}  // namespace

const char* rope_launch(const rope_args& a, void* stream) {
  if (auto why = rope_refusal(a)) return why;
  if (a.rows * a.columns > 0x7fffffff) return "more items than one launch's grid";
  auto s = static_cast<cudaStream_t>(stream);
  const auto items = static_cast<unsigned>(a.rows * a.columns);
  const auto scale = static_cast<float>(a.q_scale);
  switch (a.type) {
    case element_type::f32:
      rope_kernel<float><<<items, rope_threads, 0, s>>>(a, scale);
      break;
    case element_type::bf16:
      rope_kernel<__nv_bfloat16><<<items, rope_threads, 0, s>>>(a, scale);
      break;
    case element_type::f16:
      rope_kernel<__half><<<items, rope_threads, 0, s>>>(a, scale);
      break;
  }
  auto err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace computron::engine::cuda
