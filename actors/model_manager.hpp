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
#include "sched/gpulets.hpp"

namespace computron::actors {

struct model_manager_options {
  /// Batch size and window, the dispatch policy ("fcfs", "resident-first", "edf"; see
  /// sched/policies.hpp), queue bound and default deadline, as sched/ (and the simulator)
  /// take them.
  sched::batching_options batching;
  /// Gpu-lets: the devices' compute lanes, fixed or planned (sched/gpulets.hpp); none by
  /// default (each device one lane).
  sched::gpulet_config gpulets;
  /// Largest max_tokens a request may ask for; 0: no server-wide limit (each model's context
  /// bounds its prompt plus max_tokens).
  int64_t max_tokens_limit = 0;
  /// One forward step of one stage at most.
  std::chrono::milliseconds step_timeout{std::chrono::minutes(2)};
  /// Waiting for residency at most (the scheduler always answers; this is a backstop).
  std::chrono::milliseconds acquire_timeout{std::chrono::minutes(30)};
  std::shared_ptr<observer> obs = null_observer();
};

/// Spawns a manager over `workers` (index = global device index) and `scheduler`. It
/// serves the models a registry (actors/registry.hpp) hands it.
/// Errors: no workers, an unknown dispatch policy, a zero batch size or queue bound.
caf::expected<model_manager_actor> spawn_model_manager(caf::actor_system& sys,
                                                       std::vector<shard_worker_actor> workers,
                                                       swap_scheduler_actor scheduler,
                                                       engine_registry engines,
                                                       model_manager_options opts);

}  // namespace computron::actors
