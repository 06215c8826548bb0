#include "sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <set>

namespace computron::sim {

using sched::model_id;
using sched::model_state;
using sched::time_point;

cost_model profile_a100_pcie4() {
  cost_model c;
  c.link_efficiency = 25.0 / 32.0;  // ~25 GB/s practical of PCIe 4 x16's 32
  c.load_overhead_s = 0.001;
  c.evict_s = 0.00005;
  c.stage_overhead_s = 0.0002;
  c.request_overhead_s = 0.001;
  c.lease_overhead_s = 0.0001;
  c.tflops = 150.0;
  return c;
}

double load_seconds(const cost_model& c, uint64_t bytes, double gbps) {
  if (gbps <= 0) return c.load_overhead_s;
  return c.load_overhead_s + static_cast<double>(bytes) / (gbps * 1e9 * c.link_efficiency);
}

std::string check(const sim_config& cfg) {
  if (cfg.devices.empty()) return "no devices";
  for (size_t d = 0; d < cfg.devices.size(); ++d) {
    if (cfg.devices[d].capacity_bytes <= cfg.workspace_bytes)
      return "device " + std::to_string(d) + " has no room beside its workspace";
    if (!(cfg.devices[d].link_gbps > 0) || !std::isfinite(cfg.devices[d].link_gbps))
      return "device " + std::to_string(d) + " needs a positive link_gbps";
  }
  std::set<std::string> names;
  for (auto& m : cfg.models) {
    if (!names.insert(m.name).second) return "model " + m.name + " is named twice";
    if (m.tp < 1 || m.pp < 1 || m.devices.size() != static_cast<size_t>(m.tp * m.pp) ||
        m.shard_bytes.size() != m.devices.size())
      return "model " + m.name + " needs tp x pp devices and a size per shard";
    if (!(m.step_s >= 0) || !(m.step_per_token_s >= 0))
      return "model " + m.name + " has a negative compute time";
    if (m.layers < 1) return "model " + m.name + " needs at least one layer per stage";
  }
  auto& c = cfg.cost;
  for (double x : {c.link_efficiency, c.load_overhead_s, c.evict_s, c.stage_overhead_s,
                   c.request_overhead_s, c.lease_overhead_s})
    if (!(x >= 0) || !std::isfinite(x)) return "cost model values must be finite and >= 0";
  if (!(c.link_efficiency > 0) || c.link_efficiency > 1) return "link_efficiency must be in (0, 1]";
  if (cfg.prompt_len < 1 || cfg.max_tokens < 1) return "prompt_len and max_tokens must be >= 1";
  return {};
}

namespace {

enum class event_kind : uint8_t { tick, load_done, evict_done, compute_done };

struct event {
  time_point at;
  uint64_t seq;
  event_kind kind;
  uint32_t a;
  bool operator>(const event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

struct request {
  time_point arrival{};
  uint32_t model = 0;
  int64_t prompt_len = 0;
  int64_t max_tokens = 0;
  bool measured = true;
};

struct batch {
  uint32_t model = 0;
  std::vector<sched::queued_entry> rows;
  time_point dispatched{};
  time_point leased{};
  int64_t steps = 1;
  bool swapped = false;
  /// Leased while its model loaded, and what the load still took then (nominal): it
  /// starts when the rest takes about its first stage (sched::overlap_start).
  bool loading = false;
  double load_left_s = 0;
  double compute_s = 0;
};

/// A load's bytes in flight, per pipeline stage: they flow from `from` and the stage's
/// slowest shard is complete at `to`.
struct stage_load {
  time_point from{};
  time_point to{};
  /// The stage's largest shard.
  uint64_t bytes = 0;
};

class simulator {
 public:
  simulator(const sim_config& cfg, const workload::schedule& s) : cfg_(cfg), s_(s) {}

  std::string init() {
    if (auto e = check(cfg_); !e.empty()) return e;
    std::vector<sched::device_slot> slots;
    for (auto& d : cfg_.devices)
      slots.push_back({d.capacity_bytes - cfg_.workspace_bytes, d.link_gbps});
    sched::refusal why;
    ledger_ = sched::ledger::make(std::move(slots), cfg_.scheduler, &why);
    if (!ledger_) return why.reason;
    batcher_ = sched::batcher::make(cfg_.batching, &why);
    if (!batcher_) return why.reason;
    gate_ = std::make_unique<sched::device_gate>(cfg_.devices.size());
    for (auto& m : cfg_.models) {
      auto id = ledger_->add(m.name, {m.devices, m.shard_bytes, m.pinned, m.priority}, &why);
      if (!id) return why.reason;
      batcher_->add_model(m.name, m.pp, m.priority);
      // The unhindered load, as the runtime's leases tell its manager.
      batcher_->note_load(*id, ledger_->load_seconds(*id));
      keys_.push_back(gate_->placement_key(m.tp, m.pp, m.devices));
      stage_loads_.emplace_back(static_cast<size_t>(m.pp), stage_load{});
    }
    // Schedule models by index into cfg.models.
    for (auto& name : s_.models) {
      auto id = ledger_->find(name);
      if (!id) return "the workload names model " + name + ", which the config lacks";
      model_of_.push_back(*id);
    }
    waiting_.resize(cfg_.models.size());
    held_.resize(cfg_.models.size());
    traffic_.resize(cfg_.devices.size());
    device_free_.assign(cfg_.devices.size(), time_point{});
    for (size_t d = 0; d < traffic_.size(); ++d) traffic_[d].device = std::to_string(d);
    return {};
  }

  sim_result run() {
    // Warm-up requests (one per model, each alone) first; the arrivals start after.
    double offset_s = 0;
    if (cfg_.warm_up) {
      for (uint32_t m = 0; m < cfg_.models.size(); ++m) {
        requests_.push_back({at(offset_s), m, cfg_.prompt_len, cfg_.max_tokens, false});
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
      requests_.push_back(r);
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
    for (sched::model_id m = 0; m < ledger_->model_count(); ++m) {
      out.prefetches += ledger_->model(m).prefetches;
      out.prefetch_hits += ledger_->model(m).prefetch_hits;
    }
    return out;
  }

 private:
  static time_point at(double s) { return time_point{} + sched::from_seconds(s); }
  static double seconds(time_point t) { return sched::seconds_between(time_point{}, t); }
  double rel(time_point t) const { return sched::seconds_between(origin_, t); }

  void push(time_point t, event_kind k, uint32_t a) { heap_.push({t, seq_++, k, a}); }

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
          ticks_.erase(ticks_.begin(), ticks_.upper_bound(now_));
          try_run();
          dispatch();
          break;
        case event_kind::load_done:
          load_done(e.a);
          break;
        case event_kind::evict_done:
          ledger_->evict_done(e.a);
          pump();
          break;
        case event_kind::compute_done:
          compute_done(e.a);
          break;
      }
    }
  }

  void fail(uint32_t key, int status, const char* kind) {
    auto& r = requests_[key];
    if (!r.measured) return;
    workload::request_record rec;
    rec.model = cfg_.models[r.model].name;
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
    ledger_->note_demand(r.model, 1, now_);
    const bool drop_late = cfg_.drop_late_deadline_ms > 0 && r.measured;
    if (batcher_->admit(r.model, key, now_, drop_late ? cfg_.drop_late_deadline_ms : 0, nullptr,
                        r.max_tokens, drop_late)) {
      fail(key, 429, "http_429");
      return;
    }
    dispatch();
  }

  /// A pass at `t` (the manager's arm_tick): skipped when one is armed between now and
  /// then, which runs first and arms again what is still due later.
  void arm_tick(time_point t) {
    t = std::max(t, now_);
    if (auto i = ticks_.lower_bound(now_); i != ticks_.end() && *i <= t) return;
    ticks_.insert(t);
    push(t + std::chrono::microseconds(100), event_kind::tick, 0);
  }

  void dispatch() {
    auto d = batcher_->dispatch(now_);
    for (auto& [m, e] : d.expired) fail(static_cast<uint32_t>(e.key), 503, "http_503");
    for (auto& [m, e] : d.dropped) fail(static_cast<uint32_t>(e.key), 503, "http_503");
    for (auto& plan : d.batches) {
      batch b;
      b.model = plan.model;
      b.rows = std::move(plan.rows);
      b.dispatched = now_;
      auto id = static_cast<uint32_t>(batches_.size());
      if (!free_batches_.empty()) {
        auto reuse = free_batches_.back();
        free_batches_.pop_back();
        batches_[reuse] = std::move(b);
        id = reuse;
      } else {
        batches_.push_back(std::move(b));
      }
      start_batch(id);
    }
    if (d.next_tick) arm_tick(*d.next_tick);
  }

  void start_batch(uint32_t id) {
    auto m = batches_[id].model;
    switch (ledger_->acquire(m, now_)) {
      case sched::acquire_result::granted:
        batches_[id].leased = now_ + sched::from_seconds(cfg_.cost.lease_overhead_s);
        sync_resident();
        runnable_.push_back(id);
        try_run();
        break;
      case sched::acquire_result::wait_load:
        waiting_[m].push_back(id);
        pump();
        break;
      case sched::acquire_result::wait_drain:
        held_[m].push_back(id);
        break;
      case sched::acquire_result::unavailable:
        drop_batch(id, 503, "http_503");
        break;
    }
  }

  /// A batch that never ran: its requests fail, its model may take the next one.
  void drop_batch(uint32_t id, int status, const char* kind) {
    auto& b = batches_[id];
    for (auto& e : b.rows) fail(static_cast<uint32_t>(e.key), status, kind);
    batcher_->batch_ended(b.model);
    batcher_->set_resident(b.model, false);
    free_batches_.push_back(id);
    dispatch();
  }

  void pump() {
    pump_decisions();
    // Batches granted on loading models (compute while loading) run after the pass.
    if (granted_while_loading_) {
      granted_while_loading_ = false;
      try_run();
    }
  }

  void pump_decisions() {
    for (;;) {
      auto d = ledger_->pump(now_);
      if (d.empty()) return;
      for (auto v : d.evictions) start_transfer(v, false);
      for (auto m : d.loads) start_transfer(m, true);
      for (auto& [m, why] : d.refused) {
        auto ws = std::move(waiting_[m]);
        waiting_[m].clear();
        for (auto id : ws) drop_batch(id, 503, "http_503");
      }
      bool again = false;
      for (auto m : d.undrained) {
        auto held = std::move(held_[m]);
        held_[m].clear();
        if (ledger_->model(m).state == model_state::resident) {
          if (!held.empty()) sync_resident();
          for (auto id : held) {
            ledger_->grant(m, now_);
            batches_[id].leased = now_;
            runnable_.push_back(id);
          }
          try_run();
          continue;
        }
        for (auto id : held) waiting_[m].push_back(id);
        ledger_->want(m);
        again = true;
      }
      if (!again) return;
    }
  }

  void start_transfer(model_id m, bool load) {
    auto& sm = cfg_.models[m];
    double longest = 0;
    auto& stages = stage_loads_[m];
    if (load)
      for (auto& st : stages) st = {now_ + sched::from_seconds(cfg_.cost.load_overhead_s), now_, 0};
    for (size_t k = 0; k < sm.devices.size(); ++k) {
      auto d = static_cast<size_t>(sm.devices[k]);
      double secs = load ? load_seconds(cfg_.cost, sm.shard_bytes[k], cfg_.devices[d].link_gbps)
                         : cfg_.cost.evict_s;
      longest = std::max(longest, secs);
      if (load) {
        auto& st = stages[k / static_cast<size_t>(sm.tp)];
        st.to = std::max(st.to, now_ + sched::from_seconds(secs));
        st.bytes = std::max(st.bytes, sm.shard_bytes[k]);
      }
      auto& t = traffic_[d];
      if (load) {
        t.shard_loads += 1;
        t.bytes_loaded += static_cast<double>(sm.shard_bytes[k]);
        t.load_seconds += secs;
      } else {
        t.evictions += 1;
        t.evict_seconds += secs;
      }
      if (now_ >= origin_)
        swaps_.push_back({sm.name, sm.devices[k], load, rel(now_), secs, sm.shard_bytes[k]});
    }
    push(now_ + sched::from_seconds(longest), load ? event_kind::load_done : event_kind::evict_done,
         m);
    // Compute while loading: the copies are queued, the waiting batches start now.
    if (load && ledger_->load_started(m, now_)) grant_waiting(m, true);
  }

  /// The batches waiting for `m`'s load get their leases.
  void grant_waiting(model_id m, bool loading) {
    if (waiting_[m].empty()) return;
    // A lease granted: the manager learns residency from it (lease::resident).
    sync_resident();
    auto ws = std::move(waiting_[m]);
    waiting_[m].clear();
    for (auto id : ws) {
      ledger_->grant(m, now_);
      auto& b = batches_[id];
      b.leased = now_ + (loading ? sched::from_seconds(cfg_.cost.lease_overhead_s)
                                 : time_point::duration{});
      b.swapped = true;
      b.loading = loading;
      b.load_left_s = ledger_->load_left_seconds(m, now_);
      runnable_.push_back(id);
    }
    granted_while_loading_ = true;
  }

  void load_done(model_id m) {
    ledger_->load_done(m, now_);
    auto ws = std::move(waiting_[m]);
    waiting_[m].clear();
    if (!ws.empty()) sync_resident();
    for (auto id : ws) {
      ledger_->grant(m, now_);
      batches_[id].leased = now_;
      batches_[id].swapped = true;
      runnable_.push_back(id);
    }
    pump();
    try_run();
  }

  void try_run() {
    auto pass = gate_->begin_pass();
    std::deque<uint32_t> still;
    bool freed = false;
    while (!runnable_.empty()) {
      auto id = runnable_.front();
      runnable_.pop_front();
      auto& b = batches_[id];
      auto& sm = cfg_.models[b.model];
      if (b.loading) {
        // As the manager: not before the rest of the load takes about its first stage.
        auto at =
            sched::overlap_start(b.leased, b.load_left_s, batcher_->step_seconds(b.model), sm.pp);
        if (at > now_) {
          arm_tick(at);
          still.push_back(id);
          continue;
        }
      }
      if (!gate_->try_start(pass, keys_[b.model], sm.devices, sm.pp)) {
        still.push_back(id);
        continue;
      }
      auto start = std::max(now_, b.leased);
      std::vector<sched::queued_entry> live;
      for (auto& e : b.rows) {
        if (e.deadline <= start)
          fail(static_cast<uint32_t>(e.key), 503, "http_503");
        else
          live.push_back(e);
      }
      b.rows = std::move(live);
      if (b.rows.empty()) {
        gate_->finish(sm.devices);
        release(b.model);
        batcher_->batch_ended(b.model);
        free_batches_.push_back(id);
        freed = true;
        continue;
      }
      auto end = run_compute(b, start);
      push(end, event_kind::compute_done, id);
    }
    runnable_ = std::move(still);
    if (freed) dispatch();
  }

  /// When a batch started at `start` finishes: every step passes every stage in order,
  /// each device one stage job at a time, whatever its model (the workers' compute lanes;
  /// the gate lets up to pp batches of a placement in, one per stage).
  time_point run_compute(batch& b, time_point start) {
    auto& sm = cfg_.models[b.model];
    int64_t steps = 1, prompt_tokens = 0;
    for (auto& e : b.rows) {
      auto& r = requests_[e.key];
      steps = std::max(steps, r.max_tokens);
      prompt_tokens += r.prompt_len;
    }
    auto& loads = stage_loads_[b.model];
    const auto pp = static_cast<size_t>(sm.pp);
    const auto layers = static_cast<int64_t>(sm.layers);
    auto t = start;
    double busy = 0;
    for (int64_t step = 0; step < steps; ++step) {
      auto tokens = step == 0 ? prompt_tokens : static_cast<int64_t>(b.rows.size());
      double stage_s = (sm.step_s + sm.step_per_token_s * static_cast<double>(tokens)) /
                           static_cast<double>(pp) +
                       cfg_.cost.stage_overhead_s;
      for (size_t k = 0; k < pp; ++k) {
        // A stage runs on its devices' compute lanes, one job at a time per device,
        // whichever model the job is of.
        const auto tp = static_cast<size_t>(sm.tp);
        for (size_t r = 0; r < tp; ++r)
          t = std::max(t, device_free_[static_cast<size_t>(sm.devices[k * tp + r])]);
        if (t >= loads[k].to) {
          t += sched::from_seconds(stage_s);
        } else {
          // The stage's bytes still arrive: layer i waits for the chunk holding the last
          // of the first (i+1)/layers of them.
          auto span = loads[k].to - loads[k].from;
          for (int64_t i = 0; i < layers; ++i) {
            t = std::max(t, loads[k].from + ready_after(span, loads[k].bytes, i + 1, layers));
            t += sched::from_seconds(stage_s / static_cast<double>(layers));
          }
        }
        for (size_t r = 0; r < tp; ++r)
          device_free_[static_cast<size_t>(sm.devices[k * tp + r])] = t;
        busy += stage_s;
      }
    }
    b.compute_s = busy;
    b.steps = steps;
    return t;
  }

  /// When the first `num`/`den` of a shard of `bytes` is on the device, `span` being the
  /// whole copy: at the end of the chunk that holds that byte.
  time_point::duration ready_after(time_point::duration span, uint64_t bytes, int64_t num,
                                   int64_t den) const {
    const auto c = cfg_.chunk_bytes;
    if (c == 0 || bytes == 0) return span * num / den;
    const auto need = bytes * static_cast<uint64_t>(num) / static_cast<uint64_t>(den);
    const auto upto = std::min(bytes, (need + c - 1) / c * c);
    return std::chrono::duration_cast<time_point::duration>(
        span * (static_cast<double>(upto) / static_cast<double>(bytes)));
  }

  /// The manager's view of residency, as a granted lease tells it (only when it changed).
  void sync_resident() {
    if (synced_epoch_ == ledger_->residency_epoch()) return;
    synced_epoch_ = ledger_->residency_epoch();
    for (model_id o = 0; o < ledger_->model_count(); ++o)
      batcher_->set_resident(o, ledger_->state_of(o) == model_state::resident);
  }

  void release(model_id m) {
    bool last = false;
    if (ledger_->release(m, now_, &last) && last) pump();
  }

  void compute_done(uint32_t id) {
    auto& b = batches_[id];
    auto& sm = cfg_.models[b.model];
    gate_->finish(sm.devices);
    release(b.model);
    batcher_->batch_ended(b.model);
    batcher_->note_steps(b.model, b.compute_s, b.steps);
    for (auto& e : b.rows) {
      auto& r = requests_[e.key];
      if (!r.measured) continue;
      workload::request_record rec;
      rec.model = sm.name;
      rec.arrival_s = rel(r.arrival);
      rec.sent_s = rec.arrival_s;
      rec.done_s = rel(now_) + cfg_.cost.request_overhead_s;
      rec.status = 200;
      rec.swapped = b.swapped;
      rec.queue_ms = sched::seconds_between(r.arrival, b.dispatched) * 1e3;
      rec.load_ms = sched::seconds_between(b.dispatched, b.leased) * 1e3;
      rec.compute_ms = b.compute_s * 1e3;
      records_.emplace_back(e.key, std::move(rec));
    }
    last_done_ = std::max(last_done_, now_);
    free_batches_.push_back(id);
    try_run();
    dispatch();
  }

  const sim_config& cfg_;
  const workload::schedule& s_;
  std::unique_ptr<sched::ledger> ledger_;
  std::unique_ptr<sched::batcher> batcher_;
  std::unique_ptr<sched::device_gate> gate_;
  std::vector<uint32_t> keys_;
  /// When each device's compute lane is free again.
  std::vector<time_point> device_free_;
  std::vector<std::vector<stage_load>> stage_loads_;
  std::vector<model_id> model_of_;
  std::vector<request> requests_;
  size_t first_measured_ = 0;
  size_t next_arrival_ = 0;
  std::vector<batch> batches_;
  std::vector<uint32_t> free_batches_;
  std::vector<std::vector<uint32_t>> waiting_;
  std::vector<std::vector<uint32_t>> held_;
  std::deque<uint32_t> runnable_;
  std::priority_queue<event, std::vector<event>, std::greater<event>> heap_;
  uint64_t seq_ = 0;
  uint64_t events_ = 0;
  time_point now_{};
  time_point origin_{};
  time_point last_done_{};
  /// Ticks armed and not yet run. One armed time was not enough: arming an earlier tick
  /// forgot the later one, which the next pass then armed again, and the copies of it
  /// multiplied (millions of ticks at one instant under load).
  std::set<time_point> ticks_;
  bool granted_while_loading_ = false;
  std::optional<uint64_t> synced_epoch_;
  std::vector<std::pair<size_t, workload::request_record>> records_;
  std::vector<workload::swap_event> swaps_;
  std::vector<workload::device_traffic> traffic_;
};

}  // namespace

sim_result run(const sim_config& cfg, const workload::schedule& s, std::string* error) {
  simulator sim{cfg, s};
  if (auto e = sim.init(); !e.empty()) {
    if (error) *error = e;
    return {};
  }
  if (error) error->clear();
  return sim.run();
}

}  // namespace computron::sim
