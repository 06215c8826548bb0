#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "sched/batching.hpp"
#include "sched/gpulets.hpp"
#include "sched/ledger.hpp"
#include "workload/arrivals.hpp"
#include "workload/report.hpp"

/// `computron sim`: a discrete-event simulator that runs the runtime's own decision code
/// (sched/: the residency ledger, room planning, queues, batching, the device gate)
/// against simulated devices and links. Nothing is allocated per model byte, so the
/// original's full-size experiments and month-long traces run in seconds to minutes.
/// Torch-free and actor-free.
namespace computron::sim {

struct sim_device {
  uint64_t capacity_bytes = 0;
  /// Host-to-device link, GB/s.
  double link_gbps = 0;
};

/// A model as the simulator needs it: where its shards go, their bytes, and what a
/// forward step costs.
struct sim_model {
  std::string name;
  int32_t tp = 1;
  int32_t pp = 1;
  /// Device of each shard, index pp_rank * tp + tp_rank.
  std::vector<int32_t> devices;
  std::vector<uint64_t> shard_bytes;
  bool pinned = false;
  int32_t priority = 0;
  /// Bytes of one KV block on each shard (models::kv_block_bytes), as the runtime counts
  /// them in the ledger; empty: its KV is not counted (the runtime with kv_in_ledger off).
  std::vector<uint64_t> kv_block_bytes{};
  /// One forward step of the whole model (all stages): a fixed part and a part per token
  /// in the batch (prompt tokens at the first step, one per row after).
  double step_s = 0;
  double step_per_token_s = 0;
  /// Layers per pipeline stage: with compute while loading, a batch that starts on a
  /// loading model runs layer i of a stage once the first (i+1)/layers of that stage's
  /// bytes arrived (the OPT forward's and the toy's per-layer waits).
  int32_t layers = 1;
  /// Latency objective of one request, seconds (0: none): what automatic gpu-lets size
  /// its share for.
  double slo_s = 0;
  /// A LoRA adapter's: its base (listed before it, on the same devices). Its requests wait
  /// in the base's queue and run in the base's batches, which lease it beside the base
  /// from their first step to their end, as the model manager's do; its step costs are
  /// the base's. Empty: a whole model.
  std::string base{};
};

/// What things cost. Defaults are this project's emulated devices; see
/// `profile_a100_pcie4` for the original's machine and `calibrate` in the app.
struct cost_model {
  /// Achieved share of the link during a load (bench swap: 0.999 on emulated links).
  double link_efficiency = 0.999;
  /// Per shard load: the request, the allocation and the first chunk's latency.
  double load_overhead_s = 0.0003;
  /// Per shard eviction (an arena free: microseconds).
  double evict_s = 0.00005;
  /// Per pipeline stage and step: messages between actors and workers.
  double stage_overhead_s = 0.0002;
  /// Per request: HTTP, parsing, the frontend and the reply.
  double request_overhead_s = 0.0008;
  /// Between a batch's dispatch and its lease when the model is resident (a round trip
  /// to the scheduler).
  double lease_overhead_s = 0.0001;
  /// Effective compute per device for OPT models, TFLOP/s: two flops per weight per
  /// token. 0.05 is the torch CPU forward on emulated devices; the A100 profile says 150.
  double tflops = 0.05;
};

/// The original's 4 x A100 PCIe 4 machine: about 25 GB/s practical per link, a load
/// overhead of tens of milliseconds (its Python stack), evictions as slow as loads were
/// (it freed with cudaFree; ours is an arena free: microseconds are used here).
cost_model profile_a100_pcie4();

struct sim_config {
  std::vector<sim_device> devices;
  /// Bytes per device kept for activations.
  uint64_t workspace_bytes = 0;
  /// Bytes per copy of a load (the workers' chunk_mb): a layer computed while its shard
  /// loads waits for the chunk that holds its last byte. 0: bytes arrive continuously.
  uint64_t chunk_bytes = 0;
  sched::ledger_options scheduler;
  sched::batching_options batching;
  /// Gpu-lets, as the runtime's manager takes them: a step on a lane of share s takes
  /// 100/s of the whole device's time, slowed while the device's other lanes are busy
  /// (sched::gpulet_seconds).
  sched::gpulet_config gpulets{};
  std::vector<sim_model> models;
  cost_model cost;
  /// Prompt and generated tokens of an arrival that names none (loadgen's defaults).
  int64_t prompt_len = 8;
  int64_t max_tokens = 1;
  /// One request per model, one after the other, before the arrivals start (bench exp2
  /// does this against the runtime), so the models resident at the start are the last
  /// ones that fit. Not part of the results.
  bool warm_up = false;
  /// Above 0: every request has this deadline and asks to be dropped rather than served
  /// late (loadgen --drop-late with --slo).
  int64_t drop_late_deadline_ms = 0;
};

struct sim_result {
  std::vector<workload::request_record> records;
  std::vector<workload::swap_event> swaps;
  std::vector<workload::device_traffic> devices;
  /// Events processed, and the simulated seconds from the first arrival to the last answer.
  uint64_t events = 0;
  double simulated_s = 0;
  /// Loads started by prefetch (scheduler.prefetch) and those a batch then used.
  uint64_t prefetches = 0;
  uint64_t prefetch_hits = 0;
  /// Rows preempted for KV room (recomputed later), and the most KV bytes any device held.
  uint64_t preemptions = 0;
  uint64_t peak_kv_bytes = 0;
  /// Gpu-lets at the end: per device the shares of its lanes, and the re-plans that took
  /// effect.
  std::vector<std::vector<int32_t>> gpulets{};
  uint64_t replans = 0;
};

/// Checks a config: devices, placements (devices exist, one per shard), options.
/// Errors name the field; the code is invalid_configuration.
caf::error check(const sim_config& cfg);

/// Runs the schedule (arrivals name models by index into schedule.models, which must all
/// be in cfg.models). Deterministic: the same config and schedule give the same result.
/// A config the checks or the sched cores refuse is an error with their code
/// (invalid_configuration, ...); a schedule naming a model the config lacks, unknown_model.
caf::expected<sim_result> run(const sim_config& cfg, const workload::schedule& s);

/// Seconds to load one shard of `bytes` over a `gbps` link.
double load_seconds(const cost_model& c, uint64_t bytes, double gbps);

}  // namespace computron::sim
