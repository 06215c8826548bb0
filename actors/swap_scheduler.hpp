#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/interfaces.hpp"
#include "actors/observer.hpp"
#include "gpu/device.hpp"

namespace computron::actors {

/// One device as the scheduler accounts it.
struct scheduler_device {
  shard_worker_actor worker;
  uint64_t capacity_bytes = 0;
  double link_gbps = 0;
  /// What the device is: a model's dtype is checked against the kinds it is placed on.
  gpu::device_kind kind = gpu::device_kind::emulated;
};

struct swap_scheduler_options {
  /// Victim choice: "lru" or "cost" (see actors/policies.hpp).
  std::string policy = "lru";
  /// Loads that may copy over one device's link at once; more queue.
  uint32_t max_transfers_per_link = 1;
  /// Load the model most in demand into idle links ahead of its requests
  /// (sched::ledger_options::prefetch).
  bool prefetch = false;
  /// Lease a loading model as soon as its copies are queued, so a batch computes while
  /// later layers arrive (sched::ledger_options::compute_while_loading).
  bool compute_while_loading = true;
  /// Longest a model's load (all shards joined) may take.
  std::chrono::milliseconds load_timeout{std::chrono::minutes(5)};
  /// Bytes per device kept free for activations (never given to weights).
  uint64_t workspace_bytes = 0;
  std::shared_ptr<observer> obs = null_observer();
};

/// Spawns the scheduler over `devices` (index = global device index). Errors: no
/// devices, an unknown policy, a zero transfer limit, a workspace larger than a device.
caf::expected<swap_scheduler_actor> spawn_swap_scheduler(caf::actor_system& sys,
                                                         std::vector<scheduler_device> devices,
                                                         swap_scheduler_options opts);

}  // namespace computron::actors
