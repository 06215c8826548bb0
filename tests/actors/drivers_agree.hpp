#pragma once

// The scaffolding of the drivers-agree tests (drivers_agree_test.cpp and
// drivers_agree_kv_test.cpp): scenarios both drivers take, the simulator's run, the
// actors' run with paced fake workers, and the comparison. See drivers_agree_test.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "actors/engine.hpp"
#include "actors/model_manager.hpp"
#include "actors/registry.hpp"
#include "actors/swap_scheduler.hpp"
#include "common/error.hpp"
#include "sim/simulator.hpp"
#include "tests/support/deterministic.hpp"
#include "tests/support/kv_toy.hpp"

namespace computron::testing::drivers {

using namespace computron::actors;
using namespace std::chrono_literals;

using clock_point = caf::actor_clock::time_point;

inline constexpr uint64_t mb = 1000000;  // decimal: 1 MB at 1 GB/s is exactly 1 ms

// ---------------------------------------------------------------------------------------
// The scenario, in terms both drivers take.

struct model_def {
  std::string name;
  int32_t pp = 1;
  std::vector<int32_t> devices{};
  uint64_t shard_bytes = 0;
  double step_ms = 0;
  /// A LoRA adapter's base (its devices and pp are the base's; its step is the base's).
  std::string base{};
};

struct arrival_def {
  double at_ms = 0;
  std::string model;
  /// Tokens to generate: above 1 the batch decodes step by step, and with continuous
  /// batching later requests join it at its step boundaries.
  int64_t max_tokens = 1;
  /// Prompt tokens (the KV blocks a request needs).
  int64_t prompt_len = 3;
};

struct scenario {
  std::vector<uint64_t> capacity_bytes{};
  double link_gbps = 1.0;
  double evict_ms = 1.0;
  std::vector<model_def> models{};
  std::vector<arrival_def> arrivals{};
  sched::batching_options batching{};
  bool compute_while_loading = false;
  /// Above 0: every model's shards have KV blocks of this size in the ledger.
  uint64_t kv_block_bytes = 0;
  /// Gpu-lets (their interference should be 1: the paced workers slow by share only).
  sched::gpulet_config gpulets{};
};

/// One shard's load or eviction: when it started (worker side / simulator start) or
/// ended (observer / simulator start plus the transfer's slowest shard).
struct transfer {
  std::string model;
  int32_t device = 0;
  bool load = true;
  double at_s = 0;
};

/// A request as its client saw it: the HTTP status it would get, whether it waited for
/// a load, and when its answer came.
struct outcome {
  bool answered = false;
  int status = 0;
  bool swapped = false;
  double done_s = 0;
  std::string error;
};

struct effects {
  std::vector<transfer> starts{};
  std::vector<transfer> ends{};
  std::vector<outcome> outcomes{};
  /// Rows preempted for KV room (the simulator's count).
  uint64_t preemptions = 0;
};

/// One decision's transfer: a model's shards, all loading (or evicting) from one instant.
struct transfer_group {
  std::string what;  // "evict p@0,1"
  double at_s = 0;
};

/// Starts grouped by decision, in the order the decisions were taken. Within an instant a
/// pass may start several (two victims, say): the simulator lists each one's shards
/// together, while the runtime's workers note them as each worker runs, interleaved
/// (worker 0's two evictions before worker 1's one). That interleaving is no effect.
inline std::vector<transfer_group> decisions_of(const std::vector<transfer>& ts) {
  struct open_group {
    std::string model;
    bool load;
    double at_s;
    std::vector<int32_t> devices;
  };
  std::vector<open_group> gs;
  for (auto& t : ts) {
    auto g = std::find_if(gs.begin(), gs.end(), [&](auto& x) {
      return x.model == t.model && x.load == t.load && std::abs(x.at_s - t.at_s) < 1e-7;
    });
    if (g == gs.end()) {
      gs.push_back({t.model, t.load, t.at_s, {}});
      g = gs.end() - 1;
    }
    g->devices.push_back(t.device);
  }
  std::vector<transfer_group> out;
  for (auto& g : gs) {
    std::sort(g.devices.begin(), g.devices.end());
    std::string what = (g.load ? "load " : "evict ") + g.model + "@";
    for (size_t i = 0; i < g.devices.size(); ++i)
      what += (i ? "," : "") + std::to_string(g.devices[i]);
    out.push_back({what, g.at_s});
  }
  return out;
}

/// Ends in time order; ends at one instant (two evictions of one pass) in name order, as
/// neither driver defines which of them is reported first.
inline std::vector<transfer_group> ends_of(const std::vector<transfer>& ts) {
  std::vector<std::pair<long long, transfer_group>> keyed;
  for (auto& t : ts)
    keyed.push_back(
        {std::llround(t.at_s * 1e6),
         {(t.load ? "load " : "evict ") + t.model + "@" + std::to_string(t.device), t.at_s}});
  std::sort(keyed.begin(), keyed.end(), [](auto& x, auto& y) {
    return x.first != y.first ? x.first < y.first : x.second.what < y.second.what;
  });
  std::vector<transfer_group> out;
  for (auto& k : keyed) out.push_back(k.second);
  return out;
}

inline std::vector<std::string> names_of(const std::vector<transfer_group>& gs) {
  std::vector<std::string> out;
  for (auto& g : gs) out.push_back(g.what);
  return out;
}

inline std::string render_groups(const std::vector<transfer_group>& gs) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(4);
  for (auto& g : gs) out << "  " << std::setw(14) << std::left << g.what << g.at_s * 1e3 << " ms\n";
  return out.str();
}

inline std::string render_outcomes(const scenario& s, const std::vector<outcome>& os) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(4);
  for (size_t i = 0; i < os.size(); ++i) {
    out << "#" << i << " " << s.arrivals[i].model << " at " << s.arrivals[i].at_ms << " ms: ";
    if (!os[i].answered) {
      out << "no answer\n";
      continue;
    }
    out << os[i].status << (os[i].swapped ? " swapped" : "") << " done " << os[i].done_s * 1e3
        << " ms";
    if (!os[i].error.empty()) out << " (" << os[i].error << ")";
    out << "\n";
  }
  return out.str();
}

// ---------------------------------------------------------------------------------------
// The simulator's side.

inline effects run_simulator(const scenario& s) {
  sim::sim_config cfg;
  for (auto c : s.capacity_bytes) cfg.devices.push_back({c, s.link_gbps});
  cfg.scheduler.compute_while_loading = s.compute_while_loading;
  cfg.batching = s.batching;
  cfg.gpulets = s.gpulets;
  // Every overhead zero: the paced workers have none.
  cfg.cost = {1.0, 0, s.evict_ms / 1e3, 0, 0, 0};
  cfg.prompt_len = 3;
  cfg.max_tokens = 1;
  workload::schedule w;
  for (auto& m : s.models) {
    sim::sim_model sm;
    sm.name = m.name;
    sm.pp = m.pp;
    sm.devices = m.devices;
    sm.shard_bytes.assign(m.devices.size(), m.shard_bytes);
    sm.step_s = m.step_ms / 1e3;
    sm.base = m.base;
    if (s.kv_block_bytes > 0 && m.base.empty())
      sm.kv_block_bytes.assign(m.devices.size(), s.kv_block_bytes);
    cfg.models.push_back(sm);
    w.models.push_back(m.name);
  }
  for (auto& a : s.arrivals) {
    auto i = std::find(w.models.begin(), w.models.end(), a.model) - w.models.begin();
    w.arrivals.push_back({a.at_ms / 1e3, static_cast<uint32_t>(i), a.prompt_len, a.max_tokens});
  }
  w.duration_s = s.arrivals.back().at_ms / 1e3 + 1;
  auto ran = sim::run(cfg, w);
  if (!ran) FAIL(render(ran.error()));
  auto& r = *ran;
  effects out;
  out.preemptions = r.preemptions;
  for (auto& e : r.swaps) out.starts.push_back({e.model, e.device, e.load, e.start_s});
  // A transfer (all shards of one model's load or eviction, started together) ends when its
  // slowest shard does; the runtime's scheduler reports all its shards then, in shard order.
  std::vector<std::pair<double, size_t>> order;
  for (size_t i = 0; i < r.swaps.size(); ++i) {
    double longest = 0;
    for (auto& o : r.swaps)
      if (o.model == r.swaps[i].model && o.load == r.swaps[i].load &&
          o.start_s == r.swaps[i].start_s)
        longest = std::max(longest, o.seconds);
    order.emplace_back(r.swaps[i].start_s + longest, i);
  }
  std::stable_sort(order.begin(), order.end(), [](auto& x, auto& y) { return x.first < y.first; });
  for (auto& [at, i] : order)
    out.ends.push_back({r.swaps[i].model, r.swaps[i].device, r.swaps[i].load, at});
  for (auto& rec : r.records) {
    outcome o;
    o.answered = rec.status != 0;
    o.status = rec.status;
    o.swapped = rec.swapped;
    o.done_s = rec.done_s;
    o.error = rec.error_kind;
    out.outcomes.push_back(o);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// The actors' side: paced fake workers, an observer, one client actor per request.

/// What the paced workers share (every actor runs on the test thread, so plain data).
struct paced_world {
  caf::actor pacer;
  double link_gbps = 1.0;
  caf::timespan evict_time{};
  clock_point origin{};
  /// Per model: bytes of a shard, seconds of a forward step, the device of each stage.
  std::map<std::string, uint64_t> shard_bytes;
  std::map<std::string, double> step_s;
  std::map<std::string, std::map<int32_t, int32_t>> stage_device;
  /// When each shard's current copy is (or was) complete; set when its load starts.
  std::map<std::pair<std::string, int32_t>, clock_point> load_end;
  /// Loads begun (begin_load) whose load_atom has not come yet.
  std::map<std::pair<std::string, int32_t>, bool> begun;
  /// When each compute lane (device, gpu-let) is free (one stage job at a time).
  std::map<std::pair<int32_t, int32_t>, clock_point> lane_free;
  std::vector<transfer> starts;
};

inline double since(const paced_world& w, clock_point t) {
  return std::chrono::duration<double>(t - w.origin).count();
}

/// Answers (caf::timespan) requests after that much virtual time: the paced workers reply
/// through it, since a typed worker cannot send itself a delayed message it does not
/// accept, and a promise is delivered by its owner only.
inline caf::behavior pacer(caf::event_based_actor* self) {
  auto held = std::make_shared<std::map<uint64_t, caf::response_promise>>();
  auto next = std::make_shared<uint64_t>(0);
  return {
      [=](caf::timespan d) {
        auto key = (*next)++;
        (*held)[key] = self->make_response_promise();
        self->delayed_send(self, d, caf::ok_atom_v, key);
        return (*held)[key];
      },
      [=](caf::ok_atom, uint64_t key) {
        auto i = held->find(key);
        if (i == held->end()) return;
        i->second.deliver(true);
        held->erase(i);
      },
  };
}

template <class T>
inline void reply_after(shard_worker_actor::pointer self, paced_world* w, caf::timespan d,
                        caf::typed_response_promise<T> rp, T value) {
  self->request(w->pacer, caf::timespan{24h}, d)
      .then([=](bool) mutable { rp.deliver(std::move(value)); },
            [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
}

inline shard_worker_actor::behavior_type paced_worker(shard_worker_actor::pointer self,
                                                      paced_world* w, int32_t device) {
  auto load_time = [=](const std::string& m) {
    return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(
        static_cast<double>(w->shard_bytes[m]) / (w->link_gbps * 1e9)));
  };
  auto start_load = [=](const std::string& m) {
    auto now = self->clock().now();
    w->starts.push_back({m, device, true, since(*w, now)});
    w->load_end[{m, device}] = now + load_time(m);
  };
  return {
      [=](prepare_atom, shard_spec& s) -> shard_report {
        auto& m = s.model;
        w->shard_bytes[m.name] = m.toy_shard_bytes;
        w->step_s[m.name] = m.toy_compute_ms / 1e3;
        w->stage_device[m.name][s.pp_rank] = device;
        return shard_report{m.name, device, m.toy_shard_bytes, false};
      },
      [=](begin_load_atom, std::string& m) {
        // Compute while loading: the copies are queued now, the batch may start.
        start_load(m);
        w->begun[{m, device}] = true;
        return transfer_report{m, device, 0, 0};
      },
      [=](load_atom, std::string& m) -> caf::result<transfer_report> {
        if (!w->begun[{m, device}]) start_load(m);
        w->begun[{m, device}] = false;
        auto rp = self->make_response_promise<transfer_report>();
        auto left = w->load_end[{m, device}] - self->clock().now();
        auto secs = std::chrono::duration<double>(load_time(m)).count();
        reply_after(self, w, std::max(left, caf::timespan{0}), rp,
                    transfer_report{m, device, w->shard_bytes[m], secs});
        return rp;
      },
      [=](evict_atom, std::string& m) -> caf::result<transfer_report> {
        w->starts.push_back({m, device, false, since(*w, self->clock().now())});
        auto rp = self->make_response_promise<transfer_report>();
        reply_after(self, w, w->evict_time, rp,
                    transfer_report{m, device, w->shard_bytes[m],
                                    std::chrono::duration<double>(w->evict_time).count()});
        return rp;
      },
      [=](unregister_atom, std::string&) { return true; },
      [=](step_atom, step_request& r) -> caf::result<step_result> {
        // Every stage of the chain, as the simulator runs it: on its gpu-let of its
        // device (the whole device without gpu-lets), after the stage's bytes are there,
        // for its part of the step at the gpu-let's share of the device's speed.
        auto& stages = w->stage_device[r.model];
        const double part = w->step_s[r.model] / static_cast<double>(stages.size());
        auto now = self->clock().now();
        auto t = now;
        // Rows with adapters (named at their first step) start once the adapters' bytes
        // are there, as the forward waits for them.
        for (auto& a : r.input.adapters)
          for (auto& [stage, dev] : stages)
            if (auto e = w->load_end.find({a, dev}); !a.empty() && e != w->load_end.end())
              t = std::max(t, e->second);
        for (auto& [stage, dev] : stages) {
          const auto k = static_cast<size_t>(stage);
          const int32_t lane = k < r.lanes.lanes.size() ? r.lanes.lanes[k] : 0;
          const int32_t pct = k < r.lanes.shares.size() ? r.lanes.shares[k] : 100;
          auto& free = w->lane_free[{dev, lane}];
          t = std::max(t, free);
          if (auto e = w->load_end.find({r.model, dev}); e != w->load_end.end())
            t = std::max(t, e->second);
          t += std::chrono::duration_cast<caf::timespan>(
              std::chrono::duration<double>(part * 100.0 / pct));
          free = t;
        }
        auto rows = r.input.rows();
        auto rp = self->make_response_promise<step_result>();
        reply_after(self, w, t - now, rp,
                    step_result{std::vector<int64_t>(rows, 7), w->step_s[r.model] * 1e3});
        return rp;
      },
      [=](cancel_atom, std::string&, uint64_t) { return uint64_t{0}; },
      [=](tick_atom) {},
      [=](devices_atom) { return device_report{}; },
      [=](group_atom, std::string&, int32_t) -> caf::result<std::string> {
        return make_error(ec::invalid_configuration, "paced workers host no groups");
      },
      [=](report_atom) { return caf::settings{}; },
  };
}

/// Notes every shard transfer the scheduler reports done, at the virtual time it does.
class transfer_log final : public observer {
 public:
  transfer_log(caf::scheduler::test_coordinator& s, const paced_world& w) : sched_(s), w_(w) {}
  void transfer_done(const std::string& model, int32_t device, bool load, uint64_t, double,
                     double) override {
    ends.push_back({model, device, load, since(w_, sched_.clock().now())});
  }
  void request_done(const std::string&, const std::string& outcome_name, double) override {
    ++outcomes[outcome_name];
  }
  std::vector<transfer> ends;
  std::map<std::string, int> outcomes;

 private:
  caf::scheduler::test_coordinator& sched_;
  const paced_world& w_;
};

inline int http_status_of(const caf::error& e) {
  // As net/http/replies.cpp maps them (the simulator speaks HTTP statuses).
  if (is(e, ec::overloaded)) return 429;
  if (is(e, ec::deadline_exceeded) || is(e, ec::unavailable) || is(e, ec::out_of_device_memory) ||
      is(e, ec::not_resident))
    return 503;
  return 500;
}

/// One client: sends its request and notes the answer and when it came.
inline caf::behavior client(caf::event_based_actor* self, model_manager_actor manager,
                            infer_request r, std::shared_ptr<std::vector<outcome>> outs, size_t i,
                            const paced_world* w) {
  self->request(manager, caf::timespan{24h}, infer_atom_v, std::move(r))
      .then(
          [=](infer_reply& rep) {
            (*outs)[i] = {true, 200, rep.swapped, since(*w, self->clock().now()), {}};
            self->quit();
          },
          [=](caf::error& e) {
            (*outs)[i] = {true, http_status_of(e), false, since(*w, self->clock().now()),
                          render(e)};
            self->quit();
          });
  return {[](caf::ok_atom) {}};
}

/// The runtime over paced workers. The fixture is the last member: it is destroyed first,
/// and its destructor still runs actors (draining what is pending), which must find the
/// world, the log and the outcomes alive.
struct actors_driver {
  paced_world world;
  std::shared_ptr<transfer_log> log;
  std::shared_ptr<std::vector<outcome>> outcomes = std::make_shared<std::vector<outcome>>();
  deterministic_fixture fx;
  std::vector<shard_worker_actor> workers{};
  swap_scheduler_actor scheduler;
  model_manager_actor manager;
  registry_actor registry;

  ~actors_driver() {
    // Pending delayed replies keep actors alive: end them all, or ~actor_system waits.
    for (auto a : {caf::actor_cast<caf::actor>(registry), caf::actor_cast<caf::actor>(manager),
                   caf::actor_cast<caf::actor>(scheduler), world.pacer})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& wk : workers) caf::anon_send_exit(wk, caf::exit_reason::user_shutdown);
  }

  /// Runs every message and every delayed event due by `until`, then sets the clock
  /// there. Bounded: a protocol that loops forever fails the test instead of hanging it.
  bool run_until(clock_point until) {
    auto& sched = fx.sched;
    for (int guard = 0; guard < 200000; ++guard) {
      sched.run();
      auto& due = sched.clock().schedule();
      if (!due.empty() && due.begin()->first <= until) {
        sched.trigger_timeout();
        continue;
      }
      auto now = sched.clock().now();
      if (now >= until) return true;
      sched.advance_time(until - now);
    }
    return false;
  }

  effects run(const scenario& s) {
    auto& sys = fx.sys;
    world.origin = fx.sched.clock().now();
    world.link_gbps = s.link_gbps;
    world.evict_time = std::chrono::duration_cast<caf::timespan>(
        std::chrono::duration<double, std::milli>(s.evict_ms));
    world.pacer = sys.spawn(pacer);
    log = std::make_shared<transfer_log>(fx.sched, world);
    std::vector<scheduler_device> devs;
    for (size_t d = 0; d < s.capacity_bytes.size(); ++d) {
      workers.push_back(sys.spawn(paced_worker, &world, static_cast<int32_t>(d)));
      devs.push_back({workers.back(), s.capacity_bytes[d], s.link_gbps});
    }
    swap_scheduler_options so;
    so.ledger.compute_while_loading = s.compute_while_loading;
    so.obs = log;
    scheduler = spawn_swap_scheduler(sys, devs, so).value();
    model_manager_options mo;
    mo.batching = s.batching;
    mo.gpulets = s.gpulets;
    mo.obs = log;
    auto engines = torch_free_engines();
    if (s.kv_block_bytes > 0) engines["toy"] = std::make_shared<kv_toy>(s.kv_block_bytes);
    manager = spawn_model_manager(sys, workers, scheduler, engines, mo).value();
    registry = spawn_registry(sys, workers, scheduler, manager, engines, {}).value();
    // Registered in the simulator's order: model ids (and so any tie a policy breaks by
    // id) are the same on both sides.
    for (auto& m : s.models) {
      model_config c;
      c.name = m.name;
      c.kind = "toy";
      c.pp = m.pp;
      c.devices = m.devices;
      c.toy_shard_bytes = m.shard_bytes;
      c.toy_compute_ms = m.step_ms;
      c.base = m.base;
      auto info = fx.ask<model_info>(registry, register_atom_v, c);
      INFO("registering " << m.name);
      REQUIRE(info);
    }
    outcomes->resize(s.arrivals.size());
    for (size_t i = 0; i < s.arrivals.size(); ++i) {
      auto at = world.origin + std::chrono::duration_cast<caf::timespan>(
                                   std::chrono::duration<double, std::milli>(s.arrivals[i].at_ms));
      REQUIRE(run_until(at));
      infer_request r;
      r.model = s.arrivals[i].model;
      r.tokens.assign(static_cast<size_t>(s.arrivals[i].prompt_len), 1);
      r.max_tokens = s.arrivals[i].max_tokens;
      r.id = i + 1;
      sys.spawn(client, manager, r, outcomes, i, &world);
    }
    // Everything ends within seconds of the last arrival; the timeouts that guard the
    // protocol (steps, loads, acquires: minutes) stay far beyond.
    REQUIRE(run_until(fx.sched.clock().now() + 10s));
    effects out;
    out.starts = world.starts;
    out.ends = log->ends;
    out.outcomes = *outcomes;
    return out;
  }
};

/// Runs `s` through both drivers, checks they did the same, and returns what the
/// simulator did.
inline effects check_drivers_agree(const scenario& s) {
  auto simulated = run_simulator(s);
  effects acted;
  {
    actors_driver d;
    acted = d.run(s);
  }
  auto sim_starts = decisions_of(simulated.starts), run_starts = decisions_of(acted.starts);
  auto sim_ends = ends_of(simulated.ends), run_ends = ends_of(acted.ends);
  INFO("simulator transfers started:\n" << render_groups(sim_starts));
  INFO("runtime transfers started (paced workers):\n" << render_groups(run_starts));
  INFO("simulator transfers done:\n" << render_groups(sim_ends));
  INFO("runtime transfers done (observer):\n" << render_groups(run_ends));
  INFO("simulator outcomes:\n" << render_outcomes(s, simulated.outcomes));
  INFO("runtime outcomes:\n" << render_outcomes(s, acted.outcomes));

  // The same transfers, decided in the same order, started at the same virtual times.
  CHECK(names_of(run_starts) == names_of(sim_starts));
  if (run_starts.size() == sim_starts.size())
    for (size_t i = 0; i < run_starts.size(); ++i) {
      INFO("transfer " << i << ": " << sim_starts[i].what);
      CHECK(run_starts[i].at_s == Approx(sim_starts[i].at_s).margin(1e-6));
    }
  // And reported done (the observer, per shard) in the same order, at the same times.
  CHECK(names_of(run_ends) == names_of(sim_ends));
  if (run_ends.size() == sim_ends.size())
    for (size_t i = 0; i < run_ends.size(); ++i) {
      INFO("transfer end " << i << ": " << sim_ends[i].what);
      CHECK(run_ends[i].at_s == Approx(sim_ends[i].at_s).margin(1e-6));
    }

  // Every request: the same status, the same swap flag, answered at the same time.
  REQUIRE(acted.outcomes.size() == simulated.outcomes.size());
  for (size_t i = 0; i < acted.outcomes.size(); ++i) {
    INFO("request #" << i << " (" << s.arrivals[i].model << " at " << s.arrivals[i].at_ms
                     << " ms)");
    REQUIRE(acted.outcomes[i].answered);
    CHECK(acted.outcomes[i].status == simulated.outcomes[i].status);
    CHECK(acted.outcomes[i].swapped == simulated.outcomes[i].swapped);
    CHECK(acted.outcomes[i].done_s == Approx(simulated.outcomes[i].done_s).margin(1e-6));
  }

  return simulated;
}

}  // namespace computron::testing::drivers
