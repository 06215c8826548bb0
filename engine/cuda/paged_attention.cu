#include "engine/cuda/paged_attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "engine/cuda/elements.cuh"

#include <algorithm>
#include <atomic>

namespace computron::engine::cuda {

namespace {

constexpr int threads = 128;

/// Floats of shared memory a thread block uses: queries and their weighted values (Q x d
/// each), a block's keys (a padded stride, so that threads reading different positions of
/// one column hit different banks) and values, the block's scores (Q x block tokens), and
/// per query its maximum, sum, rescale factor and limit.
size_t shared_floats(int64_t q, int64_t d, int64_t bt) {
  return static_cast<size_t>(2 * q * d + bt * (d + 1) + bt * d + q * bt + 4 * q);
}

/// Partial results per (row, kv head, split): per query its max and sum, then Q x d
/// weighted values.
__host__ __device__ int64_t partial_floats(int64_t q, int64_t d) {
  return q * (d + 2);
}

template <typename T>
__global__ void __launch_bounds__(threads)
    attend_kernel(const __grid_constant__ paged_attention_args a, int32_t splits,
                  float* workspace) {
  // Rows on x (up to 2^31 - 1 blocks), kv heads on y (at most 65,535, far above any model's).
  const int32_t row = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int32_t nq = paged_queries(a), d = a.head_dim, bt = a.block_tokens;
  const int32_t groups = paged_groups(a), kstride = d + 1;
  extern __shared__ float smem[];
  float* qs = smem;
  float* acc = qs + nq * d;
  float* ks = acc + nq * d;
  float* vs = ks + bt * kstride;
  float* sc = vs + bt * d;
  float* top = sc + nq * bt;
  float* sum = top + nq;
  float* keep = sum + nq;
  float* lim = keep + nq;  // positions < 2^24: exact in a float
  const float hidden = -INFINITY;

  const T* queries = static_cast<const T*>(a.queries);
  for (int32_t i = threadIdx.x; i < nq * d; i += blockDim.x) {
    const int32_t q = i / d, e = i % d;
    const int32_t head = kv_head * groups + q / a.columns, column = q % a.columns;
    qs[i] = to_float(queries[paged_query_offset(a, row, head, column) + e]);
    acc[i] = 0.0f;
  }
  for (int32_t q = threadIdx.x; q < nq; q += blockDim.x) {
    const int64_t l = a.limits[static_cast<int64_t>(row) * a.columns + q % a.columns];
    lim[q] = static_cast<float>(l < a.max_positions ? l : a.max_positions);
    top[q] = hidden;
    sum[q] = 0.0f;
  }
  __syncthreads();
  float reach = 0;
  for (int32_t q = 0; q < nq; ++q) reach = fmaxf(reach, lim[q]);
  int64_t from = 0, to = 0;
  paged_split_range(a, split, splits, static_cast<int64_t>(reach), from, to);
  if (to > static_cast<int64_t>(reach)) to = static_cast<int64_t>(reach);

  for (int64_t tile = from; tile < to; tile += bt) {
    const int64_t entry = paged_entry(a, row, tile / bt);
    const auto& c = paged_chunk(a, paged_entry_chunk(entry));
    const int32_t n = static_cast<int32_t>(to - tile < bt ? to - tile : bt);
    const T* keys = static_cast<const T*>(c.keys);
    const T* values = static_cast<const T*>(c.values);
    for (int32_t i = threadIdx.x; i < n * d; i += blockDim.x) {
      const int32_t p = i / d, e = i % d;
      const int64_t at = paged_kv_offset(a, entry, kv_head, p) + e;
      ks[p * kstride + e] = to_float(keys[at]);
      vs[p * d + e] = to_float(values[at]);
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < nq * bt; i += blockDim.x) {
      const int32_t q = i / bt, p = i % bt;
      float s = hidden;
      if (p < n && static_cast<float>(tile + p) < lim[q]) {
        s = 0.0f;
        const float* qv = qs + q * d;
        const float* kv = ks + p * kstride;
        for (int32_t e = 0; e < d; ++e) s += qv[e] * kv[e];
      }
      sc[i] = s;
    }
    __syncthreads();
    for (int32_t q = threadIdx.x; q < nq; q += blockDim.x) {
      float* w = sc + q * bt;
      float best = hidden;
      for (int32_t p = 0; p < bt; ++p) best = fmaxf(best, w[p]);
      if (best == hidden) {
        // Nothing of this block is visible to the query: its state stays as it is.
        for (int32_t p = 0; p < bt; ++p) w[p] = 0.0f;
        keep[q] = 1.0f;
        continue;
      }
      const float m = fmaxf(top[q], best);
      const float k = expf(top[q] - m);
      float added = 0.0f;
      for (int32_t p = 0; p < bt; ++p) {
        w[p] = w[p] == hidden ? 0.0f : expf(w[p] - m);
        added += w[p];
      }
      sum[q] = sum[q] * k + added;
      top[q] = m;
      keep[q] = k;
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < nq * d; i += blockDim.x) {
      const int32_t q = i / d, e = i % d;
      const float* w = sc + q * bt;
      float o = acc[i] * keep[q];
      for (int32_t p = 0; p < n; ++p) o += w[p] * vs[p * d + e];
      acc[i] = o;
    }
    __syncthreads();
  }

  if (splits == 1) {
    T* out = static_cast<T*>(a.out);
    for (int32_t i = threadIdx.x; i < nq * d; i += blockDim.x) {
      const int32_t q = i / d, e = i % d;
      const int32_t head = kv_head * groups + q / a.columns, column = q % a.columns;
      const float v = sum[q] > 0.0f ? acc[i] / sum[q] : 0.0f;
      out[paged_out_offset(a, row, head, column) + e] = from_float<T>(v);
    }
    return;
  }
  float* part = workspace + ((static_cast<int64_t>(row) * a.kv_heads + kv_head) * splits + split) *
                                partial_floats(nq, d);
  for (int32_t q = threadIdx.x; q < nq; q += blockDim.x) {
    part[q] = top[q];
    part[nq + q] = sum[q];
  }
  for (int32_t i = threadIdx.x; i < nq * d; i += blockDim.x) part[2 * nq + i] = acc[i];
}

template <typename T>
__global__ void __launch_bounds__(threads)
    merge_kernel(const __grid_constant__ paged_attention_args a, int32_t splits,
                 const float* workspace) {
  const int32_t row = blockIdx.x, kv_head = blockIdx.y;
  const int32_t nq = paged_queries(a), d = a.head_dim, groups = paged_groups(a);
  const int64_t stride = partial_floats(nq, d);
  const float* base =
      workspace + (static_cast<int64_t>(row) * a.kv_heads + kv_head) * splits * stride;
  T* out = static_cast<T*>(a.out);
  for (int32_t i = threadIdx.x; i < nq * d; i += blockDim.x) {
    const int32_t q = i / d, e = i % d;
    paged_partial total{-INFINITY, 0.0f};
    float o = 0.0f;
    for (int32_t s = 0; s < splits; ++s) {
      const float* part = base + s * stride;
      float into = 1.0f, other = 0.0f;
      paged_merge_factors(total, paged_partial{part[q], part[nq + q]}, into, other);
      o = o * into + part[2 * nq + i] * other;
    }
    const int32_t head = kv_head * groups + q / a.columns, column = q % a.columns;
    out[paged_out_offset(a, row, head, column) + e] =
        from_float<T>(total.sum > 0.0f ? o / total.sum : 0.0f);
  }
}

/// Beyond the default 48 KiB a kernel must ask for its dynamic shared memory. The
/// attribute is the kernel's, not the launch's: set once per device, to the most the
/// device allows, so that a lane launching with less never lowers it between another
/// lane's setting and its launch.
template <typename T>
cudaError_t allow_shared_memory() {
  static std::atomic<bool> done[64];
  int device = 0;
  if (auto err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (device < 0 || device >= 64) return cudaErrorInvalidDevice;
  if (done[device].load(std::memory_order_acquire)) return cudaSuccess;
  int most = 0;
  if (auto err = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      err != cudaSuccess)
    return err;
  if (auto err =
          cudaFuncSetAttribute(attend_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, most);
      err != cudaSuccess)
    return err;
  done[device].store(true, std::memory_order_release);
  return cudaSuccess;
}

template <typename T>
cudaError_t launch(const paged_attention_args& a, int32_t splits, float* workspace,
                   cudaStream_t stream) {
  const auto bytes = shared_floats(paged_queries(a), a.head_dim, a.block_tokens) * sizeof(float);
  if (bytes > 48 * 1024)
    if (auto err = allow_shared_memory<T>(); err != cudaSuccess) return err;
  // The kernel reads its row from x and its kv head from y (as the merge does).
  dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.kv_heads),
            static_cast<unsigned>(splits));
  attend_kernel<T><<<grid, threads, bytes, stream>>>(a, splits, workspace);
  if (auto err = cudaGetLastError(); err != cudaSuccess) return err;
  if (splits > 1) {
    dim3 merge(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.kv_heads));
    merge_kernel<T><<<merge, threads, 0, stream>>>(a, splits, workspace);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

/// A device attribute of the current device, read once per device (every layer of every
/// step asks). 0 where it cannot be read.
int current_attribute(cudaDeviceAttr what, std::atomic<int> (&cache)[64]) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  if (int v = cache[device].load(); v > 0) return v;
  int v = 0;
  if (cudaDeviceGetAttribute(&v, what, device) != cudaSuccess) return 0;
  cache[device].store(v);
  return v;
}

std::atomic<int> sm_counts[64];
std::atomic<int> shared_optin[64];

}  // namespace

bool paged_attention_fits(int64_t queries, int64_t head_dim, int64_t block_tokens) {
  if (queries * head_dim > paged_max_query_elements || head_dim > 256 || block_tokens > 64)
    return false;
  const auto bytes = shared_floats(queries, head_dim, block_tokens) * sizeof(float);
  const auto most = current_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, shared_optin);
  return bytes <= static_cast<size_t>(std::max(most, 48 * 1024));
}

const char* paged_attention_unfit(const paged_attention_args& a) {
  if (auto why = paged_attention_refusal(a)) return why;
  if (!paged_attention_fits(paged_queries(a), a.head_dim, a.block_tokens))
    return "more queries x head dim than a thread block holds, a head dim over 256, blocks "
           "over 64 tokens, or more shared memory than the device gives a block";
  return nullptr;
}

int32_t paged_attention_splits(const paged_attention_args& a) {
  // The whole device's multiprocessors, also on a gpu-let's lane (which has fewer): more
  // splits than its share fills cost one merge, not a wrong result.
  const int sms = std::max(1, current_attribute(cudaDevAttrMultiProcessorCount, sm_counts));
  const int64_t items = static_cast<int64_t>(a.rows) * a.kv_heads;
  const int64_t want = (2 * static_cast<int64_t>(sms) + items - 1) / items;
  const int64_t most = std::max<int64_t>(1, (a.max_positions + 255) / 256);
  return static_cast<int32_t>(std::clamp<int64_t>(std::min(want, most), 1, 32));
}

size_t paged_attention_workspace_bytes(const paged_attention_args& a, int32_t splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(a.rows) * static_cast<size_t>(a.kv_heads) *
         static_cast<size_t>(splits) *
         static_cast<size_t>(partial_floats(paged_queries(a), a.head_dim)) * sizeof(float);
}

const char* paged_attention_launch(const paged_attention_args& a, int32_t splits, void* workspace,
                                   void* stream) {
  if (auto why = paged_attention_unfit(a)) return why;
  if (splits < 1 || splits > 64) return "split-K count outside 1-64";
  if (splits > 1 && workspace == nullptr) return "split-K without a workspace";
  auto s = static_cast<cudaStream_t>(stream);
  auto* ws = static_cast<float*>(workspace);
  cudaError_t err = cudaSuccess;
  switch (a.type) {
    case element_type::f32:
      err = launch<float>(a, splits, ws, s);
      break;
    case element_type::bf16:
      err = launch<__nv_bfloat16>(a, splits, ws, s);
      break;
    case element_type::f16:
      err = launch<__half>(a, splits, ws, s);
      break;
  }
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace computron::engine::cuda
