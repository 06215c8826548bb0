#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "sched/clock.hpp"
#include "sched/policies.hpp"

/// Queues, admission, batching and the device-sharing rule of the model manager, as
/// plain code: the manager (and the simulator) feed requests and batch ends in and carry
/// out the batches, expiries and ticks that come back.
namespace computron::sched {

struct batching_options {
  /// Sequences per batch at most.
  uint32_t max_batch_size = 8;
  /// How long the head of a queue waits for company before its batch goes anyway.
  duration batch_window = std::chrono::milliseconds(5);
  /// Which model's batch goes next: "fcfs", "resident-first" or "edf".
  std::string dispatch = "fcfs";
  /// resident-first: a head older than this goes first anyway.
  duration max_wait = std::chrono::seconds(1);
  /// Requests queued per model at most; more are refused as overloaded.
  uint32_t max_queue = 256;
  /// Deadline of a request that names none.
  duration default_deadline = std::chrono::seconds(60);
  /// Continuous batching: at every step boundary of a running batch, requests queued for
  /// its model join it (up to max_batch_size rows) instead of waiting for the whole batch
  /// to end. Off: a batch keeps the rows it formed with.
  bool continuous = true;
  /// How long past its deadline a running request that did not ask for drop_late is
  /// still served (late): the frontend waits as long for its answer (start_runtime gives
  /// it this as its reply_slack), so the manager ends the row then. A drop_late request
  /// ends at its deadline.
  duration late_grace = std::chrono::seconds(30);
  /// Chunked prefill of joiners (continuous batching): prompts longer than this many
  /// tokens that join a batch with running rows are computed in chunks of it, each chunk
  /// a step of its own between two of the running rows' steps, so that they wait for a
  /// chunk at a time rather than a whole long prompt. 0: a joiner's whole prompt in one
  /// step.
  uint32_t prefill_chunk = 512;
};

/// The deadline of a request that arrived at `arrival` asking for `deadline_ms` (0 or
/// less: the default). The one rule every admitting actor uses.
time_point deadline_of(time_point arrival, int64_t deadline_ms, duration default_deadline);

/// When a running request stops being worth a step: its deadline with drop_late, else
/// late_grace after it (its client stops waiting then). The one rule of the dispatch core
/// (rows end at the step boundary after it) and of the workers (a step that cannot end
/// before the latest of its rows' is refused).
inline time_point answer_limit(time_point deadline, bool drop_late, duration late_grace) {
  return drop_late ? deadline : deadline + late_grace;
}

/// A queued request: the caller's key (its own table holds the request) and its times.
struct queued_entry {
  uint64_t key = 0;
  time_point arrival{};
  time_point deadline{};
  /// Forward steps it needs (its max_tokens): the service estimate scales with them.
  int64_t steps = 1;
  /// The client asked for a refusal rather than a late answer (SLO-aware dispatch).
  bool drop_late = false;
  /// Position in its model's queue (the batcher's; callers leave it alone).
  uint64_t seq = 0;
  /// Tokens of its prompt (with what it generated before a preemption): the KV blocks
  /// it needs (0: one token).
  int64_t prompt_tokens = 0;
  /// Its prompt must be computed in one step (it asks for its prompt's log-probabilities,
  /// which a chunked prefill does not give).
  bool whole_prefill = false;
};

/// A batch to start: requests of one model, in queue order.
struct batch_plan {
  uint32_t model = 0;
  std::vector<queued_entry> rows;
};

/// What a dispatch pass decided.
struct dispatch_decisions {
  /// Requests whose deadline passed in the queue: they fail with deadline_exceeded.
  std::vector<std::pair<uint32_t, queued_entry>> expired;
  /// Requests that asked to be dropped rather than served late and would be: at their
  /// turn, the model's expected service time (its load if it is not resident, then its
  /// steps) runs past their deadline. They fail with deadline_exceeded and `estimate_s`
  /// of the model says why.
  std::vector<std::pair<uint32_t, queued_entry>> dropped;
  /// Batches to start, in order (each counts as in flight until batch_ended).
  std::vector<batch_plan> batches;
  /// When to dispatch again (a batch window closes, a deadline passes), if ever.
  std::optional<time_point> next_tick;
};

class batcher {
 public:
  /// Refusals: zero batch size or queue bound, an unknown dispatch policy.
  static std::unique_ptr<batcher> make(batching_options opts, refusal* why);

  /// Adds a model's queue; `max_in_flight` batches of it may run at once (its pipeline
  /// depth, so every stage works). Returns its index.
  uint32_t add_model(std::string name, int32_t max_in_flight, int32_t priority = 0);
  size_t model_count() const { return queues_.size(); }

  /// Admits a request into its model's queue, or refuses it (overloaded: the queue is
  /// full). Returns the deadline it got. `steps` and `drop_late` as in queued_entry.
  std::optional<refusal> admit(uint32_t model, uint64_t key, time_point now, int64_t deadline_ms,
                               time_point* deadline = nullptr, int64_t steps = 1,
                               bool drop_late = false, int64_t prompt_tokens = 0,
                               bool whole_prefill = false);
  /// Puts requests taken from the queue back at its front, in their order (a batch that
  /// could not get KV room for them, a preempted row): they keep their times.
  void push_front(uint32_t model, const std::vector<queued_entry>& rows);
  /// A blocked model forms no batches (one whose batch found no KV room at all waits for
  /// room to come back, instead of forming the same batch again at once).
  void set_blocked(uint32_t model, bool blocked);

  /// Expires what passed its deadline, then forms batches in the dispatch policy's order:
  /// a queue goes when it is full or its head waited a batch window.
  dispatch_decisions dispatch(time_point now);

  /// Up to `n` requests of `model`'s queue, in order, to join a running batch of it
  /// (continuous batching): no window, no in-flight count (the batch runs already).
  /// Expired and dropped requests come back as a dispatch pass gives them; the rows, if
  /// any, as the one batch.
  dispatch_decisions join(uint32_t model, size_t n, time_point now);

  /// A batch of `model` ended (or never ran).
  void batch_ended(uint32_t model);
  /// Measured service, for the estimates drop_late requests are judged by: a batch of
  /// `steps` forward steps computed for `seconds`; a load takes `seconds` at the links'
  /// nominal rates. Both are the work alone, moving averages: waits (for room, a link, a busy
  /// pipeline stage) are no property of the model, and counting them fed back (under load the
  /// estimates grew, more was dropped, and a model whose requests were all dropped never loaded
  /// again). So a request is dropped when it cannot make its deadline even unhindered.
  void note_steps(uint32_t model, double seconds, int64_t steps);
  void note_load(uint32_t model, double seconds);
  /// Seconds a request of `steps` steps is expected to take from its dispatch now (a load
  /// first if the model is not resident and no batch of it is in flight, which would be
  /// loading it); unset before the model's first measured batch.
  std::optional<double> estimate_s(uint32_t model, int64_t steps) const;
  /// The moving average of seconds per forward step (0: none measured yet): compute only,
  /// whatever the batch waited for bytes of a load.
  double step_seconds(uint32_t model) const;
  /// The manager's belief about residency, for resident-first.
  void set_resident(uint32_t model, bool resident);
  bool resident(uint32_t model) const { return queues_[model].resident; }
  size_t queued(uint32_t model) const { return queues_[model].live; }
  int32_t in_flight(uint32_t model) const { return queues_[model].in_flight; }
  const std::string& name(uint32_t model) const { return queues_[model].name; }
  const batching_options& options() const { return opts_; }

 private:
  batcher(batching_options opts, std::unique_ptr<dispatch_policy> policy);

  /// A queue whose every operation costs O(log n) or less: entries that leave from the
  /// middle (expired) stay as tombstones until they reach the front, and deadlines sit in
  /// a heap that forgets entries lazily, so a pass never scans the whole queue (the
  /// simulator runs queues of 10^5).
  struct model_queue {
    std::string name;
    std::deque<queued_entry> queue;
    std::deque<bool> dead;
    /// seq of queue.front(); entries are numbered in admission order.
    /// Numbers start high, so that push_front can number entries below the front.
    uint64_t front_seq = uint64_t{1} << 40;
    uint64_t next_seq = uint64_t{1} << 40;
    size_t live = 0;
    std::priority_queue<std::pair<time_point, uint64_t>,
                        std::vector<std::pair<time_point, uint64_t>>,
                        std::greater<std::pair<time_point, uint64_t>>>
        deadlines;
    int32_t max_in_flight = 1;
    int32_t in_flight = 0;
    int32_t priority = 0;
    bool resident = false;
    bool blocked = false;
    /// Moving averages of seconds per forward step and per load (0: none measured).
    double step_s = 0;
    double load_s = 0;

    bool is_dead(uint64_t seq) const { return seq < front_seq || dead[seq - front_seq]; }
    /// Drops tombstones from the front and stale heap entries from the top.
    void tidy();
  };
  /// Ends entry `seq` of a queue (it expired or was dropped).
  static void bury(model_queue& q, uint64_t seq);
  /// Takes up to `n` rows from the front of `model`'s queue; drop_late ones that would
  /// miss their deadlines go to `dropped`.
  void take_front(uint32_t model, size_t n, time_point now, std::vector<queued_entry>& rows,
                  std::vector<std::pair<uint32_t, queued_entry>>& dropped);
  batching_options opts_;
  std::unique_ptr<dispatch_policy> policy_;
  std::vector<model_queue> queues_;
  // Reused across passes (the simulator dispatches millions of times).
  std::vector<queue_view> views_;
  std::vector<uint32_t> view_models_;
};

/// Which batches may share devices. A device runs batches of one placement at a time, at
/// most pp of them, so a pipeline's stages all work. Safe because such batches reach
/// every worker in the same order, so their tensor-parallel collectives pair up; two
/// placements could pair them crosswise and deadlock. A batch that must wait reserves its
/// devices for the rest of the pass, so a later one cannot overtake it forever.
class device_gate {
 public:
  explicit device_gate(size_t devices) : use_(devices) {}

  /// The key of a placement (same tp, pp and devices in the same order: same key).
  uint32_t placement_key(int32_t tp, int32_t pp, const std::vector<int32_t>& devices);

  /// Starts a pass over the runnable batches, oldest first.
  std::vector<bool> begin_pass() const { return std::vector<bool>(use_.size(), false); }
  /// Whether a batch of placement `key` over `devices` may start now; if so its devices
  /// are taken, else they are reserved in `pass`.
  bool try_start(std::vector<bool>& pass, uint32_t key, const std::vector<int32_t>& devices,
                 int32_t pp);
  /// A started batch ended.
  void finish(const std::vector<int32_t>& devices);

 private:
  struct device_use {
    uint32_t key = 0;
    int32_t batches = 0;
  };
  std::vector<device_use> use_;
  std::vector<std::pair<std::string, uint32_t>> keys_;
};

/// When a batch leased on a loading model should start (compute while loading): once
/// the rest of the load takes about its first stage's compute, so that stage's layers
/// meet their bytes as they arrive instead of holding the devices while the whole load
/// runs. `load_left_s` is what the load still takes at the lease (unhindered estimate),
/// `step_s` a forward step of the whole model (0: unknown, so the batch waits for about
/// the whole load).
time_point overlap_start(time_point leased, double load_left_s, double step_s, int32_t pp);

}  // namespace computron::sched
