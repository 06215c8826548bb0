#pragma once

// The simulator's records of what is in flight (internal to sim/): events on its heap,
// requests, batches as they run step by step, and loads per pipeline stage.
#include <cstdint>
#include <functional>
#include <vector>

#include "sched/batching.hpp"
#include "sched/dispatch.hpp"
#include "sim/simulator.hpp"

namespace computron::sim::detail {

using sched::time_point;

enum class event_kind : uint8_t { tick, load_done, evict_done, step_done };

struct event {
  time_point at;
  uint64_t seq;
  event_kind kind;
  uint64_t a;
  bool operator>(const event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

struct request {
  time_point arrival{};
  /// The model whose queue and batches it runs in (an adapter's base).
  uint32_t model = 0;
  int64_t prompt_len = 0;
  int64_t max_tokens = 0;
  bool measured = true;
  /// Its LoRA adapter's model id (no_adapter: none).
  static constexpr uint32_t no_adapter = UINT32_MAX;
  uint32_t adapter = no_adapter;
};

/// A batch the dispatch core formed, under its number (which is also its waiter number
/// in the residency core). It runs step by step, as the manager's do: rows leave as they
/// finish and queued requests join at step boundaries (continuous batching).
struct batch {
  uint32_t model = 0;
  std::vector<sched::queued_entry> rows;
  /// Per row: when it left the queue, tokens still to produce, and whether it joined
  /// a running batch (then it waited for no lease).
  std::vector<time_point> taken;
  std::vector<int64_t> left;
  std::vector<bool> joined;
  time_point dispatched{};
  time_point leased{};
  int64_t steps = 0;
  bool swapped = false;
  double compute_s = 0;
  /// Rows being prefilled to join (the step in flight is theirs), and when they left the
  /// queue.
  std::vector<sched::queued_entry> joining;
  time_point joining_since{};
  /// The step in flight is a partial chunk of a chunked prefill (sched::join_plan): the
  /// running rows' step follows it; and the chunked prefill under way, since when.
  bool chunk_step = false;
  sched::batch_id chunking = 0;
  /// LoRA adapters: those it holds leases on, and while some are asked for, how many
  /// answers are still to come and what then continues (the lease's start, or a join's
  /// prefill).
  std::vector<uint32_t> adapters;
  std::vector<sched::queued_entry> asking;
  size_t adapters_asked = 0;
  std::function<void()> after_adapters;
  /// Keeps the rows for which `keep(i)` holds, with their entries in the per-row lists
  /// (`keep` may still read row i: the lists change after the last call).
  template <class F>
  void keep_rows(F keep) {
    batch kept;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!keep(i)) continue;
      kept.rows.push_back(rows[i]);
      kept.taken.push_back(taken[i]);
      kept.left.push_back(left[i]);
      kept.joined.push_back(joined[i]);
    }
    rows = std::move(kept.rows);
    taken = std::move(kept.taken);
    left = std::move(kept.left);
    joined = std::move(kept.joined);
  }

  /// The plan of its next decode step (the dispatch core's from the last boundary, with
  /// the joiners that went on after their prefill): what the step costs.
  sched::step_plan next{};
};

/// A load's bytes in flight, per pipeline stage: they flow from `from` and the stage's
/// slowest shard is complete at `to`.
struct stage_load {
  time_point from{};
  time_point to{};
  /// The stage's largest shard.
  uint64_t bytes = 0;
};

/// Starts model `m`'s load (or eviction) of every shard at `now`: each stage's bytes as
/// they will arrive (`stages`, a load), each device's traffic, and (where given) a swap
/// event per shard at `at_s`. Returns the slowest shard's seconds (sim_steps.cpp).
double transfer(const sim_config& cfg, uint32_t m, bool load, time_point now,
                std::vector<stage_load>& stages, std::vector<workload::device_traffic>& traffic,
                std::vector<workload::swap_event>* swaps, double at_s);

/// What a step's timing reads and writes of the simulator: its config, the dispatch core's
/// lanes and shares, and when each compute lane (device * lanes + lane) is free.
struct lanes_view {
  const sim_config& cfg;
  const sched::dispatcher& disp;
  size_t lanes;
  std::vector<time_point>& device_free;
};

/// When the first `num`/`den` of a shard of `bytes` is on the device, `span` being the
/// whole copy: at the end of the chunk that holds that byte (sim_steps.cpp).
time_point::duration ready_after(const sim_config& cfg, time_point::duration span, uint64_t bytes,
                                 int64_t num, int64_t den);

/// When one forward step of `tokens` tokens (prompt tokens at a prefill, one per row after)
/// of `model`, started at `start`, ends: it passes every stage in order, each device one
/// stage job at a time, whatever its model (the workers' compute lanes; the gate lets up to
/// pp batches of a placement in, one per stage); a stage still loading (`loads`) runs each
/// layer after its bytes. Adds the stages' compute to `compute_s`.
time_point step_end(const lanes_view& v, uint32_t model, const std::vector<stage_load>& loads,
                    time_point start, int64_t tokens, double& compute_s);

}  // namespace computron::sim::detail
