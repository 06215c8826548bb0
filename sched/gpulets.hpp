#pragma once

// The gpu-let planner (Gpu-let, USENIX ATC'22, adapted to fixed device placement): how to
// split each GPU into compute lanes with a share of its SMs, and which lane runs each
// model's steps, from the models' measured step costs, rates and SLOs. A model's weights
// and KV stay on its devices; a gpu-let is only a compute lane on one of them. Also the
// cost, latency and interference model the plan rests on, so that the simulator and the
// runtime predict with the same rules. Plain code: explicit inputs, no clock, no chance.
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sched/clock.hpp"
#include "sched/step_fit.hpp"

namespace computron::sched {

/// One model as the planner sees it.
struct gpulet_model {
  /// Key of every map in the plan; ties in every ordering are broken by it.
  std::string name;
  /// Its physical devices (its config's `devices`, tp*pp of them): the planner never moves
  /// a model, it only chooses a gpu-let on each of them.
  std::vector<int32_t> devices;
  /// Requests per second (measured or configured): what its gpu-let must keep up with.
  double rate = 0;
  /// Latency objective of one request, seconds, from arrival to its last token; 0: none
  /// (best effort: it only has to keep up).
  double slo_s = 0;
  /// Mean prompt tokens per request: a request's prefill computes this many tokens.
  double prompt_tokens = 1;
  /// Mean tokens a request generates: the prefill gives the first, each further one takes
  /// a decode step (1: a one-shot model, the prefill only).
  double output_tokens = 1;
  /// Rows in one step at most: caps how far batching can amortize a step's fixed cost.
  int32_t max_batch = 8;
  /// Step cost at each measured share (percent -> line at that share). Shares not measured
  /// are derived from the nearest measured one (above preferred) by scaling with
  /// measured_share/share (what an emulated device does); at least one entry, normally
  /// 100. Measuring more shares matters: a small model at half the SMs often runs nearly
  /// as fast as on the whole GPU, which is where gpu-lets gain.
  std::map<int32_t, step_fit::line> cost;
};

struct gpulet_options {
  /// Physical devices 0..device_count-1; each gets a partition in the plan.
  int32_t device_count = 0;
  /// Allowed gpu-let sizes, percent of a device's SMs (green contexts come in steps). The
  /// whole device (100) is always allowed.
  std::vector<int32_t> shares{20, 40, 50, 60, 80, 100};
  /// Gpu-lets per device at most (Gpu-let uses 2: more lanes interfere more).
  int32_t max_per_device = 2;
  /// A busy gpu-let on a device whose other gpu-let is busy too computes this much slower
  /// (1.0 none); scaled by the partner's busy fraction (utilization).
  double interference = 1.15;
  /// Highest planned utilization of a gpu-let (queueing headroom): the batches of a
  /// lane's worst-case cycle may take this fraction of the cycle at most.
  double max_utilization = 0.8;
};

struct gpulet_plan {
  /// Per device: the shares of its gpu-lets, in lane order (a lane index is stable only
  /// within one plan). An unused device is [100].
  std::vector<std::vector<int32_t>> partitions;
  /// Per model: its gpu-let index on each of its devices (its devices' order), what the
  /// runtime runs its steps on.
  std::map<std::string, std::vector<int32_t>> lane;
  /// Per model: its devices (as given), so that a plan names lanes without the models.
  std::map<std::string, std::vector<int32_t>> devices;
  /// Per model: the share its steps run at, the smallest of its gpu-lets' (its steps on
  /// all its devices wait for the slowest).
  std::map<std::string, int32_t> share;
  /// Per model, with interference (worst case of its gpu-lets); infinity where a gpu-let
  /// cannot keep up with its rates.
  std::map<std::string, double> predicted_latency_s;
  /// Per model: the fraction of its gpu-let's time its steps take (the highest of its
  /// gpu-lets), with interference.
  std::map<std::string, double> utilization;
  /// Models that share a gpu-let in time because they got none of their own (by name).
  std::vector<std::string> temporal;
  /// Models whose predicted latency misses their SLO, or (best effort) whose gpu-let
  /// cannot keep up (by name).
  std::vector<std::string> at_risk;
};

/// Gpu-lets per device at most (the workers' compute lanes per device).
inline constexpr int32_t max_gpulets_per_device = 8;

/// How the devices are split into gpu-lets (serve config `devices.gpulets`), as the
/// dispatch core (sched/dispatch.hpp) carries it out.
struct gpulet_config {
  /// Per device: the shares of its gpu-lets (a fixed partition; models go to the lane of
  /// each device with the fewest models). Empty, or a device beyond the list: the whole
  /// device is one lane (time sharing only, as before gpu-lets).
  std::vector<std::vector<int32_t>> partitions{};
  /// "auto": every device starts whole, and the planner (plan_gpulets) chooses partitions
  /// and lanes from the models' measured step costs, arrival rates and SLOs every
  /// `replan`; a model whose lane or share changes first drains its running batches.
  bool automatic = false;
  /// The planner's options (device_count is filled in by the dispatch core); its
  /// `interference` is also what an emulated device slows by.
  gpulet_options plan{};
  /// How often an automatic plan is made again (while requests arrive).
  double replan_s = 5;
  /// Whether any device is split (or may be).
  bool enabled() const { return automatic || !partitions.empty(); }
};

/// Checks a gpu-let config against `devices` devices: shares allowed and summing to at
/// most 100, at most plan.max_per_device lanes per device, a partition per device at most,
/// a positive re-plan interval. What is wrong (invalid_configuration, naming the field and
/// value); none when fine.
std::optional<refusal> check_gpulet_config(const gpulet_config& c, size_t devices);

/// Seconds a step takes on a gpu-let of `share` percent that takes `whole_s` on the
/// whole device, while partners on its device were busy for `partner_busy` of its time:
/// whole_s * 100/share * interference_slowdown. What an emulated device waits out and
/// the simulator charges (a GPU's green contexts do it by themselves).
double gpulet_seconds(const gpulet_options& opts, double whole_s, int32_t share,
                      double partner_busy);

/// How long to wait for a step on a gpu-let of `share` percent that the whole device
/// finishes within `whole`: gpulet_seconds with its partners busy all along, the longest
/// it may take. A whole device (share 100) waits `whole`. The one rule for the manager's
/// wait for a step and the worker's for its lane, with the plan's factor (step_request
/// carries it to the workers).
std::chrono::milliseconds gpulet_timeout(const gpulet_options& opts,
                                         std::chrono::milliseconds whole, int32_t share);

/// The allowed gpu-let sizes, ascending, without duplicates, with the whole device (100).
std::vector<int32_t> allowed_shares(const gpulet_options& opts);

/// Whether a predicted latency is good enough: within the SLO, or (best effort) finite.
bool meets_slo(const gpulet_model& m, double latency_s);

/// A step line `factor` times slower (interference).
inline step_fit::line slowed(step_fit::line l, double factor) {
  return {l.fixed_s * factor, l.per_token_s * factor};
}

/// The model's step line at `share` percent (see gpulet_model::cost).
step_fit::line step_at(const gpulet_model& m, int32_t share);

/// Seconds one batch of `rows` requests takes from its prefill (rows*prompt_tokens tokens
/// in one step) to its last token (output_tokens-1 decode steps of `rows` rows), at step
/// cost `step`: o*fixed + rows*per_token*(prompt+o-1). A device runs a batch of one
/// placement at a time (sched/batching.hpp's device_gate), so a round holds its lane.
double round_s(const gpulet_model& m, const step_fit::line& step, double rows);

/// Per-request service time at `share` and batch `rows`: round_s / rows.
double service_s(const gpulet_model& m, int32_t share, double rows);

/// Requests per second a lane of `share` serves at batch `rows`, busy all the time.
double capacity_rps(const gpulet_model& m, int32_t share, double rows);

/// One model on a lane: its step line there (at the share it runs at, times interference).
struct lane_member {
  const gpulet_model* model = nullptr;
  step_fit::line step{};
};

/// What the lane model predicts for the models sharing one gpu-let in time.
struct lane_prediction {
  /// A cycle exists that stays within max_utilization with no batch above max_batch.
  bool keeps_up = false;
  /// The (shortest such) cycle, seconds; infinity when it does not keep up.
  double cycle_s = 0;
  /// Fraction of the lane's time its members compute at their rates (rate * round / rows):
  /// what slows a partner. Where batches grow with the cycle this is max_utilization, as
  /// the shortest cycle batches just enough (the worst case for a partner).
  double busy = 0;
  /// Per member (input order): latency (infinity when it does not keep up), own busy
  /// fraction, and rows per batch at the cycle.
  std::vector<double> latency_s, busy_of, rows;
};

/// The lane model (Nexus's duty cycle, worst case): in a cycle of C seconds every member
/// runs one batch of clamp(rate*C, 1, max_batch) rows (what arrived during the last cycle;
/// at least one, the worst case); the batches must take at most max_utilization*C. The
/// shortest such cycle gives the lowest latencies: a request waits up to one cycle for its
/// model's batch, then that batch's round, so latency = C + round. Alone on a lane with
/// batches of one row this is (1 + 1/max_utilization) rounds.
lane_prediction predict_lane(const std::vector<lane_member>& members, double max_utilization);

/// The model alone on a lane of `share`, its steps `slowdown` times slower.
lane_prediction predict_alone(const gpulet_model& m, int32_t share, double slowdown,
                              double max_utilization);

/// The smallest allowed share at which the model alone keeps up with its rate within
/// max_utilization and (with an SLO) meets it; nullopt when even the whole device does not.
std::optional<int32_t> min_share(const gpulet_model& m, const gpulet_options& opts);

/// How much slower a lane computes while its partners on the device are busy for
/// `partner_busy` of the time (summed over them, at most 1 counts).
double interference_slowdown(const gpulet_options& opts, double partner_busy);

/// The plan: each model's minimum share; models by decreasing demand (minimum share, then
/// busy fraction on the whole device, then name) get a new gpu-let of that share on each of
/// their devices where all have room, else join gpu-lets of one share on all their devices
/// that still keep up and meet every member's SLO (fewest new shares, then its lowest
/// latency), else the least loaded gpu-let of each device (temporal sharing). Then, with
/// interference, a model that misses its SLO grows its gpu-lets to the next allowed share
/// while room remains; last, each device's leftover goes to its gpu-lets (whole device,
/// allowed shares only, evening out their load; a lone gpu-let takes the whole device, so a
/// model's gpu-lets may then differ, its steps running at the smallest). When
/// temporal_plan leaves fewer models at risk, that is the plan. Empty when
/// check_gpulet_inputs fails.
gpulet_plan plan_gpulets(const std::vector<gpulet_model>& models, const gpulet_options& opts);

/// `plan`'s lanes with these models' rates and costs: its predictions and at-risk list
/// anew (a model the plan lacks runs on lane 0 of its devices). How a re-plan judges the
/// plan in force against a new one. Empty when check_gpulet_inputs fails.
gpulet_plan evaluate_plan(const gpulet_plan& plan, const std::vector<gpulet_model>& models,
                          const gpulet_options& opts);

/// Lanes for the models within fixed `partitions` (one per device; a device beyond them is
/// whole): each model's lane index, the same on each of its devices, chosen so that the
/// fewest models miss their SLOs, then the lowest sum of latency over SLO. What a fixed
/// `devices.gpulets` partition re-plans with once the models' costs are measured.
gpulet_plan plan_lanes(const std::vector<std::vector<int32_t>>& partitions,
                       const std::vector<gpulet_model>& models, const gpulet_options& opts);

/// The whole device as one gpu-let, every model on it (temporal sharing only): the
/// comparison. Models sharing their lane with another are listed in `temporal`.
gpulet_plan temporal_plan(const std::vector<gpulet_model>& models, const gpulet_options& opts);

/// The models whose lane or share differ between two plans, or that are in one only (a
/// re-partition waits for their leases), by name.
std::vector<std::string> plan_changes(const gpulet_plan& from, const gpulet_plan& to);

/// Validates options and models (device indices in range, shares in (0,100], rates and
/// SLOs finite and >= 0, cost has an entry, ...): what is wrong (invalid_configuration,
/// naming the field and value); none when fine.
std::optional<refusal> check_gpulet_inputs(const std::vector<gpulet_model>& models,
                                           const gpulet_options& opts);

}  // namespace computron::sched
