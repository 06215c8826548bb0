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
  /// Sequences per batch at most.
  uint32_t max_batch_size = 8;
  /// How long the head of a queue waits for company before its batch goes anyway.
  std::chrono::milliseconds batch_window{5};
  /// Which model's batch goes next: "fcfs" (oldest head first, the original),
  /// "resident-first" (loaded models first; a head older than max_wait goes first anyway)
  /// or "edf" (earliest deadline first). See sched/policies.hpp.
  std::string dispatch = "fcfs";
  std::chrono::milliseconds max_wait{1000};
  /// Requests queued per model at most; more are refused as overloaded.
  uint32_t max_queue = 256;
  /// Largest max_tokens a request may ask for.
  int64_t max_tokens_limit = 512;
  /// Deadline of a request that names none.
  std::chrono::milliseconds default_deadline{std::chrono::seconds(60)};
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

/// The batching part of the options, as sched/ takes it (the simulator uses the same).
sched::batching_options batching_of(const model_manager_options& o);

/// Spawns a manager over `workers` (index = global device index) and `scheduler`.
/// Errors: no workers, an unknown dispatch policy, a zero batch size or queue bound.
caf::expected<model_manager_actor> spawn_model_manager(caf::actor_system& sys,
                                                       std::vector<shard_worker_actor> workers,
                                                       swap_scheduler_actor scheduler,
                                                       engine_registry engines,
                                                       model_manager_options opts);

}  // namespace computron::actors
