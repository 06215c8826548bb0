#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/engine.hpp"
#include "actors/interfaces.hpp"
#include "gpu/device.hpp"

namespace computron::actors {

struct shard_worker_options {
  /// Global device index this worker answers for (reports, trace).
  int32_t device_index = 0;
  /// Prefix of the in-process collective groups this worker joins: unique per node, so
  /// two nodes in one process (tests, examples) never share a group.
  std::string group_scope = "node";
  /// Bytes per copy of a load.
  uint64_t chunk_bytes = 32ull << 20;
  /// Longest a load may take on this worker before it fails.
  std::chrono::milliseconds load_timeout{std::chrono::minutes(5)};
  /// Longest one forward step of one stage may take, and how long a tensor-parallel
  /// rank waits for its peers.
  std::chrono::milliseconds step_timeout{std::chrono::minutes(2)};
};

/// Spawns the worker for `dev` (and its copy and compute lanes, two threads).
/// Errors: no device, no engines.
caf::expected<shard_worker_actor> spawn_shard_worker(caf::actor_system& sys, gpu::device_ptr dev,
                                                     engine_registry engines,
                                                     shard_worker_options opts);

/// Spawns a lane: a detached actor that runs blocking jobs in order on its own thread.
lane_actor spawn_lane(caf::actor_system& sys);

}  // namespace computron::actors
