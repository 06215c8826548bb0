#include "sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>

#include "common/error.hpp"
#include "sched/dispatch.hpp"
#include "sched/residency.hpp"
#include "sched/step_rows.hpp"
#include "sim/sim_records.hpp"

namespace computron::sim {

using sched::model_id;
using sched::model_state;
using sched::time_point;

namespace {

using namespace detail;

class simulator {
 public:
  simulator(const sim_config& cfg, const workload::schedule& s) : cfg_(cfg), s_(s) {}

  caf::error init() {
    if (auto e = check(cfg_)) return e;
    std::vector<sched::device_slot> slots;
    for (auto& d : cfg_.devices)
      slots.push_back({d.capacity_bytes - cfg_.workspace_bytes, d.link_gbps});
    sched::refusal why;
    core_ = sched::residency::make(std::move(slots), cfg_.scheduler, &why);
    if (!core_) return make_error(why.code, why.reason);
    disp_ = sched::dispatcher::make(cfg_.batching, cfg_.devices.size(), &why, cfg_.gpulets);
    if (!disp_) return make_error(why.code, why.reason);
    for (auto& m : cfg_.models) {
      auto id = core_->ledger().add(
          m.name, {m.devices, m.shard_bytes, m.pinned, m.priority, m.kv_block_bytes, m.base}, &why);
      if (!id) return make_error(why.code, why.reason);
      // Model ids agree between the two cores: both number models in this order.
      auto index =
          disp_->add_model(m.name, m.tp, m.pp, m.devices, m.priority, !m.kv_block_bytes.empty());
      // The planner knows what a step costs, as the runtime learns it from its steps.
      disp_->set_profile(index, {{100, {m.step_s, m.step_per_token_s}}}, m.slo_s);
      // The unhindered load, as the runtime's leases tell its manager.
      disp_->queues().note_load(*id, core_->ledger().load_seconds(*id));
      stage_loads_.emplace_back(static_cast<size_t>(m.pp), stage_load{});
    }
    // Schedule models by index into cfg.models.
    for (auto& name : s_.models) {
      auto id = core_->ledger().find(name);
      if (!id)
        return make_error(ec::unknown_model,
                          "the workload names model " + name + ", which the config lacks");
      model_of_.push_back(*id);
    }
    traffic_.resize(cfg_.devices.size());
    lanes_ = static_cast<size_t>(disp_->lanes_per_device());
    device_free_.assign(cfg_.devices.size() * lanes_, time_point{});
    for (size_t d = 0; d < traffic_.size(); ++d) traffic_[d].device = std::to_string(d);
    return {};
  }

  sim_result run() {
    // Warm-up requests (one per model, each alone) first; the arrivals start after.
    double offset_s = 0;
    if (cfg_.warm_up) {
      for (uint32_t m = 0; m < cfg_.models.size(); ++m) {
        requests_.push_back(for_model({at(offset_s), m, cfg_.prompt_len, cfg_.max_tokens, false}));
        next_arrival_ = requests_.size() - 1;
        loop_until_idle();
        offset_s = std::max(offset_s, seconds(now_)) + 1.0;
      }
    }
    origin_ = at(offset_s);
    first_measured_ = requests_.size();
    // The warm-up's transfers are not part of the run (loadgen's figures start after it).
    for (auto& t : traffic_) t = {t.device};
    requests_.reserve(requests_.size() + s_.arrivals.size());
    records_.reserve(s_.arrivals.size());
    for (auto& a : s_.arrivals) {
      request r;
      r.arrival = origin_ + sched::from_seconds(a.time_s);
      r.model = model_of_[a.model];
      r.prompt_len = a.prompt_len > 0 ? a.prompt_len : cfg_.prompt_len;
      r.max_tokens = a.max_tokens > 0 ? a.max_tokens : cfg_.max_tokens;
      requests_.push_back(for_model(r));
    }
    // Arrivals enter the queue lazily, in order (they are sorted), so the heap stays small.
    next_arrival_ = first_measured_;
    loop_until_idle();
    sim_result out;
    // Records in arrival order.
    std::vector<workload::request_record> recs(s_.arrivals.size());
    for (auto& [i, r] : records_) recs[i - first_measured_] = std::move(r);
    out.records = std::move(recs);
    out.swaps = std::move(swaps_);
    out.devices = traffic_;
    out.events = events_;
    out.simulated_s = std::max(0.0, sched::seconds_between(origin_, last_done_));
    auto& l = core_->ledger();
    for (sched::model_id m = 0; m < l.model_count(); ++m) {
      out.prefetches += l.model(m).prefetches;
      out.prefetch_hits += l.model(m).prefetch_hits;
    }
    out.preemptions = preemptions_;
    out.peak_kv_bytes = peak_kv_bytes_;
    out.gpulets = disp_->partitions();
    out.replans = replans_;
    return out;
  }

 private:
  static time_point at(double s) { return time_point{} + sched::from_seconds(s); }

  /// `r` for model `r.model` as it runs: an adapter's request in its base's queue.
  request for_model(request r) const {
    auto& base = cfg_.models[r.model].base;
    if (base.empty()) return r;
    r.adapter = r.model;
    r.model = static_cast<uint32_t>(*core_->ledger().find(base));
    return r;
  }

  /// The name a request is answered under: its adapter's, else its model's.
  const std::string& served_name(const request& r) const {
    return cfg_.models[r.adapter != request::no_adapter ? r.adapter : r.model].name;
  }
  static double seconds(time_point t) { return sched::seconds_between(time_point{}, t); }
  double rel(time_point t) const { return sched::seconds_between(origin_, t); }

  void push(time_point t, event_kind k, uint64_t a) { heap_.push({t, seq_++, k, a}); }

  void loop_until_idle() {
    for (;;) {
      bool have_arrival = next_arrival_ < requests_.size();
      if (heap_.empty() && !have_arrival) return;
      if (have_arrival && (heap_.empty() || requests_[next_arrival_].arrival <= heap_.top().at)) {
        now_ = requests_[next_arrival_].arrival;
        ++events_;
        arrive(static_cast<uint32_t>(next_arrival_++));
        continue;
      }
      auto e = heap_.top();
      heap_.pop();
      now_ = e.at;
      ++events_;
      switch (e.kind) {
        case event_kind::tick:
          carry_out(disp_->tick(now_));
          break;
        case event_kind::load_done:
          carry_out(core_->load_done(static_cast<model_id>(e.a), now_));
          break;
        case event_kind::evict_done:
          carry_out(core_->evict_done(static_cast<model_id>(e.a), now_));
          break;
        case event_kind::step_done:
          step_done(e.a);
          break;
      }
    }
  }

  void fail(uint64_t key, int status, const char* kind) {
    auto& r = requests_[key];
    // A row whose adapter could not be leased is answered once (the dispatch core then
    // drops it from its batch as cancelled).
    if (!failed_.insert(key).second || !r.measured) return;
    workload::request_record rec;
    rec.model = served_name(r);
    rec.arrival_s = rel(r.arrival);
    rec.sent_s = rec.arrival_s;
    rec.done_s = rel(now_) + cfg_.cost.request_overhead_s;
    rec.status = status;
    rec.error_kind = kind;
    records_.emplace_back(key, std::move(rec));
    last_done_ = std::max(last_done_, now_);
  }

  void arrive(uint32_t key) {
    auto& r = requests_[key];
    core_->ledger().note_demand(r.model, 1, now_);
    const bool drop_late = cfg_.drop_late_deadline_ms > 0 && r.measured;
    auto e = disp_->admit(r.model, key, now_, drop_late ? cfg_.drop_late_deadline_ms : 0,
                          r.max_tokens, drop_late, r.prompt_len);
    if (e.refused) {
      fail(key, 429, "http_429");
      return;
    }
    carry_out(std::move(e));
  }

  /// Carries out the dispatch core's effects, as the model manager does: failures are
  /// answered, leases given back, batches computed, new batches ask for leases (here the
  /// residency core answers at once), ticks armed.
  void carry_out(sched::dispatch_effects e) {
    if (e.gpulets_changed) ++replans_;
    // Every failure is a 503, as the runtime answers them (no_kv_room is
    // out_of_device_memory, also a 503).
    for (auto& f : e.failures) fail(f.row.key, 503, "http_503");
    for (auto& r : e.kv_returns) carry_out(core_->kv_return(r.model, r.blocks, now_));
    for (auto& r : e.releases) {
      // One that ended before it ran gives its adapters back too; batch_done erased the
      // rest.
      if (auto i = batches_.find(r.batch); i != batches_.end()) {
        auto adapters = std::move(i->second.adapters);
        batches_.erase(i);
        for (auto a : adapters) carry_out(core_->release(a, now_));
      }
      carry_out(core_->release(r.model, now_));
    }
    for (auto& s : e.started) {
      auto& b = batches_.at(s.id);
      b.rows = std::move(s.rows);
      b.taken.assign(b.rows.size(), b.dispatched);
      b.joined.assign(b.rows.size(), false);
      b.left.clear();
      for (auto& row : b.rows) b.left.push_back(requests_[row.key].max_tokens);
      push(run_step(b, std::max(s.start, adapters_ready(b)), s.plan.tokens()),
           event_kind::step_done, s.id);
    }
    for (auto& f : e.formed) {
      batch b;
      b.model = f.model;
      b.rows = std::move(f.rows);
      b.dispatched = now_;
      batches_[f.id] = std::move(b);
      carry_out(core_->acquire(f.model, f.id, now_));
    }
    // The manager's KV asks; the scheduler answers at once here (its round trip is not
    // modelled).
    for (auto& a : e.kv_asks)
      carry_out(core_->kv_reserve(a.model, a.batch, a.want, a.need, a.start, now_));
    for (auto t : e.ticks) push(t, event_kind::tick, 0);
  }

  /// Carries out the residency core's effects, as the swap scheduler does: transfers
  /// start (their copies are queued at once, so compute while loading may lease the model
  /// now), leases are granted, refused batches fail.
  void carry_out(sched::residency_effects e) {
    for (auto v : e.evictions) start_transfer(v, false);
    for (auto m : e.loads) {
      start_transfer(m, true);
      auto s = core_->load_started(m, now_);
      e.grants.insert(e.grants.end(), s.grants.begin(), s.grants.end());
    }
    for (auto& g : e.grants) lease(g);
    if (!e.kv_grants.empty())
      for (size_t d = 0; d < core_->ledger().device_count(); ++d)
        peak_kv_bytes_ = std::max(peak_kv_bytes_, core_->ledger().device(d).kv_bytes);
    for (auto& g : e.kv_grants) {
      auto d = disp_->kv_granted(g.waiter, g.model, g.blocks, g.ceiling, now_);
      if (at_boundary_.erase(g.waiter) > 0)
        boundary(g.waiter, std::move(d));
      else
        carry_out(std::move(d));
    }
    for (auto& f : e.failures) {
      if (auto a = adapter_waiters_.find(f.waiter); a != adapter_waiters_.end()) {
        auto [id, adapter] = a->second;
        adapter_waiters_.erase(a);
        adapter_answered(id, adapter, false);
        continue;
      }
      auto i = batches_.find(f.waiter);
      if (i == batches_.end()) continue;
      for (auto& r : i->second.rows) fail(r.key, 503, "http_503");
      batches_.erase(i);
      carry_out(disp_->lease_failed(f.waiter, now_));
    }
  }

  /// A batch got its lease; the reply reaches the manager a round trip later. Then, as the
  /// manager does, it leases its rows' adapters before the dispatch core hears of it.
  void lease(const sched::lease_grant& g) {
    if (auto a = adapter_waiters_.find(g.waiter); a != adapter_waiters_.end()) {
      auto [id, adapter] = a->second;
      adapter_waiters_.erase(a);
      adapter_answered(id, adapter, true);
      return;
    }
    auto& b = batches_.at(g.waiter);
    auto& l = core_->ledger();
    b.swapped = g.loaded;
    b.leased = now_ + sched::from_seconds(cfg_.cost.lease_overhead_s);
    sched::lease_info info;
    info.leased_at = b.leased;
    info.loading = l.model(g.model).state == model_state::loading;
    info.load_left_s = l.load_left_seconds(g.model, now_);
    info.load_estimate_s = l.load_seconds(g.model);
    // The manager's view of residency, as a granted lease tells it (only when it changed).
    if (synced_epoch_ != l.residency_epoch()) {
      synced_epoch_ = l.residency_epoch();
      std::vector<uint32_t> resident;
      for (model_id o = 0; o < l.model_count(); ++o)
        if (l.state_of(o) == model_state::resident) resident.push_back(o);
      info.resident = std::move(resident);
    }
    auto id = g.waiter;
    lease_adapters(id, b.rows, [this, id, info] { carry_out(disp_->leased(id, info, now_)); });
  }

  /// Leases the adapters of `rows` that batch `id` does not hold yet, then runs `then`
  /// (at once when there are none).
  void lease_adapters(sched::batch_id id, const std::vector<sched::queued_entry>& rows,
                      std::function<void()> then) {
    auto& b = batches_.at(id);
    std::set<uint32_t> wanted;
    for (auto& row : rows) {
      auto a = requests_[row.key].adapter;
      if (a != request::no_adapter &&
          std::find(b.adapters.begin(), b.adapters.end(), a) == b.adapters.end())
        wanted.insert(a);
    }
    if (wanted.empty()) return then();
    b.asking = rows;
    b.adapters_asked = wanted.size();
    b.after_adapters = std::move(then);
    for (auto a : wanted) {
      auto w = next_adapter_waiter_++;
      adapter_waiters_[w] = {id, a};
      carry_out(core_->acquire(a, w, now_));
    }
  }

  /// An adapter lease of batch `id` was granted (ok) or refused: a refused one's rows fail
  /// (503, as the runtime's refusals do) and leave the batch.
  void adapter_answered(sched::batch_id id, uint32_t adapter, bool ok) {
    auto i = batches_.find(id);
    if (i == batches_.end()) {
      if (ok) carry_out(core_->release(adapter, now_));
      return;
    }
    auto& b = i->second;
    if (ok) {
      b.adapters.push_back(adapter);
    } else {
      // The rows that asked for it (the batch's first rows, or joiners): the dispatch core
      // drops a batch's first rows as cancelled; joiners join nothing (prefill_joiners).
      for (auto& row : b.asking)
        if (requests_[row.key].adapter == adapter) {
          fail(row.key, 503, "http_503");
          disp_->cancel(id, row.key);
        }
    }
    if (--b.adapters_asked > 0) return;
    auto then = std::move(b.after_adapters);
    b.after_adapters = nullptr;
    then();
  }

  /// When the bytes of every adapter batch `b` holds are on its devices.
  time_point adapters_ready(const batch& b) const {
    time_point t{};
    for (auto a : b.adapters)
      for (auto& st : stage_loads_[a]) t = std::max(t, st.to);
    return t;
  }

  void start_transfer(model_id m, bool load) {
    auto longest = transfer(cfg_, m, load, now_, stage_loads_[m], traffic_,
                            now_ >= origin_ ? &swaps_ : nullptr, rel(now_));
    push(now_ + sched::from_seconds(longest), load ? event_kind::load_done : event_kind::evict_done,
         m);
  }

  /// When one forward step of `tokens` tokens started at `start` ends (sim_steps.cpp).
  time_point run_step(batch& b, time_point start, int64_t tokens) {
    auto t = step_end({cfg_, *disp_, lanes_, device_free_}, b.model, stage_loads_[b.model], start,
                      tokens, b.compute_s);
    ++b.steps;
    return t;
  }

  /// Row `i` of a batch is answered now.
  void answer(const batch& b, size_t i) {
    auto& r = requests_[b.rows[i].key];
    last_done_ = std::max(last_done_, now_);
    if (!r.measured) return;
    workload::request_record rec;
    rec.model = served_name(r);
    rec.arrival_s = rel(r.arrival);
    rec.sent_s = rec.arrival_s;
    rec.done_s = rel(now_) + cfg_.cost.request_overhead_s;
    rec.status = 200;
    rec.swapped = b.swapped && !b.joined[i];
    rec.queue_ms = sched::seconds_between(r.arrival, b.taken[i]) * 1e3;
    rec.load_ms = b.joined[i] ? 0 : sched::seconds_between(b.dispatched, b.leased) * 1e3;
    rec.compute_ms = b.compute_s * 1e3;
    records_.emplace_back(b.rows[i].key, std::move(rec));
  }

  /// A step of a batch ended: every row it ran has one more token; rows that are done
  /// are answered and leave; at the boundary queued requests may join (their prefill is
  /// the next step), else the rest decode on, or the batch ends.
  void step_done(sched::batch_id id) {
    auto it = batches_.find(id);
    if (it == batches_.end()) return;
    auto& b = it->second;
    if (b.chunk_step) {
      // A chunk of the joiners' prompts: the running rows' step comes next (the
      // manager's join_rows).
      b.chunk_step = false;
      push(run_step(b, now_, b.next.tokens()), event_kind::step_done, id);
      return;
    }
    const bool join_step = !b.joining.empty();
    const auto joiners = std::move(b.joining);
    b.joining.clear();
    if (join_step) {
      for (auto& row : joiners) {
        b.rows.push_back(row);
        b.taken.push_back(b.joining_since);
        b.left.push_back(requests_[row.key].max_tokens - 1);
        b.joined.push_back(true);
      }
    } else {
      for (auto& l : b.left) --l;
    }
    b.keep_rows([&](size_t i) {
      if (b.left[i] > 0) return true;
      answer(b, i);
      return false;
    });
    // With every row done the batch ends, unless a chunked join under way is to join it
    // (the manager's run_step): its boundary then runs the rest of the join at once.
    if (b.rows.empty() && b.chunking != 0) {
      boundary(id, disp_->step_boundary(id, {}, now_));
      return;
    }
    if (b.rows.empty()) {
      end_batch(id, false);
      return;
    }
    // After a join's prefill the batch decodes (the manager's join_rows), the joiners that
    // went on in its plan; the next boundary may take more.
    if (join_step) {
      for (auto& row : joiners)
        if (std::any_of(b.rows.begin(), b.rows.end(), [&](auto& r) { return r.key == row.key; }))
          b.next.rows.push_back(sched::decode_row(row, 1));
      push(run_step(b, now_, b.next.tokens()), event_kind::step_done, id);
      return;
    }
    std::vector<uint64_t> going;
    for (auto& row : b.rows) going.push_back(row.key);
    boundary(id, disp_->step_boundary(id, going, now_));
  }

  /// A running batch ends: its rows are all answered, or with `stuck` (a step boundary that
  /// neither stepped nor waited, sched::boundary_stuck) its rows still running fail as the
  /// manager fails them: invalid_state, which the HTTP layer answers with 409.
  void end_batch(sched::batch_id id, bool stuck) {
    auto it = batches_.find(id);
    if (it == batches_.end()) return;
    auto compute_s = it->second.compute_s;
    auto steps = it->second.steps;
    if (stuck) {
      for (auto& r : it->second.rows) fail(r.key, 409, "http_409");
      for (auto& r : it->second.joining) fail(r.key, 409, "http_409");
    }
    auto adapters = std::move(it->second.adapters);
    batches_.erase(it);
    for (auto a : adapters) carry_out(core_->release(a, now_));
    carry_out(disp_->batch_done(id, now_, !stuck, compute_s, steps));
  }

  /// A step boundary's decisions for batch `id`: preempted rows go back to the queue (the
  /// dispatch core requeued them with their progress), rows that can never fit fail, the
  /// next step runs now, or after a KV ask's answer.
  void boundary(sched::batch_id id, sched::dispatch_effects e) {
    auto it = batches_.find(id);
    if (it == batches_.end()) {
      carry_out(std::move(e));
      return;
    }
    auto& b = it->second;
    // The rows that leave: preempted ones requeued as the core rewrote them (the request's
    // prompt and max_tokens are the queued row's), failed ones answered by carry_out.
    auto leavers = sched::leavers_at(e, id);
    for (auto& [key, row] : leavers.preempted) {
      ++preemptions_;
      requests_[key].prompt_len = row.prompt_tokens;
      requests_[key].max_tokens = row.steps;
    }
    b.keep_rows([&](size_t i) { return !leavers.leaves(b.rows[i].key); });
    // Adapters whose rows are done (or left) go back before any joiner asks for room, as
    // the manager gives them back.
    std::set<uint32_t> used;
    for (auto& row : b.rows) used.insert(requests_[row.key].adapter);
    for (auto& j : e.joins)
      for (auto& row : j.rows) used.insert(requests_[row.key].adapter);
    std::vector<uint32_t> kept, unused;
    for (auto a : b.adapters) (used.count(a) > 0 ? kept : unused).push_back(a);
    b.adapters = std::move(kept);
    // (Releasing may start other batches, which moves this one's entry.)
    for (auto a : unused) carry_out(core_->release(a, now_));
    auto joins = std::move(e.joins);
    // Here the residency core answers a KV ask at once: the batch must be known to wait
    // before the ask is carried out.
    auto& bn = batches_.at(id);
    auto next = sched::next_at_boundary(e, id, !bn.rows.empty() || !joins.empty());
    for (auto& p : e.plans)
      if (p.batch == id) bn.next = std::move(p);
    if (next == sched::boundary_next::wait) at_boundary_.insert(id);
    carry_out(std::move(e));
    if (next == sched::boundary_next::wait) return;
    if (next != sched::boundary_next::step) {
      end_batch(id, next == sched::boundary_next::stuck);
      return;
    }
    auto& bb = batches_.at(id);
    if (joins.empty()) {
      push(run_step(bb, now_, bb.next.tokens()), event_kind::step_done, id);
      return;
    }
    // The joiners' prefill, as its own step (the manager's join_rows), whole or a chunk,
    // once their adapters are leased.
    auto plan = joins.front();
    auto rows = plan.rows;
    lease_adapters(id, rows, [this, id, plan]() mutable { prefill_joiners(id, std::move(plan)); });
  }

  void prefill_joiners(sched::batch_id id, sched::join_plan plan) {
    auto& bb = batches_.at(id);
    // Joiners whose adapter was refused are answered: they join nothing.
    plan.rows.erase(std::remove_if(plan.rows.begin(), plan.rows.end(),
                                   [&](auto& row) { return failed_.count(row.key) > 0; }),
                    plan.rows.end());
    const auto tokens = plan.step.tokens();
    // The joiners left the queue at their first chunk.
    if (bb.chunking != plan.id) bb.joining_since = now_;
    if (plan.partial()) {
      bb.chunking = plan.id;
      bb.chunk_step = true;
    } else {
      bb.chunking = 0;
      bb.joining = std::move(plan.rows);
    }
    push(run_step(bb, std::max(now_, adapters_ready(bb)), tokens), event_kind::step_done, id);
  }

  const sim_config& cfg_;
  const workload::schedule& s_;
  /// The decisions (sched/): residency and who waits; queues, leases, runs and ticks.
  std::unique_ptr<sched::residency> core_;
  std::unique_ptr<sched::dispatcher> disp_;
  /// When each compute lane is free again (device * lanes_ + lane).
  std::vector<time_point> device_free_;
  size_t lanes_ = 1;
  std::vector<std::vector<stage_load>> stage_loads_;
  std::vector<model_id> model_of_;
  std::vector<request> requests_;
  size_t first_measured_ = 0;
  size_t next_arrival_ = 0;
  std::unordered_map<sched::batch_id, batch> batches_;
  /// Batches whose step boundary waits for a KV ask's answer.
  std::set<sched::batch_id> at_boundary_;
  uint64_t preemptions_ = 0;
  uint64_t replans_ = 0;
  /// Requests answered with an error (each once).
  std::set<uint64_t> failed_;
  /// Adapter leases asked for, by their waiter number (apart from the batches' own): the
  /// batch and the adapter.
  std::unordered_map<sched::waiter_id, std::pair<sched::batch_id, uint32_t>> adapter_waiters_;
  sched::waiter_id next_adapter_waiter_ = sched::waiter_id{1} << 62;
  uint64_t peak_kv_bytes_ = 0;
  std::priority_queue<event, std::vector<event>, std::greater<event>> heap_;
  uint64_t seq_ = 0;
  uint64_t events_ = 0;
  time_point now_{};
  time_point origin_{};
  time_point last_done_{};
  std::optional<uint64_t> synced_epoch_;
  std::vector<std::pair<size_t, workload::request_record>> records_;
  std::vector<workload::swap_event> swaps_;
  std::vector<workload::device_traffic> traffic_;
};

}  // namespace

caf::expected<sim_result> run(const sim_config& cfg, const workload::schedule& s) {
  simulator sim{cfg, s};
  if (auto e = sim.init()) return e;
  return sim.run();
}

}  // namespace computron::sim
