#include "models/weights.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"
#include "models/safetensors.hpp"

namespace computron::models {

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

/// Stores `v` as one element of `type` at `dst`.
void store(std::byte* dst, gpu::dtype type, float v) {
  switch (type) {
    case gpu::dtype::f32:
      std::memcpy(dst, &v, 4);
      break;
    case gpu::dtype::bf16: {
      auto b = to_bf16(v);
      std::memcpy(dst, &b, 2);
      break;
    }
    case gpu::dtype::f16: {
      auto b = to_f16(v);
      std::memcpy(dst, &b, 2);
      break;
    }
    default:
      break;  // shard_layout only produces float types for OPT
  }
}

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

float seeded_value(uint64_t seed, const std::string& name, uint64_t index, init_kind kind) {
  auto bits = mix(mix(seed ^ fnv1a(name)) + index * 0x9e3779b97f4a7c15ull);
  // Uniform in [-1, 1): 24 random bits, exact in float.
  float u = static_cast<float>(bits >> 40) / static_cast<float>(1u << 23) - 1.0f;
  switch (kind) {
    // Scales keep activations of a random model in a sane range through many layers.
    case init_kind::weight:
      return 0.05f * u;
    case init_kind::embedding:
      return 0.1f * u;
    case init_kind::norm_weight:
      return 1.0f + 0.1f * u;
    case init_kind::bias:
      return 0.02f * u;
  }
  return u;
}

uint64_t global_index(const param_spec& p, int tp, int tp_rank, uint64_t local) {
  switch (p.split) {
    case split_kind::replicated:
      return local;
    case split_kind::dim0: {
      uint64_t inner = 1;
      for (size_t i = 1; i < p.full_shape.size(); ++i)
        inner *= static_cast<uint64_t>(p.full_shape[i]);
      auto rows = static_cast<uint64_t>(p.full_shape[0] / tp);
      return (local / inner + static_cast<uint64_t>(tp_rank) * rows) * inner + local % inner;
    }
    case split_kind::dim1: {
      auto cols = static_cast<uint64_t>(p.full_shape[1]);
      auto local_cols = cols / static_cast<uint64_t>(tp);
      return (local / local_cols) * cols + local % local_cols +
             static_cast<uint64_t>(tp_rank) * local_cols;
    }
  }
  return local;
}

caf::error fill_seeded(const opt_spec& spec, const parallel_config& par, const shard_index& shard,
                       const gpu::tensor_table& table, std::byte* host, uint64_t seed) {
  for (auto& p : shard_params(spec, par, shard)) {
    auto e = table.find(p.name);
    if (e == nullptr)
      return make_error(ec::invalid_request, fmt::format("layout has no tensor '{}'", p.name));
    auto width = gpu::size_of(e->type);
    auto n = numel(p.shard_shape);
    auto* dst = host + e->offset_bytes;
    for (uint64_t i = 0; i < n; ++i)
      store(dst + i * width, e->type,
            seeded_value(seed, p.name, global_index(p, par.tp, shard.tp_rank, i), p.init));
  }
  return {};
}

caf::error fill_from_checkpoint(const opt_spec& spec, const parallel_config& par,
                                const shard_index& shard, const gpu::tensor_table& table,
                                std::byte* host, const safetensors_file& file) {
  for (auto& p : shard_params(spec, par, shard)) {
    auto e = table.find(p.name);
    auto src = file.find(p.name);
    if (e == nullptr)
      return make_error(ec::invalid_request, fmt::format("layout has no tensor '{}'", p.name));
    if (src == nullptr)
      return make_error(
          ec::invalid_request,
          fmt::format("checkpoint has no tensor '{}' (needed by {})", p.name, spec.name));
    if (src->type != e->type)
      return make_error(ec::invalid_request,
                        fmt::format("tensor '{}' is {} in the checkpoint, {} expected", p.name,
                                    gpu::to_string(src->type), gpu::to_string(e->type)));
    if (src->shape != p.full_shape)
      return make_error(
          ec::invalid_request,
          fmt::format("tensor '{}' has shape [{}] in the checkpoint, [{}] expected", p.name,
                      fmt::join(src->shape, ", "), fmt::join(p.full_shape, ", ")));
    auto width = gpu::size_of(e->type);
    auto* dst = host + e->offset_bytes;
    if (p.split == split_kind::dim1) {
      // Row-parallel: a strided slice, one run of columns per row.
      auto rows = static_cast<uint64_t>(p.full_shape[0]);
      auto cols = static_cast<uint64_t>(p.full_shape[1]);
      auto local_cols = static_cast<uint64_t>(p.shard_shape[1]);
      for (uint64_t r = 0; r < rows; ++r)
        std::memcpy(
            dst + r * local_cols * width,
            src->data + (r * cols + static_cast<uint64_t>(shard.tp_rank) * local_cols) * width,
            local_cols * width);
    } else {
      // Replicated or column-parallel: one contiguous block.
      auto first = global_index(p, par.tp, shard.tp_rank, 0);
      std::memcpy(dst, src->data + first * width, e->size_bytes);
    }
  }
  return {};
}

uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint16_t to_f16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff)  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);  // underflow to zero
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // may carry into the exponent
  return static_cast<uint16_t>(half);
}

float from_f16(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      // Subnormal: normalise.
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000 | mant << 13;
  } else {
    u = sign | (exp - 15 + 127) << 23 | mant << 13;
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace computron::models
