#include "gpu/cuda/cuda_device.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/arena.hpp"
#include "gpu/cuda/green_context.hpp"

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

/// Events for copy chunks, created once and reused: creating one per chunk put driver
/// calls inside every timed load. Shared by the device and its outstanding events, so an
/// event outliving its device still has somewhere to go back to.
class event_pool {
 public:
  explicit event_pool(int ordinal) : ordinal_(ordinal) {}
  ~event_pool() {
    for (auto ev : free_) cudaEventDestroy(ev);
  }

  caf::expected<cudaEvent_t> take() {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (!free_.empty()) {
        auto ev = free_.back();
        free_.pop_back();
        return ev;
      }
    }
    cudaEvent_t ev;
    if (auto err = check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate",
                         ordinal_))
      return err;
    return ev;
  }

  void give_back(cudaEvent_t ev) {
    std::lock_guard<std::mutex> guard{mtx_};
    free_.push_back(ev);
  }

 private:
  int ordinal_;
  std::mutex mtx_;
  std::vector<cudaEvent_t> free_;
};

/// One recorded event on the copy stream.
class cuda_event final : public copy_event {
 public:
  cuda_event(cudaEvent_t ev, int ordinal, std::shared_ptr<event_pool> pool)
      : ev_(ev), ordinal_(ordinal), pool_(std::move(pool)) {}
  ~cuda_event() override { pool_->give_back(ev_); }

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
  std::shared_ptr<event_pool> pool_;
};

/// A block of device memory reserved at open and carved up by an arena: a shard's load
/// takes an offset from it and its eviction gives the offset back, with no cudaMalloc or
/// cudaFree (which synchronizes the whole device) on either path.
struct segment {
  std::byte* base = nullptr;
  uint64_t size = 0;
  arena_allocator arena;
  segment(std::byte* b, uint64_t n) : base(b), size(n), arena(n, device::granularity) {}
};

class cuda_device final : public device {
 public:
  cuda_device(device_info info, cudaStream_t stream, std::vector<segment> segments)
      : device(std::move(info)),
        stream_(stream),
        events_(std::make_shared<event_pool>(info_.ordinal)),
        segments_(std::move(segments)) {
    for (size_t i = 0; i < segments_.size(); ++i) count_native_allocation();
  }

  ~cuda_device() override {
    // The gpu-lets' streams end (their work first) before the memory they computed on.
    green_.reset();
    select();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    for (auto& s : segments_) cudaFree(s.base);
  }

  uint64_t largest_free_block() const override {
    std::lock_guard<std::mutex> guard{arena_mtx_};
    uint64_t best = 0;
    for (auto& s : segments_) best = std::max(best, s.arena.largest_free_block());
    return best;
  }

  caf::error synchronize() override {
    if (auto err = select()) return err;
    return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", ordinal());
  }

  caf::error check_gpulets() const override { return green_contexts_available(); }

  caf::expected<void*> gpulet_stream(const std::vector<int32_t>& partition, size_t lane) override {
    auto s = green_->stream(partition, lane);
    if (!s) return std::move(s.error());
    return s->stream;
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
    std::lock_guard<std::mutex> guard{arena_mtx_};
    for (auto& s : segments_)
      if (auto offset = s.arena.allocate(bytes)) return static_cast<void*>(s.base + *offset);
    uint64_t free_total = 0, largest = 0;
    for (auto& s : segments_) {
      free_total += s.arena.free_bytes();
      largest = std::max(largest, s.arena.largest_free_block());
    }
    return make_error(ec::out_of_device_memory,
                      fmt::format("{} bytes requested on {}: {} free but the largest free "
                                  "block is {} bytes (fragmented)",
                                  bytes, info_.name, free_total, largest));
  }

  void do_release(void* ptr, uint64_t) noexcept override {
    std::lock_guard<std::mutex> guard{arena_mtx_};
    auto p = static_cast<std::byte*>(ptr);
    for (auto& s : segments_)
      if (p >= s.base && p < s.base + s.size) {
        s.arena.release(static_cast<uint64_t>(p - s.base));
        return;
      }
  }

  caf::expected<copy_event_ptr> do_copy_to_device(void* dst, const void* src,
                                                  uint64_t bytes) override {
    if (auto err = select()) return err;
    if (auto err = check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                         "cudaMemcpyAsync(host to device)", ordinal()))
      return err;
    auto ev = events_->take();
    if (!ev) return std::move(ev.error());
    if (auto err = check(cudaEventRecord(*ev, stream_), "cudaEventRecord", ordinal())) {
      events_->give_back(*ev);
      return err;
    }
    return copy_event_ptr{std::make_shared<cuda_event>(*ev, ordinal(), events_)};
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
  std::shared_ptr<event_pool> events_;
  mutable std::mutex arena_mtx_;
  std::vector<segment> segments_;
  std::unique_ptr<green_partitions> green_ = std::make_unique<green_partitions>(info_.ordinal);
};

/// Reserves `bytes` of device memory: one allocation when the driver gives it, else the
/// largest pieces it gives (halving down to 64 MiB), so that a fragmented or shared GPU
/// still opens with what it has. Returns the segments (possibly fewer bytes).
caf::expected<std::vector<segment>> reserve(int ordinal, uint64_t bytes) {
  std::vector<segment> out;
  uint64_t want = align_up(bytes, 2ull << 20);
  uint64_t piece = want;
  constexpr uint64_t smallest = 64ull << 20;
  uint64_t got = 0;
  while (got + smallest <= want && piece >= smallest) {
    piece = std::min(piece, want - got) / (2ull << 20) * (2ull << 20);
    void* ptr = nullptr;
    auto status = cudaMalloc(&ptr, piece);
    if (status == cudaSuccess) {
      out.emplace_back(static_cast<std::byte*>(ptr), piece);
      got += piece;
      continue;
    }
    cudaGetLastError();
    if (status != cudaErrorMemoryAllocation) {
      for (auto& s : out) cudaFree(s.base);
      return check(status, "cudaMalloc", ordinal);
    }
    piece /= 2;
  }
  if (out.empty())
    return make_error(
        ec::out_of_device_memory,
        fmt::format("cuda:{}: cannot reserve any of {} bytes for weights", ordinal, bytes));
  if (got < want)
    log::warn("cuda:{}: reserved {} of {} bytes for weights in {} segments", ordinal, got, want,
              out.size());
  return out;
}

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

caf::expected<device_ptr> open(int ordinal, uint64_t reserved_bytes, uint64_t capacity_bytes) {
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
  // The weights' memory is taken now, once: loads and evictions then only move offsets.
  auto want = free_bytes - reserved_bytes;
  if (capacity_bytes > 0) want = std::min<uint64_t>(want, capacity_bytes);
  auto segments = reserve(ordinal, want);
  if (!segments) return std::move(segments.error());
  uint64_t capacity = 0;
  for (auto& s : *segments) capacity += s.size;
  cudaStream_t stream;
  if (auto err = check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                       "cudaStreamCreate", ordinal)) {
    for (auto& s : *segments) cudaFree(s.base);
    return err;
  }
  device_info info;
  info.kind = device_kind::cuda;
  info.ordinal = ordinal;
  info.name = fmt::format("cuda:{} ({})", ordinal, prop.name);
  info.capacity_bytes = capacity;
  info.link_gbps = 0;
  return device_ptr{std::make_shared<cuda_device>(std::move(info), stream, std::move(*segments))};
}

}  // namespace computron::gpu::cuda
