#include "models/weights.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"
#include "models/checkpoint.hpp"
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
      break;  // shard_layout only produces float types
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
    case split_kind::dim0:
    case split_kind::vocab: {
      // A vocabulary slice's padding rows map past the tensor's end (for_runs skips them).
      uint64_t inner = 1;
      for (size_t i = 1; i < p.full_shape.size(); ++i)
        inner *= static_cast<uint64_t>(p.full_shape[i]);
      auto rows = static_cast<uint64_t>(p.shard_shape[0]);
      auto slice = static_cast<uint64_t>(slice_of(p, tp_rank));
      return (local / inner + slice * rows) * inner + local % inner;
    }
    case split_kind::dim1: {
      auto cols = static_cast<uint64_t>(p.full_shape[1]);
      auto local_cols = cols / static_cast<uint64_t>(slice_count(p, tp));
      return (local / local_cols) * cols + local % local_cols +
             static_cast<uint64_t>(slice_of(p, tp_rank)) * local_cols;
    }
  }
  return local;
}

namespace {

std::atomic<int> fill_thread_setting{0};

/// One contiguous run of a parameter: `count` elements from local index `local` of the
/// shard, which are elements `global`.. of the unsharded tensor, or padding (zeros: the
/// vocabulary slice's rows past the vocabulary) when `pad`.
struct run {
  uint64_t local;
  uint64_t global;
  uint64_t count;
  bool pad = false;
};

/// A piece of work: elements [begin, end) (local indices) of parameter `param`.
struct fill_task {
  size_t param;
  uint64_t begin;
  uint64_t end;
};

/// Cuts every parameter into tasks of about `grain` elements (whole rows for
/// row-parallel slices), so large tensors spread over threads too.
std::vector<fill_task> make_tasks(const std::vector<param_spec>& params) {
  constexpr uint64_t grain = 1ull << 21;
  std::vector<fill_task> tasks;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    auto n = numel(p.shard_shape);
    uint64_t step = grain;
    if (p.split == split_kind::dim1) {
      auto row = static_cast<uint64_t>(p.shard_shape[1]);
      step = std::max<uint64_t>(1, grain / row) * row;
    }
    for (uint64_t b = 0; b < n; b += step) tasks.push_back({i, b, std::min(n, b + step)});
  }
  return tasks;
}

/// Calls `f(run)` for the contiguous runs of local elements [begin, end) of `p`.
template <class F>
void for_runs(const param_spec& p, int tp, int tp_rank, uint64_t begin, uint64_t end, F&& f) {
  if (p.split == split_kind::vocab) {
    // The slice's real rows, then its padding.
    uint64_t inner = numel(p.shard_shape) / static_cast<uint64_t>(p.shard_shape[0]);
    auto first_row = static_cast<int64_t>(slice_of(p, tp_rank)) * p.shard_shape[0];
    auto real_rows = std::clamp<int64_t>(p.full_shape[0] - first_row, 0, p.shard_shape[0]);
    auto real = static_cast<uint64_t>(real_rows) * inner;
    if (begin < std::min(end, real))
      f(run{begin, global_index(p, tp, tp_rank, begin), std::min(end, real) - begin});
    auto pad_begin = std::max(begin, real);
    if (pad_begin < end) f(run{pad_begin, 0, end - pad_begin, true});
    return;
  }
  if (p.split != split_kind::dim1) {
    // Replicated and column-parallel slices are one contiguous block of the full tensor.
    f(run{begin, global_index(p, tp, tp_rank, begin), end - begin});
    return;
  }
  auto local_cols = static_cast<uint64_t>(p.shard_shape[1]);
  for (uint64_t i = begin; i < end; i += local_cols)
    f(run{i, global_index(p, tp, tp_rank, i), std::min(local_cols, end - i)});
}

/// Runs `body(task index)` for every task on up to fill_threads() threads.
template <class F>
void parallel_tasks(size_t n, F&& body) {
  auto threads = static_cast<size_t>(fill_threads());
  threads = std::max<size_t>(1, std::min(threads, n));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) body(i);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

/// The affine map seeded_value applies to a uniform u in [-1, 1).
std::pair<float, float> seeded_scale(init_kind kind) {
  switch (kind) {
    case init_kind::weight:
      return {0.05f, 0.0f};
    case init_kind::embedding:
      return {0.1f, 0.0f};
    case init_kind::norm_weight:
      return {0.1f, 1.0f};
    case init_kind::bias:
      return {0.02f, 0.0f};
  }
  return {1.0f, 0.0f};
}

// The hot loops of start-up: plain loops over local blocks (no aliasing questions) that
// the compiler vectorizes, built for AVX-512 and AVX2 as well as the baseline and picked
// at load time (target_clones), so one binary runs everywhere and fast where it can.
// The clones name the x86-64 feature levels, not CPU models: "arch=skylake-avx512" and
// "arch=haswell" are chosen by model, so every AMD host (an EPYC with AVX-512 here) ran
// the SSE2 baseline, 0.45 G elements/s against 2.8 with x86-64-v4 (bench startup).
// No contraction into FMA (which x86-64-v3 and v4 have): a*u + b must round as
// seeded_value's does, or the clones' weights would differ from the reference's.
// Not under ThreadSanitizer: the clones' ifunc resolver is instrumented and runs during
// relocation, before TSan's runtime exists (the binary crashed before main).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define COMPUTRON_FILL_CLONES                                                  \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), \
                 optimize("O3", "fp-contract=off")))
#else
#define COMPUTRON_FILL_CLONES
#endif

/// Elements per block: 16 KiB of floats stays in L1/L2 between the passes.
constexpr uint64_t fill_block = 4096;

/// seeded_value's uniform draw scaled by a*u + b, for elements global.. of a tensor
/// whose name hashed to `base` (equal to seeded_value for every element).
COMPUTRON_FILL_CLONES
void seeded_f32(float* dst, uint64_t base, uint64_t global, uint64_t count, float a, float b) {
  constexpr float inv = 1.0f / static_cast<float>(1u << 23);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t z = base + (global + i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = static_cast<float>(static_cast<int32_t>(z >> 40)) * inv - 1.0f;
    dst[i] = a * u + b;
  }
}

/// f32 to bf16 bits, round to nearest even; NaN stays NaN (as to_bf16).
COMPUTRON_FILL_CLONES
void f32_to_bf16(uint16_t* dst, const float* src, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t u = __builtin_bit_cast(uint32_t, src[i]);
    bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    dst[i] = static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : r);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
/// f32 to f16 with the F16C instructions (round to nearest even, as to_f16).
__attribute__((target("avx,f16c"))) void f32_to_f16_hw(uint16_t* dst, const float* src,
                                                       uint64_t count) {
  uint64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < count; ++i) dst[i] = to_f16(src[i]);
}
// CPUID leaf 1, ECX bit 29: F16C (clang 14's __builtin_cpu_supports does not know "f16c";
// "avx" also checks that the OS saves the YMM registers).
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return __builtin_cpu_supports("avx") && (ecx & (1u << 29)) != 0;
}
const bool have_f16c = cpu_has_f16c();
#endif

void f32_to_f16(uint16_t* dst, const float* src, uint64_t count) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_f16c) return f32_to_f16_hw(dst, src, count);
#endif
  for (uint64_t i = 0; i < count; ++i) dst[i] = to_f16(src[i]);
}

/// `count` floats as `type` (f32, bf16, f16) into the byte buffer `dst`, through local
/// blocks.
void store_floats(std::byte* dst, gpu::dtype type, const float* src, uint64_t count) {
  if (type == gpu::dtype::f32) {
    std::memcpy(dst, src, count * 4);
    return;
  }
  alignas(64) uint16_t half[fill_block];
  for (uint64_t k = 0; k < count; k += fill_block) {
    auto n = std::min(fill_block, count - k);
    if (type == gpu::dtype::bf16)
      f32_to_bf16(half, src + k, n);
    else
      f32_to_f16(half, src + k, n);
    std::memcpy(dst + k * 2, half, n * 2);
  }
}

/// Seeded values of `type` for elements global.. of a tensor (see seeded_f32).
void seeded_run(std::byte* dst, gpu::dtype type, uint64_t base, uint64_t global, uint64_t count,
                float a, float b) {
  alignas(64) float tmp[fill_block];
  auto width = gpu::size_of(type);
  for (uint64_t k = 0; k < count; k += fill_block) {
    auto n = std::min(fill_block, count - k);
    seeded_f32(tmp, base, global + k, n, a, b);
    store_floats(dst + k * width, type, tmp, n);
  }
}

/// Converts `count` elements of type `from` at `src` into type `to` at `dst`.
void convert(std::byte* dst, gpu::dtype to, const std::byte* src, gpu::dtype from, uint64_t count) {
  if (to == from) {
    std::memcpy(dst, src, count * gpu::size_of(to));
    return;
  }
  if (from == gpu::dtype::f32) {
    alignas(64) float tmp[fill_block];
    for (uint64_t k = 0; k < count; k += fill_block) {
      auto n = std::min(fill_block, count - k);
      std::memcpy(tmp, src + k * 4, n * 4);
      store_floats(dst + k * gpu::size_of(to), to, tmp, n);
    }
    return;
  }
  auto load = [&](uint64_t i) -> float {
    if (from == gpu::dtype::f32) {
      float x;
      std::memcpy(&x, src + i * 4, 4);
      return x;
    }
    uint16_t h;
    std::memcpy(&h, src + i * 2, 2);
    return from == gpu::dtype::bf16 ? from_bf16(h) : from_f16(h);
  };
  for (uint64_t i = 0; i < count; ++i) store(dst + i * gpu::size_of(to), to, load(i));
}

}  // namespace

void set_fill_threads(int threads) {
  fill_thread_setting = std::max(0, threads);
}

int fill_threads() {
  auto t = fill_thread_setting.load();
  if (t > 0) return t;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

caf::error fill_seeded(const opt_spec& spec, const parallel_config& par, const shard_index& shard,
                       const gpu::tensor_table& table, std::byte* host, uint64_t seed) {
  auto params = shard_params(spec, par, shard);
  std::vector<const gpu::tensor_entry*> entries;
  std::vector<uint64_t> bases;
  for (auto& p : params) {
    auto e = table.find(p.name);
    if (e == nullptr)
      return make_error(ec::invalid_request, fmt::format("layout has no tensor '{}'", p.name));
    if (e->type != gpu::dtype::f32 && e->type != gpu::dtype::bf16 && e->type != gpu::dtype::f16)
      return make_error(ec::invalid_request, fmt::format("tensor '{}' is {}, not a float type",
                                                         p.name, gpu::to_string(e->type)));
    entries.push_back(e);
    bases.push_back(mix(seed ^ fnv1a(p.name)));  // seeded_value's per-name part, once
  }
  auto tasks = make_tasks(params);
  parallel_tasks(tasks.size(), [&](size_t k) {
    auto& t = tasks[k];
    auto& p = params[t.param];
    auto* e = entries[t.param];
    // Plain copies: a lambda may not capture structured bindings in C++17 (clang refuses).
    auto [scale_a, scale_b] = seeded_scale(p.init);
    auto a = scale_a;
    auto b = scale_b;
    auto* dst = host + e->offset_bytes;
    for_runs(p, par.tp, shard.tp_rank, t.begin, t.end, [&](const run& r) {
      if (r.pad) {
        std::memset(dst + r.local * gpu::size_of(e->type), 0, r.count * gpu::size_of(e->type));
        return;
      }
      seeded_run(dst + r.local * gpu::size_of(e->type), e->type, bases[t.param], r.global, r.count,
                 a, b);
    });
  });
  return {};
}

caf::error fill_from_checkpoint(const opt_spec& spec, const parallel_config& par,
                                const shard_index& shard, const gpu::tensor_table& table,
                                std::byte* host, const checkpoint& file) {
  auto params = shard_params(spec, par, shard);
  std::vector<const gpu::tensor_entry*> entries;
  std::vector<const safetensor*> sources;
  for (auto& p : params) {
    auto e = table.find(p.name);
    auto src = file.find(p.name);
    if (e == nullptr)
      return make_error(ec::invalid_request, fmt::format("layout has no tensor '{}'", p.name));
    if (src == nullptr) {
      // Name it as the file would: Hugging Face folders keep a prefix we strip.
      auto hf = p.name == "lm_head.weight"         ? p.name
                : spec.family == model_family::opt ? "model.decoder." + p.name
                                                   : "model." + p.name;
      return make_error(ec::invalid_request,
                        fmt::format("checkpoint has no tensor '{}' (needed by {}; '{}' in a "
                                    "Hugging Face folder; looked in {})",
                                    p.name, spec.name, hf, file.source()));
    }
    auto is_float = [](gpu::dtype t) {
      return t == gpu::dtype::f32 || t == gpu::dtype::bf16 || t == gpu::dtype::f16;
    };
    if (!is_float(src->type) || !is_float(e->type))
      return make_error(ec::invalid_request,
                        fmt::format("tensor '{}' is {} in the checkpoint, {} expected (only f32, "
                                    "bf16 and f16 convert)",
                                    p.name, gpu::to_string(src->type), gpu::to_string(e->type)));
    if (src->shape != p.full_shape)
      return make_error(
          ec::invalid_request,
          fmt::format("tensor '{}' has shape [{}] in the checkpoint, [{}] expected", p.name,
                      fmt::join(src->shape, ", "), fmt::join(p.full_shape, ", ")));
    entries.push_back(e);
    sources.push_back(src);
  }
  auto tasks = make_tasks(params);
  parallel_tasks(tasks.size(), [&](size_t k) {
    auto& t = tasks[k];
    auto* e = entries[t.param];
    auto* src = sources[t.param];
    auto dst_width = gpu::size_of(e->type);
    auto src_width = gpu::size_of(src->type);
    for_runs(params[t.param], par.tp, shard.tp_rank, t.begin, t.end, [&](const run& r) {
      if (r.pad) {
        std::memset(host + e->offset_bytes + r.local * dst_width, 0, r.count * dst_width);
        return;
      }
      convert(host + e->offset_bytes + r.local * dst_width, e->type,
              src->data + r.global * src_width, src->type, r.count);
    });
  });
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
