#pragma once

#include <chrono>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/interfaces.hpp"

namespace computron::actors {

struct worker_guard_options {
  /// The global device index the controller gives the remote device.
  int32_t device_index = 0;
  /// The node's name in errors and reports (host:port).
  std::string node;
  /// Longest a relayed request may take (the callers' own timeouts are shorter; this
  /// only bounds the guard's bookkeeping).
  std::chrono::milliseconds relay_timeout{std::chrono::hours(2)};
  /// Preparing the shards again on a restarted node, at most.
  std::chrono::milliseconds replay_timeout{std::chrono::minutes(10)};
};

/// Spawns the controller-side stand-in for `worker` (a shard worker on another node).
/// It monitors the worker; when the node dies or freezes (the middleman's heartbeat),
/// every request in flight fails at once with `unavailable`, and so does every new one
/// until a rebind. Errors: no worker.
caf::expected<worker_guard_actor> spawn_worker_guard(caf::actor_system& sys,
                                                     shard_worker_actor worker,
                                                     worker_guard_options opts);

}  // namespace computron::actors
