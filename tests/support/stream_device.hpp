#pragma once

// A device that calls itself a GPU and records which gpu-let streams it is asked for:
// the path a GPU's gpu-lets take through the stack (start-up checks, the steps' partitions
// and lanes) on a machine without one. Host memory, synchronous copies.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "gpu/device.hpp"

namespace computron::test {

class stream_device final : public gpu::device {
 public:
  /// `missing`: what check_gpulets answers (none: green contexts are there). Streams of
  /// shares below `smallest` are refused, as a GPU refuses fewer SMs than a partition.
  stream_device(uint64_t capacity, caf::error missing = {}, int32_t smallest = 5)
      : device(info_of(capacity)), missing_(std::move(missing)), smallest_(smallest) {
    init_pages(info_.capacity_bytes / info_.page_bytes);
  }

  caf::error synchronize() override { return {}; }
  caf::error check_gpulets() const override { return missing_; }
  caf::expected<void*> gpulet_stream(const std::vector<int32_t>& partition, size_t lane) override {
    if (missing_) return missing_;
    if (lane >= partition.size())
      return caf::make_error(caf::sec::invalid_argument, "no such lane");
    if (partition[lane] < smallest_)
      return caf::make_error(caf::sec::invalid_argument,
                             "a gpu-let of " + std::to_string(partition[lane]) + "% is too small");
    std::lock_guard<std::mutex> g{mtx_};
    asked_.emplace_back(partition, lane);
    // Never dereferenced: only the torch engine uses a stream, and tests run toys here.
    return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + lane));
  }
  /// Every (partition, lane) asked for, in order.
  std::vector<std::pair<std::vector<int32_t>, size_t>> asked() const {
    std::lock_guard<std::mutex> g{mtx_};
    return asked_;
  }

 protected:
  caf::expected<gpu::host_buffer> do_allocate_host(uint64_t bytes) override {
    return gpu::host_buffer{std::calloc(1, bytes), bytes, false, std::free};
  }
  // Host memory behind every range from the start: mapping pages is bookkeeping only.
  caf::expected<void*> do_reserve(uint64_t bytes) override {
    count_native_allocation();
    return std::calloc(1, bytes);
  }
  void do_unreserve(void* va, uint64_t) noexcept override {
    count_native_free();
    std::free(va);
  }
  caf::error do_map(void*, const std::vector<uint32_t>&) override { return {}; }
  void do_unmap(void*, uint64_t) noexcept override {}
  caf::expected<gpu::copy_event_ptr> do_copy_to_device(void* dst, const void* src,
                                                       uint64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return gpu::copy_event_ptr{std::make_shared<done>()};
  }
  caf::error do_copy_to_host(void* dst, const void* src, uint64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return {};
  }
  caf::error do_fill(void* dst, uint8_t value, uint64_t bytes) override {
    std::memset(dst, value, bytes);
    return {};
  }

 private:
  struct done final : gpu::copy_event {
    bool ready() override { return true; }
    caf::error wait(std::chrono::milliseconds) override { return {}; }
  };
  static gpu::device_info info_of(uint64_t capacity) {
    gpu::device_info i;
    i.kind = gpu::device_kind::cuda;
    i.name = "cuda:0 (stand-in)";
    i.page_bytes = 64 << 10;
    i.capacity_bytes = capacity / i.page_bytes * i.page_bytes;
    i.link_gbps = 8;
    return i;
  }

  caf::error missing_;
  int32_t smallest_;
  mutable std::mutex mtx_;
  std::vector<std::pair<std::vector<int32_t>, size_t>> asked_;
};

}  // namespace computron::test
