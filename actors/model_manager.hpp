#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/engine.hpp"
#include "actors/interfaces.hpp"
#include "actors/observer.hpp"
#include "sched/batching.hpp"

namespace computron::actors {

struct model_manager_options {
  /// Batch size and window, the dispatch policy ("fcfs", "resident-first", "edf"; see
  /// sched/policies.hpp), queue bound and default deadline, as sched/ (and the simulator)
  /// take them.
  sched::batching_options batching;
  /// KV in the ledger (issue 30): each model's batches ask the scheduler for KV blocks
  /// out of the devices' one budget with the weights, growing as their rows decode and
  /// preempting rows (recomputed later) when no room can be made. Off: KV is not counted
  /// (it must fit the reserve beside the ledger's budget).
  bool kv_in_ledger = true;
  /// Largest max_tokens a request may ask for.
  int64_t max_tokens_limit = 512;
  /// One forward step of one stage at most.
  std::chrono::milliseconds step_timeout{std::chrono::minutes(2)};
  /// Waiting for residency at most (the scheduler always answers; this is a backstop).
  std::chrono::milliseconds acquire_timeout{std::chrono::minutes(30)};
  /// Preparing a model's host copies at most.
  std::chrono::milliseconds prepare_timeout{std::chrono::hours(1)};
  /// The node of each device (index = global device index); empty: all in this process.
  /// A stage whose tensor-parallel ranks sit on several nodes gets a cross-node group.
  std::vector<std::string> device_nodes;
  /// The kind of each device (index = global device index), for checking a model's dtype
  /// against where it is placed; devices beyond the list count as emulated.
  std::vector<gpu::device_kind> device_kinds;
  std::shared_ptr<observer> obs = null_observer();
};

/// Spawns a manager over `workers` (index = global device index) and `scheduler`.
/// Errors: no workers, an unknown dispatch policy, a zero batch size or queue bound.
caf::expected<model_manager_actor> spawn_model_manager(caf::actor_system& sys,
                                                       std::vector<shard_worker_actor> workers,
                                                       swap_scheduler_actor scheduler,
                                                       engine_registry engines,
                                                       model_manager_options opts);

}  // namespace computron::actors
