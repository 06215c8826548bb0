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
};

/// Traffic counters; they let tests prove that eviction copies nothing back.
struct device_stats {
  uint64_t bytes_to_device = 0;
  uint64_t bytes_to_host = 0;
  uint64_t copies_to_device = 0;
  uint64_t copies_to_host = 0;
  /// Calls into the backend's own allocator for device memory (cudaMalloc, mmap) and
  /// back (cudaFree, munmap). Both devices reserve their memory once at open and
  /// sub-allocate shards from an arena, so loads and evictions leave these unchanged:
  /// tests prove with them that an eviction never calls cudaFree (which synchronizes the
  /// whole GPU).
  uint64_t native_allocations = 0;
  uint64_t native_frees = 0;
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

/// One block of device memory. Move-only; returns its bytes to the device when
/// destroyed and keeps the device alive until then.
class device_allocation {
 public:
  device_allocation() = default;
  device_allocation(device_allocation&& other) noexcept { *this = std::move(other); }
  device_allocation& operator=(device_allocation&& other) noexcept;
  device_allocation(const device_allocation&) = delete;
  device_allocation& operator=(const device_allocation&) = delete;
  ~device_allocation() { reset(); }

  /// Device address (for the emulated device: a host address inside its arena).
  void* data() const { return ptr_; }
  uint64_t size() const { return size_; }
  explicit operator bool() const { return ptr_ != nullptr; }
  /// Frees the memory now; copies nothing back.
  void reset();

 private:
  friend class device;
  std::shared_ptr<device> owner_;
  void* ptr_ = nullptr;
  uint64_t size_ = 0;
  uint64_t accounted_ = 0;
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

  /// Allocation granularity; accounting rounds every allocation up to it.
  static constexpr uint64_t granularity = 256;

  const device_info& info() const { return info_; }
  uint64_t capacity_bytes() const { return info_.capacity_bytes; }
  /// Bytes held by live allocations (rounded up to the allocation granularity).
  uint64_t used_bytes() const { return used_bytes_.load(); }
  uint64_t free_bytes() const { return info_.capacity_bytes - used_bytes(); }
  /// Bytes in the largest free block: what one allocation can still get. Fragmentation
  /// can make it smaller than free_bytes().
  virtual uint64_t largest_free_block() const { return free_bytes(); }
  device_stats stats() const;

  /// Host memory for transfers, pinned where possible.
  caf::expected<host_buffer> allocate_host(uint64_t bytes);

  /// Device memory. Refused with `out_of_device_memory` when it would exceed the
  /// capacity, before anything is allocated.
  caf::expected<device_allocation> allocate(uint64_t bytes);

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
  virtual caf::expected<void*> do_allocate(uint64_t bytes) = 0;
  virtual void do_release(void* ptr, uint64_t bytes) noexcept = 0;
  virtual caf::expected<copy_event_ptr> do_copy_to_device(void* dst, const void* src,
                                                          uint64_t bytes) = 0;
  virtual caf::error do_copy_to_host(void* dst, const void* src, uint64_t bytes) = 0;
  virtual caf::error do_fill(void* dst, uint8_t value, uint64_t bytes) = 0;

  /// Backends count their native allocator calls here (see device_stats).
  void count_native_allocation() { ++native_allocations_; }
  void count_native_free() { ++native_frees_; }

  device_info info_;

 private:
  friend class device_allocation;
  caf::error check_range(const device_allocation& a, uint64_t offset, uint64_t bytes,
                         const char* what) const;

  std::mutex alloc_mtx_;
  std::atomic<uint64_t> used_bytes_{0};
  std::atomic<uint64_t> bytes_to_device_{0};
  std::atomic<uint64_t> bytes_to_host_{0};
  std::atomic<uint64_t> copies_to_device_{0};
  std::atomic<uint64_t> copies_to_host_{0};
  std::atomic<uint64_t> native_allocations_{0};
  std::atomic<uint64_t> native_frees_{0};
};

using device_ptr = std::shared_ptr<device>;

/// Rounds `bytes` up to a multiple of `align` (a power of two).
constexpr uint64_t align_up(uint64_t bytes, uint64_t align) {
  return (bytes + align - 1) & ~(align - 1);
}

}  // namespace computron::gpu
