#include "sched/kv_block_ids.hpp"

namespace computron::sched {

std::vector<uint32_t> kv_block_ids::take(size_t n) {
  std::vector<uint32_t> out;
  out.reserve(n);
  while (out.size() < n && !free_.empty()) {
    out.push_back(*free_.begin());
    free_.erase(free_.begin());
  }
  while (out.size() < n) out.push_back(next_++);
  return out;
}

void kv_block_ids::give_back(const std::vector<uint32_t>& ids) {
  for (auto id : ids)
    if (id < next_) free_.insert(id);
  // The free ids at the top are as good as never named: the bound comes down with them.
  while (next_ > 0 && !free_.empty() && *free_.rbegin() == next_ - 1) {
    free_.erase(std::prev(free_.end()));
    --next_;
  }
}

}  // namespace computron::sched
