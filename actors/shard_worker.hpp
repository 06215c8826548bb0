#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/engine.hpp"
#include "actors/interfaces.hpp"
#include "gpu/collective.hpp"
#include "gpu/device.hpp"
#include "sched/gpulets.hpp"

namespace computron::actors {

struct shard_worker_options {
  /// Global device index this worker answers for (reports, trace).
  int32_t device_index = 0;
  /// Prefix of the in-process collective groups this worker joins: unique per node, so
  /// two nodes in one process (tests, examples) never share a group.
  std::string group_scope = "node";
  /// Groups whose ranks live on other nodes (null: this process cannot join them).
  std::shared_ptr<gpu::group_provider> groups;
  /// The address this node is reached at: rendezvous points it hosts listen there.
  std::string host = "127.0.0.1";
  /// The node's name in reports ("local" in-process, else host:port).
  std::string node = "local";
  /// Bytes per copy of a load.
  uint64_t chunk_bytes = 32ull << 20;
  /// Longest a load may take on this worker before it fails.
  std::chrono::milliseconds load_timeout{std::chrono::minutes(5)};
  /// Longest one forward step of one stage may take, and how long a tensor-parallel
  /// rank waits for its peers.
  std::chrono::milliseconds step_timeout{std::chrono::minutes(2)};
};

/// Compute lanes a worker runs at most (gpu-lets of its device; lane 0 is the whole
/// device without them).
inline constexpr int32_t max_compute_lanes = sched::max_gpulets_per_device;

/// Spawns the worker for `dev` (and its copy and compute lanes, two threads).
/// Errors: no device, no engines.
caf::expected<shard_worker_actor> spawn_shard_worker(caf::actor_system& sys, gpu::device_ptr dev,
                                                     engine_registry engines,
                                                     shard_worker_options opts);

/// Spawns a lane: a detached actor that runs blocking jobs in order on its own thread.
lane_actor spawn_lane(caf::actor_system& sys);
/// A lane's behaviour (for spawning one linked to its owner).
lane_actor::behavior_type lane_behavior(lane_actor::pointer self);

/// A step that reached the front of its compute lane at `start` (it came at `received`) so
/// late that the stages left (this one and those after it, each a share of the manager's
/// estimate) cannot end within the deadline it carries (step_request::deadline_ms):
/// deadline_exceeded, saying by how much. None without a deadline.
caf::error step_too_late(const step_request& req, std::chrono::steady_clock::time_point received,
                         std::chrono::steady_clock::time_point start, int32_t device);

}  // namespace computron::actors
