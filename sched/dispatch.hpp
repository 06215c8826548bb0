#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "sched/batching.hpp"
#include "sched/clock.hpp"
#include "sched/gpulets.hpp"
#include "sched/kv_block_ids.hpp"
#include "sched/step_plan.hpp"

/// The dispatch core: queues and batch formation (the batcher), leases asked for and
/// granted, the runnable list, the device gate, armed ticks and when a batch leased on a
/// loading model starts (overlap_start), as one event-in, effects-out machine. Its
/// drivers (the model manager against the swap scheduler and the workers, the simulator
/// against its residency core and a cost model) feed it admissions, leases, batch ends and
/// ticks and carry out what comes back. Every rule about when a batch forms, starts,
/// expires or ends lives here once.
namespace computron::sched {

/// Why a request ends before its batch runs.
enum class row_end : uint8_t {
  /// Its deadline passed in the queue.
  expired,
  /// It asked to be dropped rather than served late, and would be (drop_late): the
  /// batcher's estimate_s of its model says why.
  dropped,
  /// Its deadline passed after its batch formed, before the batch could start (waiting
  /// for a load, a lease or devices).
  expired_waiting,
  /// Cancelled after its batch formed, before the batch started.
  cancelled,
  /// It ran past its answer_limit (its deadline with drop_late, else late_grace after
  /// it): it ends at the step boundary after that, as its client stops waiting then,
  /// rather than taking steps whose tokens nobody reads.
  expired_running,
  /// Its KV blocks need more than its devices hold beside the model's weights and the
  /// pinned models': it can never run there (out_of_device_memory).
  no_kv_room,
};

struct row_failure {
  uint32_t model = 0;
  queued_entry row;
  row_end why = row_end::expired;
  /// Its batch (expired_waiting, cancelled); 0 for a request that failed in the queue.
  batch_id batch = 0;
};

/// A lease to give back.
struct lease_release {
  batch_id batch = 0;
  uint32_t model = 0;
};

struct formed_batch {
  batch_id id = 0;
  uint32_t model = 0;
  std::vector<queued_entry> rows;
};

/// Requests joining a running batch (continuous batching): the driver prefills them as
/// batch `id` and appends that to batch `into` (whose next step then runs them all).
/// A chunked prefill (`chunk` > 0; batching_options::prefill_chunk) comes as one plan per
/// step boundary, all of one `id` and `rows`: each computes every prompt's
/// prefill_window(n, chunk, left) (common/prefill_window.hpp; the step plan's chunk and
/// left). A partial chunk (`left` > 0) joins nothing: the
/// batch's next step runs its own rows after it. The last (`left` 0) joins.
struct join_plan {
  batch_id into = 0;
  batch_id id = 0;
  uint32_t model = 0;
  std::vector<queued_entry> rows;
  int32_t chunk = 0;
  int32_t left = 0;
  /// The join's step: each row's window of its prompt (the tokens the step computes).
  step_plan step{};

  bool partial() const { return chunk > 0 && left > 0; }
};

struct started_batch {
  batch_id id = 0;
  uint32_t model = 0;
  /// Its live rows (those that failed at the start are in the failures).
  std::vector<queued_entry> rows;
  /// When it starts computing: now, or its lease's time when that lies ahead.
  time_point start{};
  /// Its first step: the prefill of its rows' prompts.
  step_plan plan{};
};

/// A batch asks the residency core for KV blocks (sched::residency::kv_reserve): `want`
/// with lookahead, at least `need` for its rows' next step; `start`: its first step waits
/// for them (and may wait for room), else its next step does (and never waits for room:
/// it preempts).
struct kv_request {
  batch_id batch = 0;
  uint32_t model = 0;
  uint64_t want = 0;
  uint64_t need = 0;
  bool start = false;
};

/// KV blocks a model's batch gives back to the residency core.
struct kv_giveback {
  uint32_t model = 0;
  uint64_t blocks = 0;
  batch_id batch = 0;
};

/// Rows of a batch that go back to the front of the queue for want of KV room: of a
/// running batch, preempted (vLLM's recompute: the driver drops them from the batch and
/// keeps their requests, with what they generated as part of their prompt; prompt_tokens
/// and steps are already updated); of a batch about to start, rows that did not fit.
struct preemption {
  batch_id batch = 0;
  uint32_t model = 0;
  std::vector<queued_entry> rows;
};

/// What an event decided; the driver carries it out in the order of the fields.
struct dispatch_effects {
  /// An admission refused (admit only), and the deadline an admitted request got.
  std::optional<refusal> refused;
  time_point deadline{};
  /// Requests that fail before they run.
  std::vector<row_failure> failures;
  /// KV blocks to give back, before the leases. (The manager holds an ended batch's until
  /// its workers dropped its caches: a lease-free model may hold blocks for that long.)
  std::vector<kv_giveback> kv_returns{};
  /// Leases to give back: a batch ended, or all its rows failed before it ran (it is
  /// gone then too).
  std::vector<lease_release> releases;
  /// Batches to start computing now; each ends with batch_done.
  std::vector<started_batch> started;
  /// New batches: the driver asks for a lease on each (leased or lease_failed follows),
  /// or abandons one whose requests all left before it formed (cancelled in the queue).
  std::vector<formed_batch> formed;
  /// Rows that join a running batch now (step_boundary, kv_granted).
  std::vector<join_plan> joins;
  /// KV asks to send (models that keep KV in the ledger only).
  std::vector<kv_request> kv_asks{};
  /// Rows preempted for room (after step_boundary or kv_granted).
  std::vector<preemption> preempted{};
  /// Running batches whose next step may run now (after step_boundary or kv_granted; a
  /// batch with joins runs it after their prefill). A batch missing here waits for its
  /// KV ask; one with no row left ends (the driver calls batch_done).
  std::vector<batch_id> steps{};
  /// The next step of each batch in `steps`, in its order: a decode step of the rows that
  /// go on, and the rows that left at the boundary. A join's rows that its step leaves
  /// going decode in it too (the driver appends them: their prefill's tokens decide).
  std::vector<step_plan> plans{};
  /// Times to call tick at (each a little after the instant a pass is due, so that the
  /// pass finds the window closed whatever the timer's granularity).
  std::vector<time_point> ticks;
  /// A dispatch pass ran: queue depths may have changed.
  bool dispatched = false;
  /// The gpu-let partitions or a model's lanes changed (a re-plan took effect): the
  /// driver shows them anew (and a GPU's worker splits its device anew).
  bool gpulets_changed = false;
};

/// What a lease tells the core.
struct lease_info {
  /// When the lease holds from (the simulator adds the reply's latency).
  time_point leased_at{};
  /// Granted while the model still loads (compute while loading), and what the load
  /// still takes at nominal rates.
  bool loading = false;
  double load_left_s = 0;
  /// What a load of the model costs unhindered (the batcher's estimates).
  double load_estimate_s = 0;
  /// Every model resident at the grant, by index, when that changed since the last lease.
  std::optional<std::vector<uint32_t>> resident;
};

class dispatcher {
 public:
  /// Refusals as batcher::make's, and a gpu-let config check_gpulet_config refuses.
  /// `devices`: how many devices the gate guards; `gpulets`: how they are split into
  /// compute lanes (none: one lane each).
  static std::unique_ptr<dispatcher> make(batching_options opts, size_t devices, refusal* why,
                                          gpulet_config gpulets = {});

  /// Adds a model (its queue and its placement in the gate); returns its index.
  /// `kv`: the model keeps KV in the ledger's blocks (its batches ask for them).
  uint32_t add_model(const std::string& name, int32_t tp, int32_t pp,
                     const std::vector<int32_t>& devices, int32_t priority, bool kv = false);
  /// A model is gone (unregistered; its queue and index stay, empty): it no longer takes
  /// a lane in plans nor counts where models are spread. Adding its name again makes a
  /// new index.
  void remove_model(uint32_t model);
  /// The queues, for estimates, counts and residency beliefs.
  const batcher& queues() const { return *batcher_; }
  batcher& queues() { return *batcher_; }
  size_t runnable() const { return runnable_.size(); }

  /// A request arrives: admitted (a dispatch pass follows) or refused.
  dispatch_effects admit(uint32_t model, uint64_t key, time_point now, int64_t deadline_ms,
                         int64_t steps = 1, bool drop_late = false, int64_t prompt_tokens = 0,
                         bool whole_prefill = false);
  /// A formed batch got its lease: a run pass.
  dispatch_effects leased(batch_id id, const lease_info& l, time_point now);
  /// A formed batch got no lease: it ends (the driver fails its requests), a dispatch pass.
  dispatch_effects lease_failed(batch_id id, time_point now);
  /// A formed batch whose requests all left before it was asked a lease for.
  void abandon(batch_id id);
  /// A request of a formed, not yet started batch was cancelled: it fails at the start
  /// (ignored once the batch runs: the driver ends that row after its step).
  void cancel(batch_id id, uint64_t key);
  /// A started batch finished a step and `running` of its rows go on: with continuous
  /// batching, queued requests of its model join it, up to max_batch_size rows, unless a
  /// batch of another model waits for one of its devices (for a lease or the gate), which
  /// would otherwise wait for as long as requests keep coming: then the batch runs out
  /// and ends.
  /// `going`: the keys of the rows that go on (each cached one more token in the step).
  /// Their KV (and the joiners') must fit the batch's blocks: if not, a KV ask, and the
  /// next step waits for kv_granted.
  dispatch_effects step_boundary(batch_id id, const std::vector<uint64_t>& going, time_point now);
  /// The answer to a KV ask: `blocks` more for the batch; `ceiling`: the most the model
  /// could ever hold (rows needing more fail as no_kv_room). At the start, rows that do
  /// not fit go back to the queue; at a step, joiners that do not fit stay queued and the
  /// youngest running rows are preempted until the rest fit.
  dispatch_effects kv_granted(batch_id id, uint32_t model, uint64_t blocks, uint64_t ceiling,
                              time_point now);
  /// KV blocks a batch holds (0 for models without KV in the ledger).
  uint64_t kv_held(batch_id id) const;
  /// KV block ids a model's rows hold, with those waiting to be free (tests: none leak).
  size_t kv_ids_held(uint32_t model) const;
  /// A row's KV block table (empty: unknown batch or row).
  std::vector<uint32_t> kv_table(batch_id id, uint64_t key) const;
  /// A step of batch `id` found no room on a device that the ledger had counted as free
  /// (the two apart for a moment): its running rows and the rows of its chunked join go
  /// back to the front of the queue, to be recomputed as preempted rows are, instead of
  /// failing with the step. Returns their keys; the driver requeues those rows (the same
  /// rule, sched::recompute_budget) and then ends the batch (batch_done).
  std::vector<uint64_t> requeue_rows(batch_id id);
  /// A started batch ended: its devices and lease are free; with `ok`, its `steps` steps
  /// took `compute_s` (the estimates learn). A run pass and a dispatch pass.
  dispatch_effects batch_done(batch_id id, time_point now, bool ok, double compute_s,
                              int64_t steps);
  /// A tick armed by ticks came due: a run pass and a dispatch pass (and, with automatic
  /// gpu-lets, a re-plan when one is due).
  dispatch_effects tick(time_point now);

  /// Gpu-lets (dispatch_gpulets.cpp). The gate guards compute lanes, not whole devices: a
  /// model's batches run on its lane of each of its devices, so models on different lanes
  /// of one device compute at the same time. Without gpu-lets every device is one lane 0
  /// of share 100.
  /// The model's lane on each of its devices (its devices' order), and that lane's share.
  const std::vector<int32_t>& lanes_of(uint32_t model) const { return models_[model].lanes; }
  int32_t share_of(uint32_t model, size_t position) const;
  /// The partition of that device (its lanes' shares, lane 0 first; {100}: not split).
  const std::vector<int32_t>& partition_of(uint32_t model, size_t position) const;
  /// The share the model's steps run at: its slowest lane's (100 without gpu-lets).
  int32_t run_share(uint32_t model) const;
  /// Lanes per device in the gate's numbering: a lane's unit is device * this + lane.
  int32_t lanes_per_device() const { return max_lanes_; }
  /// Per device: the shares of its lanes now.
  const std::vector<std::vector<int32_t>>& partitions() const { return partitions_; }
  /// The gpu-let config in force.
  const gpulet_config& gpulets() const { return gpulets_; }
  /// What the driver knows of a model's compute for the automatic planner: its step cost
  /// at the shares it measured it at, and its latency objective (0: none).
  void set_profile(uint32_t model, std::map<int32_t, step_fit::line> cost, double slo_s);
  /// The plan a re-plan chose and not yet in force (its models' batches drain first).
  const std::optional<gpulet_plan>& pending_plan() const { return pending_plan_; }

 private:
  dispatcher(std::unique_ptr<batcher> b, size_t devices, gpulet_config g);

  struct model_slot {
    uint32_t gate_key = 0;
    int32_t tp = 1;
    int32_t pp = 1;
    std::vector<int32_t> devices;
    bool kv = false;
    /// Its lane on each device, and the gate's units they are (device * lanes + lane).
    std::vector<int32_t> lanes{};
    std::vector<int32_t> units{};
    /// For the automatic planner: step costs by share, latency objective, and what
    /// arrived since the last plan (requests, their prompt tokens and their steps).
    std::map<int32_t, step_fit::line> cost{};
    double slo_s = 0;
    double arrivals = 0, prompt_tokens = 0, steps = 0;
    /// Unregistered (remove_model).
    bool gone = false;
    /// The names of its KV blocks (every model's rows get tables, in the ledger or not).
    kv_block_ids block_ids{};
  };
  enum class kv_wait : uint8_t { none, start, step };
  struct batch_state {
    uint32_t model = 0;
    /// The gate units it took when it started (its model's lanes may change after).
    std::vector<int32_t> units{};
    std::vector<queued_entry> rows;
    std::vector<uint64_t> cancelled;
    lease_info lease;
    bool started = false;
    /// KV: blocks held, steps each running row has run (by key), the ask in flight and
    /// the joiners taken from the queue while it is.
    uint64_t kv_held = 0;
    std::unordered_map<uint64_t, int64_t> steps_run{};
    kv_wait waiting = kv_wait::none;
    std::vector<uint64_t> going{};
    std::vector<queued_entry> joiners{};
    /// Blocks of rows that left at this boundary (finished or preempted): the workers free
    /// them at the next step (its plan no longer names them), after a join's prefill, which
    /// cannot use them.
    uint64_t leaving = 0;
    /// The keys of those rows (the next step's plan lists them as finished).
    std::vector<uint64_t> left_rows{};
    /// Joiners whose prompts are computed in chunks (join_plan): their batch id, and the
    /// tokens of each prompt the chunks so far left. No other join starts meanwhile.
    struct chunked_join {
      batch_id id = 0;
      std::vector<queued_entry> rows;
      int64_t left = 0;
    };
    std::optional<chunked_join> chunking{};
    /// Each row's KV block table (by key; joiners' too, from their first chunk), and the
    /// ids of rows that left at this boundary: the workers hold those until the next step
    /// has run (a join's step at this boundary runs before it), so they are named again
    /// only from the next boundary, or the batch's end, on.
    std::unordered_map<uint64_t, std::vector<uint32_t>> tables{};
    std::vector<uint32_t> freed{};
  };
  /// Names the blocks each row of `p` gains (planned_row::blocks; p.blocks_after).
  void name_blocks(batch_state& b, step_plan& p);
  /// A row left the batch: its table's ids are freed at the next boundary.
  void free_row(batch_state& b, uint64_t key);
  /// Blocks row `e` needs for its next step after `steps_run` steps, and with lookahead.
  static uint64_t kv_need(const queued_entry& e, int64_t steps_run);
  static uint64_t kv_want(const queued_entry& e, int64_t steps_run);
  /// The blocks the batch's going rows (and `joiners`) need for their next step.
  uint64_t kv_need_of(const batch_state& b, const std::vector<queued_entry>& joiners) const;
  const queued_entry* row_of(const batch_state& b, uint64_t key) const;
  /// What a step of `b` (with `joiners` joining at this boundary) may let its pools take
  /// beyond its rows' need (step_plan::kv_spare): the blocks the batch holds that neither
  /// its rows nor the rows that left hold after the step; -1 for a model whose KV is not in
  /// the ledger.
  int64_t kv_spare(const batch_state& b, const std::vector<queued_entry>& joiners) const;
  /// Gives back what a batch holds beyond what it wants (or all of it when it ended).
  void kv_trim(batch_id id, batch_state& b, uint64_t keep, dispatch_effects& out);
  /// The joins of a step boundary: `joiners` prefilled whole or start a chunked prefill,
  /// or the chunked prefill under way goes on by one chunk. `spare`: their steps' kv_spare.
  void plan_joins(batch_id id, batch_state& b, std::vector<queued_entry> joiners, int64_t spare,
                  dispatch_effects& out);
  /// Continues a batch at a step boundary once its KV fits: joins and the next step.
  void kv_continue(batch_id id, batch_state& b, uint64_t ceiling, time_point now,
                   dispatch_effects& out);
  /// Unblocks every blocked model (room came back).
  void unblock();
  /// Whether a batch of another model than `model` waits for any of `model`'s lanes, or a
  /// re-plan waits for `model` to drain.
  bool others_wait(uint32_t model) const;

  /// Gpu-lets (dispatch_gpulets.cpp): the model's lanes and units from the partitions
  /// (a fixed partition: the lane of each device with the fewest models).
  void place_lanes(uint32_t model);
  void set_units(uint32_t model);
  /// Notes an arrival for the planner; arms the next re-plan.
  void note_arrival(uint32_t model, int64_t prompt_tokens, int64_t steps, time_point now,
                    dispatch_effects& out);
  /// Makes a plan from what arrived since the last; it takes effect once the models it
  /// moves have no batch running.
  void replan(time_point now, dispatch_effects& out);
  /// Puts the pending plan in force if its models have drained.
  void apply_plan(dispatch_effects& out);
  /// Batches of the model that started and did not end.
  size_t running_batches(uint32_t model) const;
  /// A plan waits for the model to drain before it moves it.
  bool moving(uint32_t model) const;
  /// Whether plans are made: automatic gpu-lets, or a fixed partition that splits a
  /// device (its models' lanes are chosen from measurements).
  bool replans() const;

  /// Starts leased batches whose devices are free for them, oldest first; a dispatch
  /// pass follows when one ended before it ran (its model may take the next).
  void run_pass(time_point now, dispatch_effects& out);
  /// Expires what passed its deadline and forms batches.
  void dispatch_pass(time_point now, dispatch_effects& out);
  /// A pass at `at`: skipped when one is armed between now and then, which runs first and
  /// arms again whatever is still due later. One armed time was not enough: arming an
  /// earlier tick forgot the later one, the next pass armed that again, and the copies
  /// multiplied under load.
  void arm(time_point at, time_point now, dispatch_effects& out);

  std::unique_ptr<batcher> batcher_;
  gpulet_config gpulets_;
  /// Lanes per device in the gate's numbering (units = devices * lanes).
  int32_t max_lanes_ = 1;
  std::vector<std::vector<int32_t>> partitions_;
  std::optional<gpulet_plan> pending_plan_{};
  std::vector<std::string> pending_moves_{};
  /// Automatic gpu-lets: when the arrivals the next plan weighs began, and its tick.
  time_point window_start_{};
  std::optional<time_point> replan_at_{};
  device_gate gate_;
  std::vector<model_slot> models_;
  std::unordered_map<batch_id, batch_state> batches_;
  std::deque<batch_id> runnable_;
  std::set<time_point> ticks_;
  batch_id next_batch_ = 1;
  std::vector<uint32_t> blocked_;
};

/// How long a model whose batch found no KV room at all waits before it tries again when
/// nothing else tells it room came back.
inline constexpr auto kv_retry = std::chrono::milliseconds(50);

/// Tokens of lookahead a KV ask adds per row, so that a batch asks about once per block
/// its rows fill rather than every step.
inline constexpr int64_t kv_lookahead_tokens = 16;

/// Seconds after the instant a tick is due that it fires.
inline constexpr auto tick_slack = std::chrono::microseconds(100);

}  // namespace computron::sched
