#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "sched/clock.hpp"
#include "sched/ledger.hpp"

/// The residency core: the ledger plus who waits for what, as one event-in, effects-out
/// machine (Clockwork's controller, vLLM's scheduler step). Its drivers (the swap
/// scheduler actor against shard workers, the simulator against simulated links) feed it
/// events (a lease is asked for, a load started or ended, a lease ended, a device was lost)
/// and carry out what comes back in order: evictions and loads to start, shards to
/// discard, then grants, completions and failures of the waiters. The protocol around the
/// ledger's decisions (who is granted when a load starts or ends, what a drain called off
/// does, which waiters fail when a load is refused) lives here once.
namespace computron::sched {

/// A caller waiting on the core; the driver numbers them and maps each to its promise or
/// batch.
using waiter_id = uint64_t;

struct lease_grant {
  waiter_id waiter = 0;
  model_id model = 0;
  /// The lease waited for a load (a swap): false when it was granted on a resident model,
  /// at once or when the drain that held it was called off.
  bool loaded = false;
};

struct waiter_done {
  waiter_id waiter = 0;
  model_id model = 0;
};

/// The largest contiguous free block a device reported after a transfer.
struct free_block {
  size_t device = 0;
  uint64_t bytes = 0;
};

/// What one shard's copy took: the ledger learns unknown links from it.
struct transfer_sample {
  size_t device = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

/// KV blocks given to a running batch (kv_reserve): all it wanted, or fewer when no more
/// room could be made (then fewer than its `need` only when even evicting every lease-free
/// model would not do: the batch preempts rows to fit).
struct kv_grant {
  waiter_id waiter = 0;
  model_id model = 0;
  uint64_t blocks = 0;
  /// The most blocks the model could ever hold (ledger::kv_ceiling).
  uint64_t ceiling = 0;
};

struct waiter_failure {
  waiter_id waiter = 0;
  model_id model = 0;
  refusal why;
};

/// What an event decided; the driver carries it out in the order of the fields.
struct residency_effects {
  /// Models whose shards are freed wherever they are, answers ignored (a failed load, a
  /// lost device): whatever their devices hold of them is garbage now, and the ledger
  /// already counts that room as free, so this goes before any load.
  std::vector<model_id> discards;
  /// Models whose eviction starts now (marked evicting).
  std::vector<model_id> evictions;
  /// Models whose load starts now (marked loading, bytes and transfer slots taken). With
  /// compute while loading the driver reports load_started once every shard's copies are
  /// queued, then load_done (or load_failed) when they arrived.
  std::vector<model_id> loads;
  /// Lease requests that got their lease (already counted in the ledger).
  std::vector<lease_grant> grants;
  /// KV asks answered (after the grants: a batch's lease comes before its blocks).
  std::vector<kv_grant> kv_grants{};
  /// Explicit loads and unloads that are done.
  std::vector<waiter_done> done;
  /// Waiters that fail, and why.
  std::vector<waiter_failure> failures;
  /// Loads wait to be retried (ledger::retry_later): call tick at this time.
  std::optional<time_point> wake_at{};

  bool empty() const {
    return evictions.empty() && loads.empty() && discards.empty() && grants.empty() &&
           kv_grants.empty() && done.empty() && failures.empty();
  }
};

class residency {
 public:
  /// Errors as ledger::make's.
  static std::unique_ptr<residency> make(std::vector<device_slot> devices, ledger_options opts,
                                         refusal* why);

  /// The accounting itself, for reports and the calls that decide nothing about waiters
  /// (find, note_demand, set_policy, note_largest_free, add, check_fits).
  const sched::ledger& ledger() const { return *ledger_; }
  sched::ledger& ledger() { return *ledger_; }

  /// A batch asks to lease `id`: granted at once (resident, or loading and computable),
  /// after a load, or once the drain that holds it ends; refused while a device is lost.
  residency_effects acquire(model_id id, waiter_id w, time_point now);
  /// An explicit load: done at once when resident, else when its load ends.
  residency_effects load(model_id id, waiter_id w, time_point now);
  /// An explicit unload: done at once when offloaded, else when its eviction ends;
  /// refused while leased or loading (the effects carry the failure).
  residency_effects unload(model_id id, waiter_id w, time_point now);
  /// A batch is done with its lease. `ok` is false without a lease to end.
  residency_effects release(model_id id, time_point now, bool* ok = nullptr);
  /// Every shard of a loading model has its copies queued (compute while loading).
  residency_effects load_started(model_id id, time_point now);
  /// `free` (the devices' reports with the transfer) is noted before the pass that follows
  /// plans room: a stale, fragmented block would make it evict more than it needs.
  residency_effects load_done(model_id id, time_point now, const std::vector<free_block>& free = {},
                              const std::vector<transfer_sample>& copies = {});
  /// `why` is what its waiters hear, unless it is a device's out_of_device_memory and
  /// the model can fit once the ledger's room is really free: then its waiters keep
  /// waiting and the load is retried (ledger::retry_later) under their deadlines.
  residency_effects load_failed(model_id id, const refusal& why, time_point now);
  /// A wake_at time came: the pass runs again.
  residency_effects tick(time_point now);
  residency_effects evict_done(model_id id, time_point now,
                               const std::vector<free_block>& free = {});
  /// A failed eviction: its copy is in an unknown state and stays accounted as resident,
  /// unless a device of the model is lost (then it is gone, and the eviction is done).
  residency_effects evict_failed(model_id id, const refusal& why, time_point now);
  /// Pinning stops the model from being a victim; unpinning may let a waiting load go.
  residency_effects pin(model_id id, bool pinned, time_point now);
  /// Devices' node is gone, or back.
  residency_effects lose(const std::vector<int32_t>& devices, time_point now);
  residency_effects find_devices(const std::vector<int32_t>& devices, time_point now);
  /// A running batch of `id` (under a lease) asks for KV blocks: `want` (what it needs
  /// with lookahead) when they fit; else as many as fit, if at least `need` (what its rows
  /// need for their next step); else lease-free models are evicted to make room for
  /// `need` and the ask waits for them; when even that cannot cover `need`, the ask gets
  /// what fits now (possibly none) and the batch preempts; unless `wait` (a batch's first
  /// step) and other models' batches hold KV on its devices: then it waits for them to
  /// give some back. Asks are served before loads.
  residency_effects kv_reserve(model_id id, waiter_id w, uint64_t want, uint64_t need, bool wait,
                               time_point now);
  /// A batch gives blocks back (rows finished, the batch ended); waiting asks and loads
  /// may go.
  residency_effects kv_return(model_id id, uint64_t blocks, time_point now);
  /// A report of the pages the model's KV pools hold (ledger::kv_pool); a pass follows
  /// when that frees room.
  residency_effects kv_pool(model_id id, const std::vector<int32_t>& devices,
                            const std::vector<uint64_t>& bytes, time_point now);
  /// Unregisters an offloaded, unused model (ledger::remove), forgetting its waiters.
  std::optional<refusal> remove(model_id id);

 private:
  explicit residency(std::unique_ptr<sched::ledger> l) : ledger_(std::move(l)) {}

  struct waiters {
    std::vector<waiter_id> leases;
    std::vector<waiter_id> loads;
    std::vector<waiter_id> evictions;
    /// Lease requests held back while the model drains.
    std::vector<waiter_id> held;
  };
  waiters& of(model_id id);
  /// Grants every lease request waiting for `id`'s load.
  void grant_waiting(model_id id, time_point now, residency_effects& out);
  void fail_all(model_id id, std::vector<waiter_id> waiters::*which, const refusal& why,
                residency_effects& out);
  struct kv_ask {
    model_id model = 0;
    waiter_id waiter = 0;
    uint64_t want = 0;
    uint64_t need = 0;
    bool wait = false;
  };
  /// Answers `a` if it can be now (true), else starts the evictions it waits for.
  /// `no_evict`: answer with what fits, evicting nothing and waiting for nothing.
  bool try_kv(const kv_ask& a, time_point now, residency_effects& out, bool no_evict = false);
  /// Retries the waiting KV asks, oldest first.
  void serve_kv(time_point now, residency_effects& out, bool no_evict = false);
  /// Runs the ledger's pass until nothing more follows (a drain called off may queue
  /// another load), appending what it decided.
  void pump(time_point now, residency_effects& out);

  std::unique_ptr<sched::ledger> ledger_;
  std::vector<waiters> waiting_;
  std::vector<kv_ask> kv_waiting_{};
};

}  // namespace computron::sched
