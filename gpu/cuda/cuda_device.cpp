#include "gpu/cuda/cuda_device.hpp"

#include <cstdlib>
#include <thread>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::gpu::cuda {

namespace {

/// Every CUDA call goes through here: failures become `device_error` with the driver's
/// message and the call that failed, never an abort.
caf::error check(cudaError_t status, const char* what, int ordinal) {
  if (status == cudaSuccess) return {};
  cudaGetLastError();  // reset the last-error state so the next call does not see it
  return make_error(ec::device_error,
                    fmt::format("cuda:{}: {} failed: {} ({})", ordinal, what,
                                cudaGetErrorString(status), cudaGetErrorName(status)));
}

void free_pinned(void* ptr) {
  cudaFreeHost(ptr);
}
void free_pageable(void* ptr) {
  std::free(ptr);
}

/// One recorded event on the copy stream.
class cuda_event final : public copy_event {
 public:
  cuda_event(cudaEvent_t ev, int ordinal) : ev_(ev), ordinal_(ordinal) {}
  ~cuda_event() override { cudaEventDestroy(ev_); }

  bool ready() override { return cudaEventQuery(ev_) != cudaErrorNotReady; }

  caf::error wait(std::chrono::milliseconds timeout) override {
    // cudaEventSynchronize has no deadline; polling keeps every wait bounded.
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto status = cudaEventQuery(ev_);
      if (status == cudaSuccess) return {};
      if (status != cudaErrorNotReady) return check(status, "cudaEventQuery", ordinal_);
      if (std::chrono::steady_clock::now() >= deadline)
        return make_error(
            ec::deadline_exceeded,
            fmt::format("cuda:{}: copy not finished after {} ms", ordinal_, timeout.count()));
      std::this_thread::sleep_for(std::chrono::microseconds{20});
    }
  }

 private:
  cudaEvent_t ev_;
  int ordinal_;
};

class cuda_device final : public device {
 public:
  cuda_device(device_info info, cudaStream_t stream) : device(std::move(info)), stream_(stream) {}

  ~cuda_device() override {
    select();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  caf::error synchronize() override {
    if (auto err = select()) return err;
    return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", ordinal());
  }

 protected:
  caf::expected<host_buffer> do_allocate_host(uint64_t bytes) override {
    if (auto err = select()) return err;
    void* ptr = nullptr;
    auto status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    if (status == cudaSuccess) return host_buffer{ptr, bytes, true, free_pinned};
    cudaGetLastError();
    // Pinning can fail (locked-memory limits); pageable memory still works, slower and
    // synchronously, so say so rather than fail the registration.
    log::warn("cuda:{}: cudaHostAlloc of {} bytes failed ({}); falling back to pageable memory",
              ordinal(), bytes, cudaGetErrorString(status));
    ptr = std::aligned_alloc(4096, align_up(bytes, 4096));
    if (ptr == nullptr)
      return make_error(ec::out_of_host_memory,
                        fmt::format("cannot allocate {} host bytes for {}", bytes, info_.name));
    return host_buffer{ptr, bytes, false, free_pageable};
  }

  caf::expected<void*> do_allocate(uint64_t bytes) override {
    if (auto err = select()) return err;
    void* ptr = nullptr;
    auto status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return make_error(ec::out_of_device_memory,
                        fmt::format("cudaMalloc of {} bytes failed on {}", bytes, info_.name));
    }
    if (auto err = check(status, "cudaMalloc", ordinal())) return err;
    return ptr;
  }

  void do_release(void* ptr, uint64_t) noexcept override {
    select();
    cudaFree(ptr);
  }

  caf::expected<copy_event_ptr> do_copy_to_device(void* dst, const void* src,
                                                  uint64_t bytes) override {
    if (auto err = select()) return err;
    if (auto err = check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                         "cudaMemcpyAsync(host to device)", ordinal()))
      return err;
    cudaEvent_t ev;
    if (auto err = check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate",
                         ordinal()))
      return err;
    if (auto err = check(cudaEventRecord(ev, stream_), "cudaEventRecord", ordinal())) {
      cudaEventDestroy(ev);
      return err;
    }
    return copy_event_ptr{std::make_shared<cuda_event>(ev, ordinal())};
  }

  caf::error do_copy_to_host(void* dst, const void* src, uint64_t bytes) override {
    if (auto err = select()) return err;
    if (auto err = check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                         "cudaMemcpyAsync(device to host)", ordinal()))
      return err;
    return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", ordinal());
  }

  caf::error do_fill(void* dst, uint8_t value, uint64_t bytes) override {
    if (auto err = select()) return err;
    if (auto err = check(cudaMemsetAsync(dst, value, bytes, stream_), "cudaMemsetAsync", ordinal()))
      return err;
    return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", ordinal());
  }

 private:
  int ordinal() const { return info_.ordinal; }

  /// Callers arrive on any thread; the current device is per thread in CUDA.
  caf::error select() const { return check(cudaSetDevice(ordinal()), "cudaSetDevice", ordinal()); }

  cudaStream_t stream_;
};

}  // namespace

caf::expected<int> device_count() {
  int count = 0;
  auto status = cudaGetDeviceCount(&count);
  if (auto err = check(status, "cudaGetDeviceCount", -1)) return err;
  return count;
}

std::string version_string() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  int nccl = 0;
  ncclGetVersion(&nccl);
  return fmt::format("CUDA runtime {}.{}, NCCL {}.{}.{}", runtime / 1000, (runtime % 1000) / 10,
                     nccl / 10000, (nccl % 10000) / 100, nccl % 100);
}

caf::expected<device_ptr> open(int ordinal, uint64_t reserved_bytes) {
  if (auto err = check(cudaSetDevice(ordinal), "cudaSetDevice", ordinal)) return err;
  cudaDeviceProp prop{};
  if (auto err = check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties", ordinal))
    return err;
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  if (auto err = check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", ordinal))
    return err;
  if (free_bytes <= reserved_bytes)
    return make_error(ec::invalid_configuration,
                      fmt::format("cuda:{}: {} bytes free, not more than the {} reserved", ordinal,
                                  free_bytes, reserved_bytes));
  cudaStream_t stream;
  if (auto err = check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                       "cudaStreamCreate", ordinal))
    return err;
  device_info info;
  info.kind = device_kind::cuda;
  info.ordinal = ordinal;
  info.name = fmt::format("cuda:{} ({})", ordinal, prop.name);
  info.capacity_bytes = free_bytes - reserved_bytes;
  info.link_gbps = 0;
  return device_ptr{std::make_shared<cuda_device>(std::move(info), stream)};
}

}  // namespace computron::gpu::cuda
