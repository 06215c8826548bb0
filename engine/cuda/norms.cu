#include "engine/cuda/norms.hpp"

#include <cuda_runtime.h>

#include "engine/cuda/elements.cuh"

namespace computron::engine::cuda {

namespace {

constexpr int norm_threads = 256;

/// Row blockIdx.x: summed = x + delta (+ bias), each add rounded to T as the unfused ops round;
/// then the mean square in f32 and out = weight x (x / rms, rounded to T), rounded to T.
template <typename T>
__global__ void __launch_bounds__(norm_threads)
    rms_norm_kernel(const T* x, const T* delta, const T* bias, T* summed, const T* weight, T* out,
                    int64_t width, float eps) {
  __shared__ float partial[norm_threads];
  const int64_t at = static_cast<int64_t>(blockIdx.x) * width;
  float sum = 0;
  for (int64_t i = threadIdx.x; i < width; i += norm_threads) {
    float v = to_float(x[at + i]);
    if (delta != nullptr) {
      v = to_float(from_float<T>(v + to_float(delta[at + i])));
      if (bias != nullptr) v = to_float(from_float<T>(v + to_float(bias[i])));
      summed[at + i] = from_float<T>(v);
    }
    sum += v * v;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int step = norm_threads / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
    __syncthreads();
  }
  const float inv = rsqrtf(partial[0] / static_cast<float>(width) + eps);
  // Each thread reads back the elements it wrote itself: no barrier needed for them.
  const T* row = delta != nullptr ? summed : x;
  for (int64_t i = threadIdx.x; i < width; i += norm_threads) {
    float normed = to_float(from_float<T>(to_float(row[at + i]) * inv));
    out[at + i] = from_float<T>(to_float(weight[i]) * normed);
  }
}

template <typename T>
cudaError_t launch(const rms_norm_args& a, cudaStream_t stream) {
  rms_norm_kernel<T><<<static_cast<unsigned>(a.rows), norm_threads, 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<const T*>(a.delta), static_cast<const T*>(a.bias),
      static_cast<T*>(a.sum), static_cast<const T*>(a.weight), static_cast<T*>(a.out), a.width,
      a.eps);
  return cudaGetLastError();
}

}  // namespace

const char* rms_norm_launch(const rms_norm_args& a, void* stream) {
  if (auto why = rms_norm_refusal(a)) return why;
  if (a.rows > 0x7fffffff) return "more rows than one launch's grid";
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaSuccess;
  switch (a.type) {
    case element_type::f32:
      err = launch<float>(a, s);
      break;
    case element_type::bf16:
      err = launch<__nv_bfloat16>(a, s);
      break;
    case element_type::f16:
      err = launch<__half>(a, s);
      break;
  }
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace computron::engine::cuda
