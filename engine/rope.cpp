#include "engine/rope.hpp"

#include <cmath>
#include <vector>

#include "engine/host_elements.hpp"

namespace computron::engine {

const char* rope_refusal(const rope_args& a) {
  if (a.rows <= 0 || a.columns <= 0 || a.kv_heads <= 0 || (a.rotate && a.heads <= 0))
    return "no rows, columns or heads";
  if (!a.rotate && a.heads != 0) return "query heads in a KV write without rotation";
  // Odd head dims rotate nothing: only a rotation needs the halves.
  if (a.head_dim <= 0 || (a.rotate && a.head_dim % 2 != 0) || a.head_dim > 4096)
    return "the head dim must be positive, at most 4096, and even to rotate";
  if (!a.rotate && a.cache_slots == nullptr) return "a KV write without rotation and without slots";
  if (a.k == nullptr || (a.k_out == nullptr && a.cache_slots == nullptr)) return "a null pointer";
  if (a.rotate &&
      (a.q == nullptr || a.positions == nullptr || a.inv_freq == nullptr || a.q_out == nullptr))
    return "a null pointer";
  if (a.cache_slots != nullptr) {
    if (a.v == nullptr) return "a KV write without values";
    if (a.cache_chunks < 1 || a.cache_chunks > paged_max_chunks)
      return "a KV write into no chunk, or more than paged_max_chunks";
    if (a.cache_table == nullptr)
      for (int32_t c = 0; c < a.cache_chunks; ++c)
        if (a.cache[c].keys == nullptr || a.cache[c].values == nullptr ||
            a.cache[c].head_stride < a.head_dim)
          return "a KV chunk without memory";
  }
  return nullptr;
}

const char* rope_host_refusal(const rope_args& a) {
  if (a.type == element_type::f16) return "f16 on the host (CPUs run f32 and bf16)";
  return rope_refusal(a);
}

namespace {

/// One head's rotation: `in` (head_dim floats) to `out`, with the column's cos and sin
/// (already rounded to the type), then times `scale` where it is not 1.
void rotate(element_type t, const float* in, const float* cos, const float* sin, int32_t d,
            float* out, bool scaled, float scale) {
  const int32_t half = d / 2;
  for (int32_t i = 0; i < d; ++i) {
    float rotated = i < half ? -in[i + half] : in[i - half];
    float v = round_to(t, round_to(t, in[i] * cos[i]) + round_to(t, rotated * sin[i]));
    out[i] = scaled ? round_to(t, v * scale) : v;
  }
}

}  // namespace

void rope_host(const rope_args& a, int64_t begin, int64_t end) {
  const auto d = static_cast<int32_t>(a.head_dim);
  const int32_t half = d / 2;
  std::vector<float> cos(static_cast<size_t>(d)), sin(static_cast<size_t>(d)),
      in(static_cast<size_t>(d)), out(static_cast<size_t>(d));
  // The scale as libtorch applies a double to a tensor of the type: in f32.
  const auto scale = static_cast<float>(a.q_scale);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t r = item / a.columns, c = item % a.columns;
    if (a.rotate) {
      const auto pos = static_cast<float>(a.positions[item]);
      for (int32_t i = 0; i < half; ++i) {
        const float angle = pos * a.inv_freq[i];
        cos[i] = cos[i + half] = round_to(a.type, std::cos(angle));
        sin[i] = sin[i + half] = round_to(a.type, std::sin(angle));
      }
    }
    for (int64_t h = 0; h < a.heads; ++h) {
      load(a.type, a.q, r * a.q_row_stride + c * a.q_column_stride + h * d, d, in.data());
      rotate(a.type, in.data(), cos.data(), sin.data(), d, out.data(), true, scale);
      store(a.type, a.q_out, ((r * a.heads + h) * a.columns + c) * d, d, out.data());
    }
    // Where the KV write goes: nowhere (-1, or no write), else the slot's chunk; a chunk
    // the call was not given is never written.
    const int64_t slot = a.cache_slots != nullptr ? a.cache_slots[item] : -1;
    const auto chunk = static_cast<int32_t>(slot >> 32);
    const bool writes = slot >= 0 && chunk < a.cache_chunks;
    const rope_kv_chunk into = writes ? rope_cache_chunk(a, chunk) : rope_kv_chunk{};
    const int64_t at = (slot & 0xffffffffLL) * d;
    for (int64_t h = 0; h < a.kv_heads; ++h) {
      load(a.type, a.k, r * a.k_row_stride + c * a.k_column_stride + h * d, d, in.data());
      // Without rotation the key as it is (a load and a store of the type: exact).
      const float* key = in.data();
      if (a.rotate) {
        rotate(a.type, in.data(), cos.data(), sin.data(), d, out.data(), false, 1.0f);
        key = out.data();
      }
      if (a.k_out != nullptr)
        store(a.type, a.k_out, ((r * a.kv_heads + h) * a.columns + c) * d, d, key);
      if (!writes) continue;
      store(a.type, into.keys, h * into.head_stride + at, d, key);
      // The value as it is.
      load(a.type, a.v, r * a.v_row_stride + c * a.v_column_stride + h * d, d, in.data());
      store(a.type, into.values, h * into.head_stride + at, d, in.data());
    }
  }
}

}  // namespace computron::engine
