#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

/// Where a model goes that names no devices of its own: the scheduler's choice, a plain
/// function of what is placed where, so that the runtime and the simulator agree.
namespace computron::sched {

/// `shards` distinct devices for a model's shards: those with the most room left after
/// the shards already placed there (usable_bytes[d] - placed_bytes[d], counted by the
/// shards' bytes whether resident or not), ties to the lower index. Returned in
/// ascending order, so that a stage's tensor-parallel ranks sit on neighbouring devices.
/// Devices whose usable_bytes is 0 (gone, or unknown) are never chosen. Empty when fewer
/// than `shards` devices qualify (or shards is 0).
std::vector<int32_t> spread_placement(size_t shards, const std::vector<uint64_t>& usable_bytes,
                                      const std::vector<uint64_t>& placed_bytes);

}  // namespace computron::sched
