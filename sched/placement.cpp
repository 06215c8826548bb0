#include "sched/placement.hpp"

#include <algorithm>

namespace computron::sched {

std::vector<int32_t> spread_placement(size_t shards, const std::vector<uint64_t>& usable_bytes,
                                      const std::vector<uint64_t>& placed_bytes) {
  std::vector<int32_t> candidates;
  for (size_t d = 0; d < usable_bytes.size(); ++d)
    if (usable_bytes[d] > 0) candidates.push_back(static_cast<int32_t>(d));
  if (shards == 0 || candidates.size() < shards) return {};
  auto room = [&](int32_t d) {
    auto i = static_cast<size_t>(d);
    auto placed = i < placed_bytes.size() ? placed_bytes[i] : 0;
    // Signed: a device already promised more than it holds has the least room.
    return static_cast<double>(usable_bytes[i]) - static_cast<double>(placed);
  };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int32_t a, int32_t b) { return room(a) > room(b); });
  candidates.resize(shards);
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

}  // namespace computron::sched
