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
#include "sched/ledger.hpp"

namespace computron::actors {

/// One device as the scheduler accounts it.
struct scheduler_device {
  shard_worker_actor worker;
  uint64_t capacity_bytes = 0;
  double link_gbps = 0;
  /// What the device is: a model's dtype is checked against the kinds it is placed on.
  gpu::device_kind kind = gpu::device_kind::emulated;
  /// The device's page: every shard and KV chunk takes whole pages.
  uint64_t page_bytes = gpu::device::default_page_bytes;
};

struct swap_scheduler_options {
  /// The victim policy ("lru", "cost"), transfers per link, prefetch and compute while
  /// loading, as sched/ (and the simulator) take them.
  sched::ledger_options ledger;
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
