#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

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
  /// Touch every page at start, so that the memory is resident before the first copy
  /// into it. A GPU's memory costs nothing to write first; a host mapping's first write
  /// of a page runs at the machine's page-fault rate (0.26-1.2 GB/s on the 2-core
  /// machines, below the emulated links), so without this a first load into fresh pages
  /// measures the kernel, not the link. Costs that much start-up and the capacity's
  /// host memory at once.
  bool prefault = false;
};

/// A device whose memory is host memory with a fixed capacity and whose link is a real
/// memcpy throttled to a configured rate. Its pages live in one anonymous mapping (the
/// "park", huge pages where the kernel gives them), and mremap moves them, page tables and
/// all, into address ranges reserved with PROT_NONE: the same paging as CUDA's virtual
/// memory calls, through Linux, without copying or faulting a byte. An unmapped page stays
/// where it is until another range takes it (or its range goes), so that a shard evicted
/// and loaded again with the same pages moves nothing. It runs the same code paths as a GPU
/// on machines without one. Copies run in submission order on the device's own copy thread
/// (its "copy engine"), so several devices copy in parallel like several GPUs.
class emulated_device final : public device {
 public:
  /// Validates the options (capacity > 0, 0 < link rate) and maps the memory.
  static caf::expected<std::shared_ptr<emulated_device>> make(const emulated_device_options& opts);

  ~emulated_device() override;

  caf::error synchronize() override;

  /// mremap calls that moved pages so far (tests: what a map or an unmap cost).
  uint64_t page_moves() const { return page_moves_.load(); }

 protected:
  caf::expected<host_buffer> do_allocate_host(uint64_t bytes) override;
  caf::expected<void*> do_reserve(uint64_t bytes) override;
  void do_unreserve(void* va, uint64_t bytes) noexcept override;
  caf::error do_map(void* va, const std::vector<uint32_t>& pages) override;
  void do_unmap(void* va, uint64_t bytes) noexcept override;
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
  /// Moves each page (page, to) from where it is to `to`, in runs; updates at_ and
  /// occupant_ for the moves that succeed. Caller holds mapped_mtx_.
  caf::error move_locked(const std::vector<std::pair<uint32_t, std::byte*>>& moves);
  /// Sends the pages resting in [from, to) home; a page whose move fails gets fresh memory
  /// there (a free page may lose its bytes). Caller holds mapped_mtx_.
  void send_home_locked(std::byte* from, std::byte* to) noexcept;
  std::byte* home(uint32_t p) const { return park_ + p * info_.page_bytes; }

  /// Page i's home is park_ + i x page_bytes (a PROT_NONE placeholder holds it while the
  /// page is elsewhere).
  std::byte* park_;
  uint64_t park_bytes_;
  /// Guards what follows and every move: ranges map on several threads (a load's, a
  /// step's KV), and a map may take pages that rest in another range.
  std::mutex mapped_mtx_;
  /// Each mapped range's pages, in order (do_unmap gets only the address).
  std::map<void*, std::vector<uint32_t>> mapped_;
  /// Where each page is now: its home, or a slot of a range (mapped there, or resting
  /// there since an unmap).
  std::vector<std::byte*> at_;
  /// The page in each range slot that holds one, ordered so that a range's are found at once.
  std::map<std::byte*, uint32_t> occupant_;
  std::atomic<uint64_t> page_moves_{0};
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
