#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "gpu/device.hpp"

namespace computron::gpu {

/// Settings of one emulated device.
struct emulated_device_options {
  int ordinal = 0;
  /// "Device memory": a host mapping of this many bytes, touched only where used.
  uint64_t capacity_bytes = 4ull << 30;
  /// Host-to-device (and back) link rate in GB/s. Keep it well under the host's own
  /// memcpy rate (about 16 GB/s per thread on the 2-core machines) or the memcpy, not
  /// the throttle, sets the pace.
  double link_gbps = 2.0;
  /// Page size, a power of two of at least 4 KiB; 0: 2 MiB (a GPU's), or on a device
  /// under 64 MiB the size that gives it 32 pages (tests' small devices). The capacity
  /// is rounded down to whole pages.
  uint64_t page_bytes = 0;
};

/// A device whose memory is host memory with a fixed capacity and whose link is a real
/// memcpy throttled to a configured rate. Its pages live in one anonymous mapping (the
/// "park", huge pages where the kernel gives them) while free, and mremap moves them, page
/// tables and all, into address ranges reserved with PROT_NONE and back: the same paging
/// as CUDA's virtual memory calls, through Linux, without copying or faulting a byte. It runs the
/// same code paths as a GPU on machines without one. Copies run in submission order on the device's
/// own copy thread (its "copy engine"), so several devices copy in parallel like several GPUs.
class emulated_device final : public device {
 public:
  /// Validates the options (capacity > 0, 0 < link rate) and maps the memory.
  static caf::expected<std::shared_ptr<emulated_device>> make(const emulated_device_options& opts);

  ~emulated_device() override;

  caf::error synchronize() override;

 protected:
  caf::expected<host_buffer> do_allocate_host(uint64_t bytes) override;
  caf::expected<void*> do_reserve(uint64_t bytes) override;
  void do_unreserve(void* va, uint64_t bytes) noexcept override;
  caf::error do_map(void* va, const std::vector<uint32_t>& pages) override;
  void do_unmap(void* va, uint64_t bytes) noexcept override;
  void do_unmap_pages(void* va, const std::vector<uint32_t>& pages) noexcept;
  caf::expected<copy_event_ptr> do_copy_to_device(void* dst, const void* src,
                                                  uint64_t bytes) override;
  caf::error do_copy_to_host(void* dst, const void* src, uint64_t bytes) override;
  caf::error do_fill(void* dst, uint8_t value, uint64_t bytes) override;

 private:
  struct job;
  class event;

  emulated_device(device_info info, std::byte* park, uint64_t park_bytes);
  std::shared_ptr<event> submit(std::unique_ptr<job> j);
  void run_copy_engine();
  void execute(job& j);

  /// Where the free pages are: page i at park_ + i x page_bytes while free (a PROT_NONE
  /// placeholder holds its place while it is mapped into a range).
  std::byte* park_;
  uint64_t park_bytes_;
  /// Each mapped range's pages, in order (do_unmap gets only the address). Ranges map on
  /// several threads (a load's, a step's KV).
  std::mutex mapped_mtx_;
  std::map<void*, std::vector<uint32_t>> mapped_;
  double bytes_per_second_;

  std::mutex queue_mtx_;
  std::condition_variable queue_cv_;
  std::deque<std::unique_ptr<job>> queue_;
  bool stopping_ = false;
  /// When the emulated link is free again; throttling keeps copies from finishing
  /// before bytes / rate after the link became free.
  std::chrono::steady_clock::time_point link_free_at_{};
  std::thread engine_;
};

}  // namespace computron::gpu
