#include "gpu/cuda/cuda_device.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/cuda/driver_entry.hpp"
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

/// The driver's virtual memory calls (CUDA 10.2+), looked up once: device memory is pages
/// (cuMemCreate) created at open and mapped into address ranges (cuMemAddressReserve,
/// cuMemMap, cuMemSetAccess) by loads and out of them (cuMemUnmap) by evictions, so a
/// shard keeps its addresses across an eviction and a reload, and no load or eviction
/// calls cudaMalloc or cudaFree (which synchronizes the whole device).
struct vmm_calls {
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
  std::string missing;
};

const vmm_calls& vmm() {
  static const vmm_calls v = [] {
    vmm_calls c;
    const int version = driver_abi_version();
    if (version == 0) {
      c.missing = "no CUDA driver";
      return c;
    }
    auto first = [&](const char* name, auto& fn) {
      auto why = driver_entry(name, fn, version);
      if (!why.empty() && c.missing.empty()) c.missing = std::string{name} + ": " + why;
    };
    first("cuMemCreate", c.create);
    first("cuMemRelease", c.release);
    first("cuMemAddressReserve", c.reserve);
    first("cuMemAddressFree", c.address_free);
    first("cuMemMap", c.map);
    first("cuMemUnmap", c.unmap);
    first("cuMemSetAccess", c.set_access);
    first("cuMemGetAllocationGranularity", c.granularity);
    first("cuGetErrorString", c.error_string);
    return c;
  }();
  return v;
}

caf::error check(CUresult r, const char* what, int ordinal) {
  if (r == CUDA_SUCCESS) return {};
  const char* msg = nullptr;
  if (vmm().error_string) vmm().error_string(r, &msg);
  return make_error(r == CUDA_ERROR_OUT_OF_MEMORY ? ec::out_of_device_memory : ec::device_error,
                    fmt::format("cuda:{}: {} failed: {} ({})", ordinal, what,
                                msg ? msg : "unknown error", static_cast<int>(r)));
}

CUmemAllocationProp page_prop(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  return prop;
}

class cuda_device final : public device {
 public:
  cuda_device(device_info info, cudaStream_t stream,
              std::vector<CUmemGenericAllocationHandle> pages)
      : device(std::move(info)),
        stream_(stream),
        events_(std::make_shared<event_pool>(info_.ordinal)),
        pages_(std::move(pages)) {
    init_pages(pages_.size());
    for (size_t i = 0; i < pages_.size(); ++i) count_native_allocation();
  }

  ~cuda_device() override {
    // The gpu-lets' streams end (their work first) before the memory they computed on.
    // Every range is gone (each holds the device), so no page is mapped any more.
    green_.reset();
    select();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    for (auto h : pages_) vmm().release(h);
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

  caf::expected<void*> do_reserve(uint64_t bytes) override {
    if (auto err = select()) return err;
    CUdeviceptr va = 0;
    if (auto err = check(vmm().reserve(&va, bytes, info_.page_bytes, 0, 0), "cuMemAddressReserve",
                         ordinal()))
      return err;
    return reinterpret_cast<void*>(va);
  }

  void do_unreserve(void* va, uint64_t bytes) noexcept override {
    select();
    vmm().address_free(reinterpret_cast<CUdeviceptr>(va), bytes);
  }

  caf::error do_map(void* va, const std::vector<uint32_t>& pages) override {
    if (auto err = select()) return err;
    const auto page = info_.page_bytes;
    const auto base = reinterpret_cast<CUdeviceptr>(va);
    size_t mapped = 0;
    caf::error err;
    for (; mapped < pages.size(); ++mapped)
      if ((err = check(vmm().map(base + mapped * page, page, 0, pages_[pages[mapped]], 0),
                       "cuMemMap", ordinal())))
        break;
    if (!err) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = ordinal();
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      err = check(vmm().set_access(base, pages.size() * page, &access, 1), "cuMemSetAccess",
                  ordinal());
    }
    if (err) do_unmap(va, mapped * page);
    return err;
  }

  void do_unmap(void* va, uint64_t bytes) noexcept override {
    select();
    // cuMemUnmap does not wait for kernels that still read the range (PyTorch's expandable
    // segments synchronize first for the same reason). A step's host side has ended before
    // its shard is evicted, and it ends with a copy to the host on its stream, so its
    // kernels are done; one that failed midway may have left some queued on the legacy
    // default stream (compute without gpu-lets), which is cheap to wait for. Not waited
    // for: the copy stream (the range's own copies are done, weight_shard waits for their
    // events, and other shards' loads go on), NCCL's (non-blocking), and the gpu-lets'
    // (a lane freeing a KV chunk must not wait for its partners' steps: its own stream is
    // finished first, kv_block_pool::release).
    cudaStreamSynchronize(cudaStreamLegacy);
    cudaGetLastError();  // an error there is the step's to report, not the unmap's
    const auto page = info_.page_bytes;
    const auto base = reinterpret_cast<CUdeviceptr>(va);
    // Page by page: cuMemUnmap takes whole mappings, and each page is one.
    for (uint64_t off = 0; off < bytes; off += page) vmm().unmap(base + off, page);
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
  /// The physical pages, created at open: page i of the device's page list.
  std::vector<CUmemGenericAllocationHandle> pages_;
  std::unique_ptr<green_partitions> green_ = std::make_unique<green_partitions>(info_.ordinal);
};

/// Creates the device's pages: `bytes` of them, or as many as the driver gives (a shared
/// GPU still opens with what it has).
caf::expected<std::vector<CUmemGenericAllocationHandle>> create_pages(int ordinal, uint64_t bytes,
                                                                      uint64_t page) {
  std::vector<CUmemGenericAllocationHandle> out;
  const auto want = bytes / page;
  out.reserve(want);
  auto prop = page_prop(ordinal);
  auto t0 = std::chrono::steady_clock::now();
  while (out.size() < want) {
    CUmemGenericAllocationHandle h{};
    auto r = vmm().create(&h, page, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) break;
    if (auto err = check(r, "cuMemCreate", ordinal)) {
      for (auto p : out) vmm().release(p);
      return err;
    }
    out.push_back(h);
  }
  if (out.empty())
    return make_error(
        ec::out_of_device_memory,
        fmt::format("cuda:{}: cannot create any of {} bytes of pages for weights", ordinal, bytes));
  if (out.size() < want)
    log::warn("cuda:{}: created {} of {} pages of {} bytes", ordinal, out.size(), want, page);
  log::debug("cuda:{}: {} pages of {} bytes created in {:.3f} s", ordinal, out.size(), page,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
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
  if (!vmm().missing.empty())
    return make_error(ec::device_error, fmt::format("cuda:{}: device memory in pages needs the "
                                                    "driver's virtual memory calls: {}",
                                                    ordinal, vmm().missing));
  auto page_props = page_prop(ordinal);
  size_t granularity = 0;
  if (auto err =
          check(vmm().granularity(&granularity, &page_props, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                "cuMemGetAllocationGranularity", ordinal))
    return err;
  const uint64_t page = std::max<uint64_t>(device::default_page_bytes, granularity);
  // The device's memory is taken now, once: loads and evictions then only map pages.
  auto want = free_bytes - reserved_bytes;
  if (capacity_bytes > 0) want = std::min<uint64_t>(want, capacity_bytes);
  auto pages = create_pages(ordinal, want, page);
  if (!pages) return std::move(pages.error());
  const uint64_t capacity = pages->size() * page;
  cudaStream_t stream;
  if (auto err = check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                       "cudaStreamCreate", ordinal)) {
    for (auto h : *pages) vmm().release(h);
    return err;
  }
  device_info info;
  info.kind = device_kind::cuda;
  info.ordinal = ordinal;
  info.name = fmt::format("cuda:{} ({})", ordinal, prop.name);
  info.capacity_bytes = capacity;
  info.link_gbps = 0;
  info.page_bytes = page;
  return device_ptr{std::make_shared<cuda_device>(std::move(info), stream, std::move(*pages))};
}

}  // namespace computron::gpu::cuda
