#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

/// The device layer: one small interface that the emulated device (always built) and
/// the CUDA device (built when nvcc exists, used when a GPU does) implement. Nothing
/// above gpu/ knows which one it has.
namespace computron::gpu {

/// Which implementation backs a device.
enum class device_kind : uint8_t { emulated, cuda };

/// "emulated" or "cuda".
const char* to_string(device_kind kind);

/// Rounds `bytes` up to a multiple of `align` (a power of two).
constexpr uint64_t align_up(uint64_t bytes, uint64_t align) {
  return (bytes + align - 1) & ~(align - 1);
}

/// What a device is and what it offers; fixed for its lifetime.
struct device_info {
  device_kind kind = device_kind::emulated;
  /// Index among devices of its kind on this machine.
  int ordinal = 0;
  std::string name;
  /// Bytes that allocations may use (physical memory minus any reserve).
  uint64_t capacity_bytes = 0;
  /// Host-to-device link rate in GB/s (1e9 bytes): configured for emulated devices,
  /// 0 (unknown, to be measured) for CUDA devices.
  double link_gbps = 0;
  /// Device memory comes in pages of this many bytes (a power of two; CUDA's VMM
  /// granularity, 2 MiB): every allocation is a reserved address range with whole pages
  /// mapped into it, and capacity_bytes is a whole number of pages.
  uint64_t page_bytes = 2ull << 20;
};

/// Traffic counters; they let tests prove that eviction copies nothing back.
struct device_stats {
  uint64_t bytes_to_device = 0;
  uint64_t bytes_to_host = 0;
  uint64_t copies_to_device = 0;
  uint64_t copies_to_host = 0;
  /// Calls into the backend's own allocator for physical device memory (cuMemCreate, the
  /// emulated device's memfd) and back (cuMemRelease, close). Both devices create their
  /// pages once, at open, and loads and evictions only map and unmap them, so these stay
  /// unchanged: tests prove with them that an eviction never frees device memory (cudaFree
  /// synchronizes the whole GPU).
  uint64_t native_allocations = 0;
  uint64_t native_frees = 0;
  /// Pages mapped into and unmapped from address ranges, over the device's lifetime.
  uint64_t pages_mapped = 0;
  uint64_t pages_unmapped = 0;
};

/// Host memory for transfers: pinned (page-locked) where the device supports it, so a
/// copy can run asynchronously at full link speed. Move-only; frees itself.
class host_buffer {
 public:
  using deleter = void (*)(void*);
  host_buffer() = default;
  host_buffer(void* ptr, uint64_t size, bool pinned, deleter release)
      : ptr_(ptr, release), size_(size), pinned_(pinned) {}
  std::byte* data() const { return static_cast<std::byte*>(ptr_.get()); }
  uint64_t size() const { return size_; }
  /// False when pinning failed and the buffer fell back to pageable memory.
  bool pinned() const { return pinned_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  std::unique_ptr<void, deleter> ptr_{nullptr, nullptr};
  uint64_t size_ = 0;
  bool pinned_ = false;
};

class device;

/// One range of device addresses, reserved for its lifetime, with whole pages of the
/// device's memory mapped into it or not. Unmapping gives the pages back and keeps the
/// addresses: mapped again, the range is where it was, so anything that holds its
/// addresses (views over a shard's weights, a captured CUDA graph) stays valid. Move-only;
/// gives its pages and addresses back when destroyed and keeps the device alive until then.
/// Not thread-safe: its owner (a weight shard, a KV pool) locks.
class device_allocation {
 public:
  device_allocation() = default;
  device_allocation(device_allocation&& other) noexcept { *this = std::move(other); }
  device_allocation& operator=(device_allocation&& other) noexcept;
  device_allocation(const device_allocation&) = delete;
  device_allocation& operator=(const device_allocation&) = delete;
  ~device_allocation() { reset(); }

  /// Device address (for the emulated device: a host address), valid while mapped.
  void* data() const { return ptr_; }
  uint64_t size() const { return size_; }
  /// Bytes of pages the range holds: its size rounded up to whole pages while mapped, 0
  /// while not.
  uint64_t mapped_bytes() const;
  bool mapped() const { return !pages_.empty(); }
  /// True while the range is reserved (mapped or not).
  explicit operator bool() const { return ptr_ != nullptr; }

  /// Maps free pages into the whole range. Errors: out_of_device_memory when the device
  /// has fewer free pages than the range needs (nothing is mapped then), invalid_state
  /// when already mapped, the backend's mapping error.
  caf::error map();
  /// Gives the pages back to the device; copies nothing back and keeps the addresses.
  void unmap();
  /// Unmaps and gives the addresses back.
  void reset();

 private:
  friend class device;
  std::shared_ptr<device> owner_;
  void* ptr_ = nullptr;
  uint64_t size_ = 0;
  uint64_t reserved_ = 0;
  std::vector<uint32_t> pages_;
};

/// Completion of one asynchronous copy.
class copy_event {
 public:
  virtual ~copy_event() = default;
  /// Non-blocking: true once the copy finished (successfully or not).
  virtual bool ready() = 0;
  /// Blocks until the copy finished or `timeout` passed; the copy's error, or
  /// `deadline_exceeded` on timeout.
  virtual caf::error wait(std::chrono::milliseconds timeout) = 0;
};

using copy_event_ptr = std::shared_ptr<copy_event>;

/// One accelerator (or its emulation). Thread-safe: a shard worker drives it from its
/// own thread while others read its counters. Copies to the device run in submission
/// order on one copy stream, so their events complete in order.
class device : public std::enable_shared_from_this<device> {
 public:
  virtual ~device() = default;

  /// The page size of a device whose info does not say (CUDA's VMM granularity).
  static constexpr uint64_t default_page_bytes = 2ull << 20;

  const device_info& info() const { return info_; }
  uint64_t capacity_bytes() const { return info_.capacity_bytes; }
  uint64_t page_bytes() const { return info_.page_bytes; }
  /// `bytes` rounded up to whole pages: what an allocation of `bytes` takes when mapped.
  uint64_t pages_of(uint64_t bytes) const { return align_up(bytes, info_.page_bytes); }
  /// Bytes of mapped pages.
  uint64_t used_bytes() const { return mapped_pages() * info_.page_bytes; }
  uint64_t free_bytes() const { return info_.capacity_bytes - used_bytes(); }
  /// What one allocation can still get: every free page, since pages need not be
  /// contiguous (there is no external fragmentation).
  uint64_t largest_free_block() const { return free_bytes(); }
  /// Pages mapped into some range now.
  uint64_t mapped_pages() const;
  device_stats stats() const;

  /// Host memory for transfers, pinned where possible.
  caf::expected<host_buffer> allocate_host(uint64_t bytes);

  /// Device memory: a reserved range with pages mapped into it. Refused with
  /// `out_of_device_memory` when the device has too few free pages, before anything is
  /// mapped.
  caf::expected<device_allocation> allocate(uint64_t bytes);

  /// A range of device addresses for `bytes`, with no pages mapped yet (map() backs it).
  /// Reserving takes no device memory: a shard reserves its addresses once, at
  /// registration, and its loads map pages into them.
  caf::expected<device_allocation> reserve(uint64_t bytes);

  /// Starts copying `bytes` from host `src` to `dst` at `dst_offset`. `src` must stay
  /// valid until the returned event is ready.
  caf::expected<copy_event_ptr> copy_to_device_async(const device_allocation& dst,
                                                     uint64_t dst_offset, const void* src,
                                                     uint64_t bytes);

  /// Copies device memory back to the host after every earlier copy; blocks.
  caf::error copy_to_host(void* dst, const device_allocation& src, uint64_t src_offset,
                          uint64_t bytes);

  /// Sets every byte of `dst` to `value` after every earlier copy; blocks.
  caf::error fill(const device_allocation& dst, uint8_t value);

  /// Waits until every submitted operation finished.
  virtual caf::error synchronize() = 0;

  /// Why this device cannot split its compute into gpu-lets, or none. The emulated device
  /// always can (a clock stands in, actors/gpulet_clock.hpp); a GPU needs green contexts.
  virtual caf::error check_gpulets() const { return {}; }

  /// The native stream (a cudaStream_t) that the forwards of lane `lane` of `partition`
  /// (the shares of the device's lanes, percent of its SMs, lane 0 first) run on; null:
  /// the device's own default stream (the whole device, or a device that has no streams).
  /// A partition's lanes hold disjoint SMs. Created on first use and kept while the device
  /// is open: the same partition and lane always give the same stream.
  virtual caf::expected<void*> gpulet_stream(const std::vector<int32_t>& partition, size_t lane) {
    (void)partition;
    (void)lane;
    return nullptr;
  }

 protected:
  explicit device(device_info info) : info_(std::move(info)) {}

  virtual caf::expected<host_buffer> do_allocate_host(uint64_t bytes) = 0;
  /// Reserves `bytes` (whole pages) of addresses, unbacked.
  virtual caf::expected<void*> do_reserve(uint64_t bytes) = 0;
  virtual void do_unreserve(void* va, uint64_t bytes) noexcept = 0;
  /// Maps physical pages `pages` (indices below the page count given to init_pages), in
  /// order, at `va` onwards; on error nothing stays mapped.
  virtual caf::error do_map(void* va, const std::vector<uint32_t>& pages) = 0;
  /// Unmaps `bytes` at `va` (whole pages mapped by do_map), keeping the reservation.
  virtual void do_unmap(void* va, uint64_t bytes) noexcept = 0;
  virtual caf::expected<copy_event_ptr> do_copy_to_device(void* dst, const void* src,
                                                          uint64_t bytes) = 0;
  virtual caf::error do_copy_to_host(void* dst, const void* src, uint64_t bytes) = 0;
  virtual caf::error do_fill(void* dst, uint8_t value, uint64_t bytes) = 0;

  /// Backends count their native allocator calls here (see device_stats).
  void count_native_allocation() { ++native_allocations_; }
  void count_native_free() { ++native_frees_; }
  /// The backend has `count` physical pages of info_.page_bytes, indices 0 .. count - 1.
  void init_pages(uint64_t count);

  device_info info_;

 private:
  friend class device_allocation;
  caf::error check_range(const device_allocation& a, uint64_t offset, uint64_t bytes,
                         const char* what) const;
  caf::expected<std::vector<uint32_t>> take_pages(uint64_t count);
  void give_pages(std::vector<uint32_t>& pages);

  mutable std::mutex pages_mtx_;
  /// Free physical pages, taken from the back (the lowest indices first).
  std::vector<uint32_t> free_pages_;
  uint64_t total_pages_ = 0;
  std::atomic<uint64_t> bytes_to_device_{0};
  std::atomic<uint64_t> bytes_to_host_{0};
  std::atomic<uint64_t> copies_to_device_{0};
  std::atomic<uint64_t> copies_to_host_{0};
  std::atomic<uint64_t> native_allocations_{0};
  std::atomic<uint64_t> native_frees_{0};
  std::atomic<uint64_t> pages_mapped_{0};
  std::atomic<uint64_t> pages_unmapped_{0};
};

using device_ptr = std::shared_ptr<device>;

}  // namespace computron::gpu
