#include "gpu/arena.hpp"

#include <algorithm>
#include <iterator>

#include "gpu/device.hpp"

namespace computron::gpu {

arena_allocator::arena_allocator(uint64_t size, uint64_t alignment)
    : alignment_(alignment), free_bytes_(size) {
  if (size > 0) free_.emplace(0, size);
}

std::optional<uint64_t> arena_allocator::allocate(uint64_t bytes) {
  auto need = align_up(bytes == 0 ? 1 : bytes, alignment_);
  // Offsets and sizes are multiples of the alignment, so every block start is aligned.
  for (auto i = free_.begin(); i != free_.end(); ++i) {
    if (i->second < need) continue;
    auto offset = i->first;
    auto rest = i->second - need;
    free_.erase(i);
    if (rest > 0) free_.emplace(offset + need, rest);
    used_.emplace(offset, need);
    free_bytes_ -= need;
    return offset;
  }
  return std::nullopt;
}

void arena_allocator::release(uint64_t offset) {
  auto u = used_.find(offset);
  if (u == used_.end()) return;
  auto size = u->second;
  used_.erase(u);
  free_bytes_ += size;
  auto next = free_.lower_bound(offset);
  // Merge with the following free block.
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  // Merge with the preceding free block.
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_.emplace(offset, size);
}

uint64_t arena_allocator::largest_free_block() const {
  uint64_t best = 0;
  for (const auto& [offset, size] : free_) best = std::max(best, size);
  return best;
}

}  // namespace computron::gpu
