#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sched/clock.hpp"
#include "sched/policies.hpp"

/// The residency ledger and room planning: what every device holds, what every model is
/// doing, and what to load or evict next. The swap scheduler actor feeds it events (a
/// request wants a model, a load finished, a lease ended) and carries out the decisions
/// it returns; the simulator does the same against simulated links. No side effects, no
/// actors, explicit time.
namespace computron::sched {

/// Where a model's weights are (Triton's lifecycle); `unavailable` is a model one of
/// whose devices is unreachable (its reason says which).
enum class model_state : uint8_t { offloaded, loading, resident, evicting, unavailable };

const char* to_string(model_state s);

/// One device as the ledger accounts it.
struct device_slot {
  /// Bytes weights may use (capacity less the activation workspace).
  uint64_t usable_bytes = 0;
  /// Host-to-device link, GB/s (reload cost estimates); 0: unknown, learned from the
  /// device's loads (note_transfer), 10 assumed until the first.
  double link_gbps = 0;
  /// The device's page (shards and KV chunks take whole pages of it); 1: bytes.
  uint64_t page_bytes = 1;
};

/// The shards of a model: device and bytes of each.
struct placement {
  std::vector<int32_t> devices;
  std::vector<uint64_t> bytes;
  bool pinned = false;
  /// Priority class (higher: evicted last, served first).
  int32_t priority = 0;
  /// Bytes of one KV block on each shard (models::kv_block_bytes), parallel to `devices`;
  /// empty: the model keeps no KV in the ledger (it caches nothing, or not in blocks).
  std::vector<uint64_t> kv_block_bytes{};
  /// A LoRA adapter's: the model it adapts (registered before it, on the same devices in
  /// the same order). An adapter runs only on its resident base: a lease on it leases the
  /// base too, its load waits for the base's (which it asks for), and evicting the base
  /// evicts it (S-LoRA's unified pool: adapters are residents sized by their real rank,
  /// beside whole models and KV, with no region reserved for them). Empty: a whole model.
  std::string base{};
};

/// What keeps a placement from ever fitting, even with every other model evicted: the
/// bytes its shards need on one device beyond what that device holds for weights
/// (`usable_bytes`, by device index; a device past its end holds nothing). Empty when every
/// device has room. Registration decides with it (the model manager before it fills any
/// host copy, the swap scheduler before ledger::add), so such a model is refused with the
/// sizes instead of being listed as serving and failing every request. The simulator adds
/// such a model all the same: its requests are refused at their load (never_fits), as the
/// runtime refuses them.
std::optional<refusal> check_fits(const std::string& name, const placement& p,
                                  const std::vector<uint64_t>& usable_bytes);

/// Dense index of a registered model.
using model_id = uint32_t;

struct model_entry {
  std::string name;
  placement where;
  uint64_t total_bytes = 0;
  /// Never `unavailable` here: that is derived from the devices (see state_of).
  model_state state = model_state::offloaded;
  uint32_t leases = 0;
  bool pinned = false;
  /// Some request waits for this model's load (cleared when it loads or is refused).
  bool wanted = false;
  /// In the pending loads.
  bool queued = false;
  /// A device refused its last load for room the ledger counted as free (a KV pool still
  /// held it, a discard had not yet run): the load waits in the queue until then.
  std::optional<time_point> retry_at;
  /// Loads refused so in a row (the wait doubles with each, to a second).
  uint32_t device_refusals = 0;
  /// Loading, and every shard's copies are queued (load_started): batches may lease it
  /// and compute while the rest arrives (ledger_options::compute_while_loading).
  bool computable = false;
  /// When it became computable (load_started).
  time_point computable_since{};
  /// Chosen as a victim for a waiting load but still leased: no new leases until it is
  /// evicted or the drain is called off. Without this, a model whose batches overlap
  /// (pipelining, steady traffic) would hold its lease forever and starve the load.
  bool draining = false;
  /// Lease requests held back while it drains.
  uint32_t held = 0;
  /// When a batch last used it; unset before the first.
  std::optional<time_point> last_used;
  demand_meter demand;
  uint64_t loads = 0;
  uint64_t evictions = 0;
  /// Loads started by prefetch, and how many of those a batch used before the model
  /// was evicted again (a prefetch that paid off).
  uint64_t prefetches = 0;
  uint64_t prefetch_hits = 0;
  /// Loaded (or loading) by a prefetch and not used since.
  bool prefetched = false;
  /// KV blocks its running batches hold on every one of its shards (each shard caches
  /// every sequence, for its layers and heads): kv_blocks x kv_block_bytes[i] bytes of
  /// device i's budget. Taken only under a lease; an ended batch's go back once its
  /// workers dropped its caches, so a lease-free (even evicted) model may hold some until
  /// then.
  uint64_t kv_blocks = 0;
  /// Bytes of device pages its KV pools last reported holding, per shard (empty: no
  /// report). Shard i's KV counts max(kv_blocks x kv_block_bytes[i], kv_pool_bytes[i]):
  /// a pool frees its pages only as whole chunks empty, so after blocks went back it may
  /// still hold them, and the ledger must not hand those pages to a load meanwhile.
  std::vector<uint64_t> kv_pool_bytes;
  /// Unregistered: its name is free again and its id is never used again (ids stay
  /// dense, so the entry stays, offloaded and unpinned).
  bool removed = false;
  /// An adapter's base (placement::base), and a base's registered adapters.
  std::optional<model_id> base;
  std::vector<model_id> adapters;
};

struct device_account {
  device_slot slot;
  uint64_t used_bytes = 0;
  /// Bytes KV blocks hold (every model's kv_blocks x its block bytes here): weights and
  /// KV share one budget, usable_bytes.
  uint64_t kv_bytes = 0;
  /// The largest contiguous free block the device last reported (unset: none reported,
  /// free bytes are contiguous). A shard needs a block, not just bytes.
  std::optional<uint64_t> largest_free_bytes;
  /// Loads copying over this device's link now.
  uint32_t transfers = 0;
  /// The link's rate as its loads measured it, GB/s (0: none yet). Used where the slot's
  /// rate is unknown: a GPU's link is not configured, and assuming 10 GB/s for a 55 GB/s
  /// link made batches leased during a load start 5x too late (bench/RESULTS.md).
  double learned_link_gbps = 0;
  /// Its node is gone.
  bool lost = false;
};

/// What a pass decided; the caller carries it out in this order.
struct decisions {
  /// Models whose evictions start now (already marked evicting).
  std::vector<model_id> evictions;
  /// Models whose loads start now (already marked loading, bytes and transfer slots
  /// taken).
  std::vector<model_id> loads;
  /// Models whose waiting requests fail, and why.
  std::vector<std::pair<model_id, refusal>> refused;
  /// Models whose drain was called off: their held lease requests go ahead (granted if
  /// resident, else waiting for a load like any other).
  std::vector<model_id> undrained;
  /// The earliest retry_at of a load left waiting for it: pump again then.
  std::optional<time_point> wake_at;

  bool empty() const {
    return evictions.empty() && loads.empty() && refused.empty() && undrained.empty();
  }
};

/// The answer to a lease request.
enum class acquire_result {
  /// Leased: the model is resident and stays so until release.
  granted,
  /// Queued for a load: the caller waits for the load (call pump now).
  wait_load,
  /// The model drains for another's load: the caller waits for the pass that ends it.
  wait_drain,
  /// A device of the model is lost (see unavailable_reason).
  unavailable,
};

struct ledger_options {
  /// Victim choice: "lru" or "cost".
  std::string policy = "lru";
  /// Loads that may copy over one device's link at once; more queue.
  uint32_t max_transfers_per_link = 1;
  /// Prefetch: when nothing waits to load and a model's links are idle, load the model
  /// most in demand that is not resident, if room can be made without evicting a leased,
  /// pinned or higher-priority model or one nearly as much in demand (see prefetch_margin).
  bool prefetch = false;
  /// Leases on a loading model once its copies are all queued (load_started): a batch
  /// starts at once and each layer waits only for its own bytes, so a cold request costs
  /// about max(load, compute) instead of load + compute. A loading model is never a
  /// victim, leased or not.
  bool compute_while_loading = true;
  /// Above 0: KV blocks live in a fixed reserve of this many bytes per device, apart from
  /// the weights (whose budget shrinks by it), as single-model servers slice memory
  /// (vLLM's gpu_memory_utilization); no weights are evicted for KV. 0: KV and weights
  /// share each device's one budget. The comparison for the shared budget's figures.
  uint64_t kv_reserve_bytes = 0;
};

/// A prefetch evicts only models whose demand is below the candidate's divided by this:
/// with two models of about equal demand, each would otherwise evict the other in turn.
inline constexpr double prefetch_margin = 2;

class ledger {
 public:
  /// Errors: no devices, an unknown policy, a zero transfer limit.
  static std::unique_ptr<ledger> make(std::vector<device_slot> devices, ledger_options opts,
                                      refusal* why);

  /// Registers a model; the same name with the same placement is the same model.
  /// Refusals: a malformed placement, an unknown device, another placement under the name;
  /// for an adapter (placement::base), a base that is not registered or is an adapter
  /// itself, and devices other than the base's.
  /// (Whether it can ever fit is check_fits's decision, asked before.)
  std::optional<model_id> add(const std::string& name, const placement& p, refusal* why);

  std::optional<model_id> find(const std::string& name) const;
  const model_entry& model(model_id id) const { return models_[id]; }
  size_t model_count() const { return models_.size(); }
  const device_account& device(size_t d) const { return devices_[d]; }
  size_t device_count() const { return devices_.size(); }
  const ledger_options& options() const { return opts_; }
  const eviction_policy& policy() const { return *policy_; }
  size_t pending_loads() const { return pending_.size(); }
  /// Changes whenever a model becomes resident or stops being so (state_of): whoever
  /// mirrors the resident set refreshes it only then.
  uint64_t residency_epoch() const { return residency_epoch_; }

  /// The state the outside world sees: unavailable while a device is lost.
  model_state state_of(model_id id) const;
  /// Why a model is unavailable, or empty.
  std::string unavailable_reason(model_id id) const;
  /// Models resident on each device, and resident anywhere.
  std::vector<size_t> resident_per_device(size_t* resident_total) const;

  /// A batch wants the model: leased now (resident, or loading and computable), queued
  /// for a load, or held while it drains.
  acquire_result acquire(model_id id, time_point now);
  /// A waiting lease request gets its lease (its load finished, or the drain ended).
  void grant(model_id id, time_point now);
  /// A batch is done with the model. False without a lease; true when the lease count
  /// dropped to zero (a pass may now evict it: call pump).
  bool release(model_id id, time_point now, bool* last);
  /// An explicit load request: queues the model if it is not resident or loading.
  /// Returns false when the model is unavailable.
  bool want(model_id id);
  /// After load_failed for lack of room on a device: queues the load again, not to start
  /// before `now` plus a wait that doubles with every such refusal in a row (20 ms to
  /// 1 s). The ledger counted that room as free, so it comes back by itself (a KV pool
  /// giving pages back, a discard running); failing the requests instead lost them.
  /// Returns want's answer.
  bool retry_later(model_id id, time_point now);
  /// Recent arrivals for the cost-aware policy.
  void note_demand(model_id id, uint32_t n, time_point now);
  void pin(model_id id, bool pinned);
  /// Changes the victim policy; a refusal names the accepted values.
  std::optional<refusal> set_policy(const std::string& name);

  /// An explicit unload: refused while leased or loading; otherwise, if resident, its
  /// eviction starts (returns true: carry it out), with its resident adapters' before it
  /// (appended to `with`: carry them out too).
  std::optional<refusal> begin_unload(model_id id, bool* start_evict,
                                      std::vector<model_id>* with = nullptr);

  /// Every shard of a loading model has its copies queued: with compute_while_loading,
  /// it may be leased from now on (returns true: grant the lease requests waiting for
  /// its load now). False when the option is off or the model is not loading.
  bool load_started(model_id id, time_point now);
  /// Seconds its load still takes at the links' nominal rates (0 when it is not loading
  /// or should be done by now): when a batch leased on it should start.
  double load_left_seconds(model_id id, time_point now) const;
  /// Loads and evictions end. A failed eviction leaves the model resident (its device
  /// copy is in an unknown state, so it stays accounted). A failed load may leave
  /// leases behind (batches that started on it fail on their own and release them).
  void load_done(model_id id, time_point now);
  void load_failed(model_id id);
  void evict_done(model_id id);
  void evict_failed(model_id id);
  /// Gives up on a model's residency (a device's node is gone): bytes freed everywhere,
  /// offloaded; loads again once all devices are back. Its KV blocks go, and its pools'
  /// figures on the lost devices; on the others they count until their workers report.
  void forget(model_id id);
  /// Unregisters an offloaded model with no leases and no load waiting; refused
  /// (invalid_state) otherwise, and for a base whose adapters are still registered. Its
  /// name may be registered again, with any placement.
  std::optional<refusal> remove(model_id id);
  /// A device reported its largest free block (after a transfer).
  void note_largest_free(size_t device, uint64_t bytes);
  /// A load moved `bytes` over `device`'s link in `seconds`: the rate it learns where the
  /// slot's link is unknown (a configured rate wins). Transfers under 1 MiB are ignored,
  /// their time being mostly the submission's.
  void note_transfer(size_t device, uint64_t bytes, double seconds);
  /// The link rate estimates use: configured, else learned, else 10 GB/s.
  double link_gbps(size_t device) const;

  /// KV blocks (sched/kv_budget.cpp). Whether `blocks` more of `id`'s blocks fit now,
  /// and the most that do (0 for a model that keeps no KV in the ledger: then any number
  /// "fits", as nothing is counted).
  bool kv_fits(model_id id, uint64_t blocks) const;
  uint64_t kv_room(model_id id) const;
  /// Takes `blocks` more for `id` (the caller checked kv_fits) and gives some back
  /// (clamped to what it holds: a forgotten model's blocks are already gone).
  void kv_take(model_id id, uint64_t blocks);
  void kv_give(model_id id, uint64_t blocks);
  /// `id`'s KV pools hold `bytes[k]` of pages on `devices[k]` (a worker's report after a
  /// step; devices the model has no shard on are ignored). Returns whether the model's
  /// KV counts less than before (room for a pass).
  bool kv_pool(model_id id, const std::vector<int32_t>& devices,
               const std::vector<uint64_t>& bytes);
  /// Bytes shard `i` of `id` counts for its KV now.
  uint64_t kv_charge(model_id id, size_t i) const;
  /// Lease-free, unpinned resident models whose eviction would make room for `blocks`
  /// more of `id`'s blocks, in the policy's order; empty when none is needed, nullopt when
  /// even all of them would not (their evictions are not started: begin_kv_evictions).
  std::optional<std::vector<model_id>> kv_victims(model_id id, uint64_t blocks,
                                                  time_point now) const;
  void begin_kv_evictions(const std::vector<model_id>& victims);
  /// The adapters of `base` that wait for a load (wanted), which a refusal of the base's
  /// load refuses too: they no longer wait (their waiters fail with it).
  std::vector<model_id> drop_waiting_adapters(model_id base);
  /// The most blocks `id` could hold with every other unpinned model evicted: a sequence
  /// that needs more can never run there.
  uint64_t kv_ceiling(model_id id) const;
  /// Whether other models hold KV blocks on a device of `id` (room that comes back when
  /// their batches end).
  bool kv_held_beside(model_id id) const;

  /// Devices lost (their resident models are returned: forget them and free what they
  /// hold elsewhere) and found again.
  std::vector<model_id> lose(const std::vector<int32_t>& devices);
  void find_devices(const std::vector<int32_t>& devices);

  /// Seconds a load of the model takes at its links' nominal rates (its slowest shard):
  /// what it costs unhindered, for service estimates.
  double load_seconds(model_id id) const;
  /// What keeps a model from ever fitting (its shard plus pinned models exceed a device),
  /// or empty.
  std::string never_fits(model_id id) const;

  /// Starts what can start among the models waiting to load, oldest first: a model that
  /// fits starts; one that needs room gets victims by the policy (lease-free ones evict
  /// now; leased ones drain); one that must wait reserves its devices so later models
  /// cannot take the room it waits for.
  decisions pump(time_point now);

 private:
  ledger(std::vector<device_slot> devices, ledger_options opts,
         std::unique_ptr<eviction_policy> policy);

  enum class room { start, wait, evicting };
  room make_room(model_id id, time_point now, decisions& out);
  /// Bytes each of the model's devices is short by (of free bytes, or of one free block
  /// where a device reported fragmentation); `fits_in_bytes` says whether free bytes alone
  /// would do.
  std::map<size_t, int64_t> shortfall(const model_entry& m, bool* fits_in_bytes) const;
  /// Takes victims in the policy's order from `candidates` until `short_bytes` is covered;
  /// returns whether it is.
  bool cover(const std::vector<model_id>& candidates, std::map<size_t, int64_t>& short_bytes,
             time_point now, std::vector<model_id>& victims) const;
  /// Whether `o` may be a victim of a pass that makes room for `id` (lease-free or not is
  /// the caller's filter): resident, unpinned, not `id` nor `id`'s base, and not a base
  /// one of whose adapters is loading, evicting or waiting for a load.
  bool may_evict_for(model_id o, model_id id) const;
  /// Shard k's bytes of `o` with those of its resident adapters (which go with it).
  uint64_t bytes_with_adapters(const model_entry& o, size_t k) const;
  /// `victims` with each base's resident adapters before it, once each.
  std::vector<model_id> with_adapters(const std::vector<model_id>& victims) const;
  /// The prefetch pass (ledger_options::prefetch), at the end of pump.
  void prefetch(time_point now, decisions& out);
  int32_t lost_device(const model_entry& m) const;
  uint64_t free_bytes(size_t d) const;
  void begin_load(model_id id);
  void begin_evict(model_id id);
  void free_shards(model_entry& m);
  /// Frees the model's KV blocks everywhere, and its pools' figures on lost devices, or
  /// on every device unless `live_pools_stay` (an unregistered model's workers forget its
  /// pools, and a late report would not find its name).
  void free_kv(model_entry& m, bool live_pools_stay);
  /// Runs `change` on `m`'s KV figures, moving its devices' kv_bytes by the difference of
  /// its charges.
  template <class F>
  void recharge_kv(model_entry& m, F change);
  /// Bytes KV may still take on device d (of the shared budget, or of the fixed reserve).
  uint64_t kv_free_bytes(size_t d) const;

  std::vector<device_account> devices_;
  std::vector<model_entry> models_;
  std::unordered_map<std::string, model_id> by_name_;
  std::deque<model_id> pending_;
  ledger_options opts_;
  std::unique_ptr<eviction_policy> policy_;
  uint64_t residency_epoch_ = 0;
};

}  // namespace computron::sched
