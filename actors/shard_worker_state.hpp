#pragma once

// The shard worker's state and the pieces its files share (internal to actors/):
// shard_worker.cpp is the actor, shard_worker_step.cpp its step, worker_groups.cpp its
// tensor-parallel groups (joining one again when a node returns) and its compute lanes.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/gpulet_clock.hpp"
#include "actors/reply_waits.hpp"
#include "actors/shard_worker.hpp"
#include "engine/runner.hpp"

namespace computron::actors::worker_detail {

using namespace std::chrono_literals;

struct shard_entry {
  shard_spec spec;
  std::shared_ptr<gpu::weight_shard> weights;
  std::shared_ptr<gpu::collective> group;
  /// Runs the shard's steps (null for a LoRA adapter, which runs in its base's steps).
  std::shared_ptr<computron::engine::runner> runner;
  /// When the current load's copies were queued; written and read only by jobs on the
  /// copy lane, which run one after the other.
  std::shared_ptr<std::chrono::steady_clock::time_point> load_began =
      std::make_shared<std::chrono::steady_clock::time_point>();
  /// A begin_load started the copy the next load_atom finishes (and measures).
  bool begun = false;
  /// Evictions queued on the copy lane and not done: a load_atom that finds the shard
  /// resident then still queues behind them (an eviction may wait for a step).
  int evicting = 0;
  /// Held shared by each step while it computes on the shard, and exclusively by an
  /// eviction (or an unregister) while it unmaps the pages: a step whose lease ended early
  /// (a timeout, a cancel) may still be computing, and a GPU kernel would then read
  /// unmapped addresses (an emulated one faults).
  std::shared_ptr<std::shared_timed_mutex> in_use = std::make_shared<std::shared_timed_mutex>();
  /// The compute lane its steps run on (a gpu-let of the device; the manager moves a
  /// model only while none of its steps runs): its other compute jobs go there too, as
  /// a runner has one caller at a time.
  int32_t lane = 0;
};

struct shard_worker_state {
  static constexpr const char* name = "shard_worker";
  gpu::device_ptr dev;
  engine_registry engines;
  shard_worker_options opts;
  lane_actor copy_lane;
  /// Lane 0: the whole device, or its first gpu-let; more start as steps name them.
  std::vector<lane_actor> compute_lanes;
  /// How busy a lane's partners are; on emulated devices also how long a job on a
  /// gpu-let takes (`emulate_gpulets`; a GPU's green contexts take it by themselves).
  std::shared_ptr<gpulet_clock> gpulets;
  bool emulate_gpulets = false;
  std::map<std::string, shard_entry> shards;
  std::set<std::string> preparing;
  /// Steps' lane jobs awaited without CAF request timeouts (reply_waits): the worker gives
  /// up on a wedged step at its deadline all the same.
  reply_waits lane_waits;
  uint64_t loads = 0;
  uint64_t bytes_loaded = 0;
  double load_seconds = 0;
};

using worker_pointer = shard_worker_actor::stateful_pointer<shard_worker_state>;

/// Seconds since `t0`.
double seconds_since(std::chrono::steady_clock::time_point t0);
/// Whether two specs describe the same shard (same rank, same weights).
bool same_shard(const shard_spec& a, const shard_spec& b);
/// The collective group of the shard's stage, unique per placement within `scope`.
std::string group_name(const std::string& scope, const shard_spec& s);
/// The shard is here but its cross-node group is new: joins it again (worker_groups.cpp).
caf::result<shard_report> rejoin(worker_pointer self, const std::string& name, shard_spec s);
/// On a GPU, runs `work` on the first compute lane, the one that runs the forward steps
/// (the first forward's context and kernels, the backend's CUDA graphs), then `finish`,
/// whatever `work` returned: a failure is logged and costs the first request time, not the
/// shard. On an emulated device, `finish` at once.
void warm_on_compute_lane(worker_pointer self, const std::string& name,
                          std::function<caf::error()> work, std::function<void()> finish);
/// Runs one step of a batch on the shard (shard_worker_step.cpp).
caf::result<step_result> run_step(worker_pointer self, step_request& req);
/// The compute lane `lane` (started on first use), or why there is none.
caf::expected<lane_actor> compute_lane(worker_pointer self, int32_t lane);

}  // namespace computron::actors::worker_detail
