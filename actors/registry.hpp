#pragma once

// The registry: the one owner of the model lifecycle (registration, unregistration, a
// repository's folders, a node's loss and return). See registry_actor in interfaces.hpp.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/engine.hpp"
#include "actors/interfaces.hpp"

namespace computron::actors {

/// One folder of a model repository as read: its model, or why it cannot be read.
struct repository_folder {
  std::string name;
  model_config config;
  /// Set when the folder cannot be served (unreadable config, unknown keys, ...).
  caf::error error;
};

/// Reads the repository's folders: all of them (`only` empty), or the one named `only`
/// (none if it does not exist). Hidden folders are never models. Blocking file reads:
/// each scan runs on a detached reader of its own, never on the registry's thread.
using repository_scan = std::function<std::vector<repository_folder>(const std::string& only)>;

struct registry_options {
  /// No scan: model control over the registered models only (load of an unknown name
  /// is unknown_model).
  repository_scan scan;
  /// Preparing one shard's host copy (weights seeded or read from files) at most.
  std::chrono::milliseconds prepare_timeout{std::chrono::hours(1)};
  /// Asks of the manager and the scheduler: load, unload, unregister (a load may wait
  /// for evictions).
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  /// The node of each device (index = global device index); empty: all in this process.
  /// A stage whose tensor-parallel ranks sit on several nodes gets a cross-node group.
  std::vector<std::string> device_nodes;
  /// The kind of each device (index = global device index), for checking a model's dtype
  /// against where it is placed; devices beyond the list count as emulated.
  std::vector<gpu::device_kind> device_kinds;
  /// KV in the ledger: registration gives the scheduler each shard's KV block bytes,
  /// so the ledger counts KV with the weights. Off: KV is not counted.
  bool kv_in_ledger = true;
  /// The largest LoRA rank an adapter may have (vLLM's --max-lora-rank); a larger one is
  /// refused at registration, naming r and this limit.
  int32_t max_lora_rank = 64;
};

/// Spawns the registry over `workers` (index = global device index), the scheduler that
/// places models and the manager that serves them. Detached where it has a repository
/// (registering a folder's model may read files); the scans run on readers of their own.
/// Errors: no workers, a missing scheduler or manager, timeouts that are not positive.
caf::expected<registry_actor> spawn_registry(caf::actor_system& sys,
                                             std::vector<shard_worker_actor> workers,
                                             swap_scheduler_actor scheduler,
                                             model_manager_actor manager, engine_registry engines,
                                             registry_options opts);

}  // namespace computron::actors
