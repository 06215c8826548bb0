#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace computron::gpu {

/// First-fit allocator of offsets within a fixed range, with coalescing on free. The
/// emulated device carves its "device memory" out of one mapping with it, so freeing a
/// shard is a map update (O(log n)) rather than an munmap proportional to its size.
/// Not thread-safe: the owner locks.
class arena_allocator {
 public:
  arena_allocator(uint64_t size, uint64_t alignment);

  /// An aligned offset of `bytes` free bytes, or nothing when no free block is big
  /// enough (capacity exhausted or fragmented).
  std::optional<uint64_t> allocate(uint64_t bytes);

  /// Returns the block at `offset` (as given by allocate) to the free list.
  void release(uint64_t offset);

  /// Size of the largest free block: what one allocation can still get.
  uint64_t largest_free_block() const;
  uint64_t free_bytes() const { return free_bytes_; }

 private:
  uint64_t alignment_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> free_;  // offset -> size
  std::map<uint64_t, uint64_t> used_;  // offset -> size
};

}  // namespace computron::gpu
