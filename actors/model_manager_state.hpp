#pragma once

// The model manager's state and the pieces its files share (internal to actors/):
// model_manager.cpp serves requests and runs batches, batch_steps.cpp runs their steps,
// manager_roster.cpp keeps the models the registry handed it.
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>

#include <caf/all.hpp>

#include "actors/model_manager.hpp"
#include "actors/reply_waits.hpp"
#include "models/sampling.hpp"
#include "sched/dispatch.hpp"
#include "sched/ledger.hpp"
#include "sched/step_fit.hpp"

namespace computron::actors::manager_detail {

using namespace std::chrono_literals;

struct queued_request {
  infer_request req;
  /// The LoRA adapter its rows run with, as registered ("": the model alone). The request
  /// waits in its base's queue and runs in the base's batches; req.model is the adapter.
  std::string adapter{};
  /// Its key in the dispatch core's queues and batches.
  uint64_t key = 0;
  caf::typed_response_promise<infer_reply> rp;
  sched::time_point arrival{};
  sched::time_point deadline{};
  /// When it left the queue: into a batch as it formed, or joining a running one.
  sched::time_point taken{};
  /// It joined a running batch: it waited for no lease or load (continuous batching).
  bool joined = false;
  /// Rows of its batch when it started running (with it, if it joined): its reply's
  /// batch_size.
  uint32_t batch_rows = 0;
  /// When its first and latest tokens came, and the gaps between its tokens (the
  /// request_timeline the observer gets).
  sched::time_point first_token{};
  sched::time_point last_token{};
  std::vector<double> itl_s{};
  /// Preempted for KV room and recomputed (vLLM's recompute): req.tokens grew by what it
  /// had generated, req.max_tokens shrank by as much, and its answer starts with these.
  uint32_t preemptions = 0;
  /// Of those, requeued because a step found its device full (requeue_for_room): bounded,
  /// so a device that stays short fails the row with the step's error instead.
  uint32_t room_requeues = 0;
  size_t prompt_len = 0;
  std::vector<int64_t> prior_outputs{};
  std::vector<token_logprobs> prior_logprobs{};
  std::vector<token_logprobs> prior_prompt_logprobs{};
};

struct batch {
  /// The dispatch core's number for it.
  sched::batch_id id = 0;
  std::string model;
  std::vector<queued_request> rows;
  std::vector<std::vector<int64_t>> outputs;
  /// Per row, the log-probabilities of its outputs (rows that ask for them only), and of
  /// its prompt (step 0, where asked).
  std::vector<std::vector<token_logprobs>> logprobs;
  std::vector<std::vector<token_logprobs>> prompt_logprobs;
  /// The rows (indices into `rows`) the last step ran, in the workers' order: a row that
  /// finished (max_tokens, EOS, cancelled) is answered at once and leaves this list.
  std::vector<size_t> sent;
  /// Request ids whose cancel arrived while they were in this batch (the dispatch core
  /// hears of it too, and fails those rows if the batch has not started).
  std::set<uint64_t> cancelled;
  /// Those of them whose client has all it wants (a stop string): they end as "stop".
  std::set<uint64_t> completed;
  /// The last step sent was marked last, so the workers dropped the batch's caches.
  bool caches_dropped = false;
  /// Rows counted as running in model_manager_state::running (see set_running), and the
  /// most it ran at once (what the trace shows: `rows` only keeps the rows that go on).
  size_t running = 0;
  size_t peak_rows = 0;
  sched::time_point dispatched{};
  /// When its first step started, on the trace clock (now_s): the span it reports is
  /// measured on that one clock, so that spans of batches that follow each other never
  /// overlap (mixing in the actor clock skewed their ends by the time between readings).
  double run_s = 0;
  double load_ms = 0;
  double compute_ms = 0;
  bool swapped = false;
  /// Leased while its model still loaded: the first step also waits for the bytes (the
  /// workers report compute without that wait), and it may take as long as the load.
  bool loading = false;
  double load_left_ms = 0;
  /// Steps run: the batcher's service estimate learns per step.
  int64_t steps = 0;
  /// Where its steps stand while a step boundary waits for KV blocks (run_step's step).
  int64_t boundary_step = 0;
  /// Rows whose prompts are computed in chunks before they join (sched::join_plan):
  /// indices into `rows` (after the running ones), and the batch id their chunks run as,
  /// under which the workers cache them until the last chunk joins them to this batch.
  std::vector<size_t> pending{};
  sched::batch_id pending_id = 0;
  /// The plan of its next decode step: the dispatch core's from the last step boundary,
  /// with the joiners that went on after their prefill.
  sched::step_plan next{};
  /// The LoRA adapters it holds leases on (its rows', from their first step to its end).
  std::set<std::string> adapters{};
};

using batch_ptr = std::shared_ptr<batch>;

struct managed_model {
  model_config cfg;
  int64_t vocab = 0;
  int64_t max_positions = 0;
  uint64_t bytes = 0;
  /// The checkpoint's bytes (engine::weight_bytes), which `bytes` is reported against.
  uint64_t weight_bytes = 0;
  /// Its queue and placement in the dispatch core (which also holds its in-flight count,
  /// at most pp, so that a pipeline's stages all work).
  uint32_t index = 0;
  uint64_t served = 0;
  /// Its steps' compute against their tokens (reported for `computron sim --calibrate`).
  sched::step_fit steps{};
  /// The same by the gpu-let share its steps ran at (automatic gpu-lets' profile).
  std::map<int32_t, sched::step_fit> steps_at{};
  /// Being unregistered: new requests are refused.
  bool unregistering = false;
};

struct model_manager_state {
  static constexpr const char* name = "model_manager";
  model_manager_options opts;
  engine_registry engines;
  std::vector<shard_worker_actor> workers;
  swap_scheduler_actor scheduler;
  std::map<std::string, managed_model> models;
  /// Names the registry said it cannot serve yet (registering) or at all (failed, with
  /// the reason and its code): listed, so that operators see a model that is missing and
  /// why, and requests for them are refused with that reason.
  std::map<std::string, model_info> listed;
  /// Queues, admission, batch formation, leases, the device gate and ticks (sched/
  /// dispatch): this actor carries out its effects. The requests themselves wait in
  /// `waiting` under their keys, then in their batches.
  std::shared_ptr<sched::dispatcher> disp;
  std::vector<std::string> names;
  std::unordered_map<uint64_t, queued_request> waiting;
  /// The batch of every request taken from the queue and not yet answered (for cancel).
  std::unordered_map<uint64_t, batch_ptr> batch_of;
  uint64_t next_key = 1;
  /// Batches formed and not yet started (waiting for a lease, devices or a tick).
  std::unordered_map<sched::batch_id, batch_ptr> pending;
  /// Batches whose step boundary waits for the answer to a KV ask.
  std::unordered_map<sched::batch_id, batch_ptr> at_boundary;
  /// Rows running per model (the running-requests gauge).
  std::map<std::string, size_t> running;
  /// Adapter leases batches wait for, each with its deadline.
  std::vector<std::shared_ptr<reply_wait>> adapter_waits;
  /// Steps' answers awaited from their ranks, without CAF request timeouts (reply_waits).
  reply_waits step_waits;

  sched::batcher& queues() { return disp->queues(); }
};

using manager_pointer = model_manager_actor::stateful_pointer<model_manager_state>;

/// The model's info as the list and info handlers answer it.
model_info info_of(const sched::batcher& b, const managed_model& m, const residency_report* r);
/// Replies with the model's info once the scheduler said where it stands.
void with_info(manager_pointer self, const std::string& name,
               caf::typed_response_promise<model_info> rp);
/// "no model named ..." (unknown_model).
caf::error unknown_model_error(const std::string& name);
/// Why a name is not serving (failed, registering, unregistering), else unknown_model.
caf::error not_serving(manager_pointer self, const std::string& name);
/// The registry's word on a name the manager cannot serve (manager_roster.cpp).
void note_listed(manager_pointer self, model_info i);
/// Serves a model the registry registered; replies with its info.
caf::result<model_info> adopt_model(manager_pointer self, const model_config& cfg, uint64_t bytes,
                                    bool kv_in_ledger);
/// Stops (true) or resumes (false) admitting a model's requests before it is unregistered.
caf::result<model_info> retire_model(manager_pointer self, const std::string& name, bool retire);
/// Forgets a retired model; false when it was not served.
bool forget_model(manager_pointer self, const std::string& name);

/// The manager's clock (the actor system's, as sched:: time).
sched::time_point now(manager_pointer self);
/// Why a request failed before or outside its batch's steps, as its client reads it.
caf::error row_error(manager_pointer self, const sched::row_failure& f, const queued_request& q);
/// Carries out what the dispatch core decided (model_manager.cpp).
void carry_out(manager_pointer self, sched::dispatch_effects e);
/// Fails one queued or running request with `err` (batch_steps.cpp, as what follows).
void reply_error(manager_pointer self, queued_request& q, const caf::error& err);
/// Ends a batch: on error every row still running fails with it; either way the model,
/// its devices and (where the last step did not) the workers' caches are released.
void finish_batch(manager_pointer self, const batch_ptr& b, const caf::error* err);
/// The batch runs `rows` rows now: the model's running count and gauge follow.
void set_running(manager_pointer self, const batch_ptr& b, size_t rows);
/// A batch's rows (batch_rows.cpp). Answers row `r`: its tokens so far and why it ended.
void finish_row(manager_pointer self, const batch_ptr& b, size_t r, const std::string& reason,
                int64_t stop_id = -1);
/// Row `r`'s token from position `p` of a step's result: it goes on (true), or is answered
/// and leaves the batch.
bool take_token(manager_pointer self, const batch_ptr& b, size_t r, size_t p, step_result& res,
                bool prefill);
/// Keeps only the rows in `going` (indices into b->rows, in the workers' order) and those
/// of a chunked prefill under way.
void compact(const batch_ptr& b, const std::vector<size_t>& going);
/// Row `r` was preempted: its request goes back to the queue to be recomputed.
void requeue(manager_pointer self, const batch_ptr& b, size_t r);
/// Continues b at a step boundary with what the dispatch core decided there (preemptions,
/// joins, and whether the next step runs now or waits for KV; batch_steps.cpp).
void at_step_boundary(manager_pointer self, const batch_ptr& b, sched::dispatch_effects e);
/// Runs step `step` of the rows in b->sent (the workers keep the rows of the previous step
/// that the plan names, by key). `plan`: the dispatch core's plan of the step (a batch's
/// first step); none: a decode step of every row in b->sent.
void run_step(manager_pointer self, const batch_ptr& b, int64_t step,
              const sched::step_plan* plan = nullptr);

/// LoRA adapters (manager_adapters.cpp). The registered name `name` stands for: itself,
/// or for "base:name" the adapter `name` of the model `base` (SGLang's form).
std::string registered_name(const model_manager_state& st, const std::string& name);
/// Leases the adapters of b's `rows` (indices into b->rows) that b does not hold yet;
/// `done` gets those that could not be leased, with why: the scheduler's refusal, or
/// unavailable when none came within `wait` (the batch holds its base's lease meanwhile,
/// and the room an adapter waits for may be its own base's or its other adapters').
void lease_adapters(manager_pointer self, const batch_ptr& b, const std::vector<size_t>& rows,
                    std::function<void(std::map<std::string, caf::error>)> done,
                    std::chrono::milliseconds wait);
/// The manager's own figures, the scheduler's and every worker's, merged
/// (manager_report.cpp).
caf::result<caf::settings> report(manager_pointer self);
/// Gives up the adapter waits past their deadline (the manager's tick).
void expire_adapter_waits(manager_pointer self);
/// Awaits a step's reply until w->deadline (batch_steps.cpp); at the manager's ticks,
/// expire_step_waits gives up on those past it (their `expire` runs).
void watch_step(manager_pointer self, std::shared_ptr<reply_wait> w);
void expire_step_waits(manager_pointer self);
/// Gives back every adapter lease b holds.
void release_adapters(manager_pointer self, const batch_ptr& b);
/// Gives back the adapter leases of b that none of its running or joining rows uses (nor
/// the rows of `joins`, about to join): an adapter whose rows are done may make room for a
/// joining row's (the batch would wait on itself otherwise).
void release_unused_adapters(manager_pointer self, const batch_ptr& b,
                             const std::vector<sched::join_plan>& joins);
/// Fails the rows of `rows` whose adapter is in `failed`; returns the others.
std::vector<size_t> drop_failed_adapters(manager_pointer self, const batch_ptr& b,
                                         std::vector<size_t> rows,
                                         const std::map<std::string, caf::error>& failed);
/// The name a row is served and counted under: its adapter's, else its batch's model.
const std::string& served_name(const queued_request& q, const batch& b);

}  // namespace computron::actors::manager_detail
