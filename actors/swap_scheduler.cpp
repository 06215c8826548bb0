#include "actors/swap_scheduler.hpp"

#include <deque>
#include <functional>
#include <map>
#include <set>

#include <caf/all.hpp>

#include "actors/join.hpp"
#include "actors/policies.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/weight_store.hpp"

namespace computron::actors {

namespace {

using gpu::residency;

/// Called once when a load the caller waits for ends: null on success.
using load_waiter = std::function<void(const caf::error*)>;

/// A lease held back while its model drains: called with null and whether the model
/// had to be loaded again, or with an error.
using held_lease = std::function<void(const caf::error*, bool loaded)>;

struct scheduled_model {
  model_placement placement;
  residency state = residency::offloaded;
  uint32_t leases = 0;
  bool pinned = false;
  double last_used_s = 0;
  demand_meter demand;
  uint64_t loads = 0;
  uint64_t evictions = 0;
  uint64_t total_bytes = 0;
  std::vector<load_waiter> waiters;
  std::vector<load_waiter> evict_waiters;
  bool queued = false;
  /// Chosen as a victim for a waiting load but still leased: no new leases until it is
  /// evicted, or the drain is called off. Without this, a model whose batches overlap
  /// (pipelining, steady traffic) would hold its lease forever and starve the load.
  bool draining = false;
  std::vector<held_lease> held;
};

struct device_account {
  scheduler_device dev;
  uint64_t usable_bytes = 0;
  uint64_t used_bytes = 0;
  uint32_t transfers = 0;
};

struct swap_scheduler_state {
  static constexpr const char* name = "swap_scheduler";
  std::vector<device_account> devices;
  std::map<std::string, scheduled_model> models;
  std::deque<std::string> pending;
  std::shared_ptr<eviction_policy> policy;
  swap_scheduler_options opts;
  /// Devices whose node is gone: their models are unavailable until the node is back.
  std::set<int32_t> lost;
};

using sched_pointer = swap_scheduler_actor::stateful_pointer<swap_scheduler_state>;

/// The lost device that keeps `m` from serving, or -1.
int32_t lost_device(const swap_scheduler_state& st, const scheduled_model& m) {
  for (auto d : m.placement.devices)
    if (st.lost.count(d) > 0) return d;
  return -1;
}

caf::error unavailable_error(const scheduled_model& m, int32_t device) {
  return make_error(ec::unavailable, "model " + m.placement.model + " is unavailable: device " +
                                         std::to_string(device) + " is unreachable");
}

residency_report report_of(const swap_scheduler_state& st, const scheduled_model& m) {
  residency_report r;
  r.model = m.placement.model;
  r.state = lost_device(st, m) >= 0 ? std::string{"unavailable"} : gpu::to_string(m.state);
  r.bytes = m.total_bytes;
  r.leases = m.leases;
  r.pinned = m.pinned;
  r.loads = m.loads;
  r.evictions = m.evictions;
  r.demand_per_s = m.demand.rate(now_s());
  r.idle_s = m.leases > 0 ? 0 : m.last_used_s > 0 ? now_s() - m.last_used_s : -1;
  return r;
}

void publish_usage(sched_pointer self) {
  auto& st = self->state;
  size_t resident = 0;
  std::vector<size_t> per_device(st.devices.size(), 0);
  for (auto& [name, m] : st.models) {
    if (m.state != residency::resident) continue;
    ++resident;
    for (auto d : m.placement.devices) ++per_device[static_cast<size_t>(d)];
  }
  for (size_t d = 0; d < st.devices.size(); ++d)
    st.opts.obs->device_usage(static_cast<int32_t>(d), st.devices[d].used_bytes,
                              st.devices[d].usable_bytes, per_device[d]);
  st.opts.obs->resident_models(resident);
}

std::vector<shard_worker_actor> workers_of(sched_pointer self, const scheduled_model& m) {
  std::vector<shard_worker_actor> ws;
  for (auto d : m.placement.devices)
    ws.push_back(self->state.devices[static_cast<size_t>(d)].dev.worker);
  return ws;
}

void finish_waiters(std::vector<load_waiter>& ws, const caf::error* err) {
  auto taken = std::move(ws);
  ws.clear();
  for (auto& w : taken) w(err);
}

void pump(sched_pointer self);
void want_loaded(sched_pointer self, const std::string& name, load_waiter w);

/// Gives up on a resident model one of whose devices is gone: what it holds on the
/// others is freed, and it counts as offloaded (it loads again once all are back).
void forget(sched_pointer self, const std::string& name) {
  auto& st = self->state;
  auto& m = st.models.at(name);
  for (auto& w : workers_of(self, m))
    self->request(w, st.opts.load_timeout, evict_atom_v, name)
        .then([](transfer_report&) {}, [](caf::error&) {});
  for (size_t k = 0; k < m.placement.devices.size(); ++k)
    st.devices[static_cast<size_t>(m.placement.devices[k])].used_bytes -= m.placement.bytes[k];
  m.state = residency::offloaded;
  log::warn("model {} lost its residency: a device's node is gone", name);
  publish_usage(self);
}

void start_evict(sched_pointer self, const std::string& name) {
  auto& m = self->state.models.at(name);
  m.state = residency::evicting;
  auto t0 = now_s();
  log::debug("evicting {}", name);
  fan_out_all<transfer_report>(
      self, workers_of(self, m), self->state.opts.load_timeout,
      [=](std::vector<transfer_report> reports) {
        auto& st = self->state;
        auto& m = st.models.at(name);
        for (size_t i = 0; i < m.placement.devices.size(); ++i)
          st.devices[static_cast<size_t>(m.placement.devices[i])].used_bytes -=
              m.placement.bytes[i];
        m.state = residency::offloaded;
        ++m.evictions;
        for (auto& r : reports)
          st.opts.obs->transfer_done(name, r.device, false, r.bytes, t0, r.seconds);
        publish_usage(self);
        finish_waiters(m.evict_waiters, nullptr);
        pump(self);
      },
      [=](caf::error err, size_t i) {
        auto& m = self->state.models.at(name);
        log::error("evicting {} failed on device {}: {}", name, m.placement.devices[i],
                   render(err));
        if (lost_device(self->state, m) >= 0) {
          // Its node is gone, and its copy with it.
          forget(self, name);
          finish_waiters(m.evict_waiters, nullptr);
          pump(self);
          return;
        }
        // The device copy is in an unknown state: keep accounting it as resident.
        m.state = residency::resident;
        auto e = make_error(ec::device_error, "evicting " + name + " failed: " + render(err));
        finish_waiters(m.evict_waiters, &e);
      },
      evict_atom_v, name);
}

void start_load(sched_pointer self, const std::string& name) {
  auto& st = self->state;
  auto& m = st.models.at(name);
  m.state = residency::loading;
  for (size_t i = 0; i < m.placement.devices.size(); ++i) {
    auto& d = st.devices[static_cast<size_t>(m.placement.devices[i])];
    d.used_bytes += m.placement.bytes[i];
    ++d.transfers;
  }
  publish_usage(self);
  auto t0 = now_s();
  log::debug("loading {} ({} bytes over {} devices)", name, m.total_bytes,
             m.placement.devices.size());
  auto end_transfers = [=] {
    auto& st = self->state;
    for (auto d : st.models.at(name).placement.devices)
      --st.devices[static_cast<size_t>(d)].transfers;
  };
  fan_out_all<transfer_report>(
      self, workers_of(self, m), st.opts.load_timeout,
      [=](std::vector<transfer_report> reports) {
        end_transfers();
        auto& st = self->state;
        auto& m = st.models.at(name);
        m.state = residency::resident;
        ++m.loads;
        m.last_used_s = now_s();
        for (auto& r : reports)
          st.opts.obs->transfer_done(name, r.device, true, r.bytes, t0, r.seconds);
        publish_usage(self);
        finish_waiters(m.waiters, nullptr);
        pump(self);
      },
      [=](caf::error err, size_t i) {
        end_transfers();
        auto& st = self->state;
        auto& m = st.models.at(name);
        auto device = m.placement.devices[i];
        log::warn("loading {} failed on device {}: {}", name, device, render(err));
        // Free whatever arrived elsewhere; each worker runs the evict after its load.
        for (auto& w : workers_of(self, m))
          self->request(w, st.opts.load_timeout, evict_atom_v, name)
              .then([](transfer_report&) {}, [](caf::error&) {});
        for (size_t k = 0; k < m.placement.devices.size(); ++k)
          st.devices[static_cast<size_t>(m.placement.devices[k])].used_bytes -=
              m.placement.bytes[k];
        m.state = residency::offloaded;
        publish_usage(self);
        auto code = is(err, ec::out_of_device_memory) ? ec::out_of_device_memory
                    : is(err, ec::unavailable)        ? ec::unavailable
                                                      : ec::device_error;
        auto e = make_error(code, "loading " + name + " failed on device " +
                                      std::to_string(device) + ": " + render(err));
        finish_waiters(m.waiters, &e);
        pump(self);
      },
      load_atom_v, name);
}

/// What keeps a model from ever fitting, or an empty string.
std::string never_fits(sched_pointer self, const scheduled_model& m) {
  auto& st = self->state;
  for (size_t i = 0; i < m.placement.devices.size(); ++i) {
    auto d = static_cast<size_t>(m.placement.devices[i]);
    uint64_t pinned = 0;
    for (auto& [name, other] : st.models)
      if (&other != &m && other.pinned && other.state != residency::offloaded) {
        for (size_t k = 0; k < other.placement.devices.size(); ++k)
          if (static_cast<size_t>(other.placement.devices[k]) == d)
            pinned += other.placement.bytes[k];
      }
    if (m.placement.bytes[i] + pinned > st.devices[d].usable_bytes)
      return "model " + m.placement.model + " needs " + std::to_string(m.placement.bytes[i]) +
             " bytes on device " + std::to_string(d) + ", which has " +
             std::to_string(st.devices[d].usable_bytes) + " usable bytes" +
             (pinned > 0 ? " of which pinned models hold " + std::to_string(pinned) : "");
  }
  return {};
}

enum class plan { start, wait, evicting };

/// Frees room for `m` if it can: evicts victims chosen by the policy when together they
/// cover every short device; otherwise waits (leases end, loads finish).
plan make_room(sched_pointer self, scheduled_model& m) {
  auto& st = self->state;
  std::map<size_t, int64_t> short_bytes;
  for (size_t i = 0; i < m.placement.devices.size(); ++i) {
    auto d = static_cast<size_t>(m.placement.devices[i]);
    auto& acc = st.devices[d];
    auto free_bytes = static_cast<int64_t>(acc.usable_bytes) - static_cast<int64_t>(acc.used_bytes);
    auto need = static_cast<int64_t>(m.placement.bytes[i]) - free_bytes;
    if (need > 0) short_bytes[d] = need;
  }
  if (short_bytes.empty()) return plan::start;
  // Evictions already under way count as freed.
  for (auto& [name, other] : st.models)
    if (other.state == residency::evicting)
      for (size_t k = 0; k < other.placement.devices.size(); ++k) {
        auto it = short_bytes.find(static_cast<size_t>(other.placement.devices[k]));
        if (it != short_bytes.end()) it->second -= static_cast<int64_t>(other.placement.bytes[k]);
      }
  bool covered = true;
  for (auto& [d, b] : short_bytes) covered = covered && b <= 0;
  if (covered) return plan::evicting;
  // Victims by the policy among the lease-free models first (they can go now); when
  // they do not cover, more among the leased ones, and then all of them drain (no new
  // leases) so that this load gets its turn.
  auto now = now_s();
  std::vector<std::string> victims;
  auto choose = [&](bool leased) {
    std::vector<victim_candidate> cands;
    for (auto& [name, other] : st.models) {
      if (&other == &m || other.state != residency::resident || other.pinned ||
          (other.leases > 0) != leased)
        continue;
      uint64_t freed = 0;
      double slowest = 0;
      for (size_t k = 0; k < other.placement.devices.size(); ++k) {
        auto d = static_cast<size_t>(other.placement.devices[k]);
        if (short_bytes.count(d) > 0) freed += other.placement.bytes[k];
        auto gbps = st.devices[d].dev.link_gbps > 0 ? st.devices[d].dev.link_gbps : 10.0;
        slowest = std::max(slowest, static_cast<double>(other.placement.bytes[k]) / (gbps * 1e9));
      }
      if (freed > 0)
        cands.push_back({name, freed, now - other.last_used_s, slowest, other.demand.rate(now)});
    }
    for (auto i : st.policy->order(cands)) {
      auto& v = st.models.at(cands[i].model);
      bool helps = false;
      for (size_t k = 0; k < v.placement.devices.size(); ++k) {
        auto it = short_bytes.find(static_cast<size_t>(v.placement.devices[k]));
        if (it != short_bytes.end() && it->second > 0) {
          helps = true;
          it->second -= static_cast<int64_t>(v.placement.bytes[k]);
        }
      }
      if (helps) victims.push_back(cands[i].model);
      covered = true;
      for (auto& [d, b] : short_bytes) covered = covered && b <= 0;
      if (covered) return;
    }
  };
  choose(false);
  if (covered) {
    for (auto& v : victims) start_evict(self, v);
    return plan::evicting;
  }
  choose(true);
  if (covered)
    for (auto& v : victims) st.models.at(v).draining = true;
  return plan::wait;
}

/// Starts what can start among the models waiting to load, oldest first. A model that
/// has to wait reserves its devices, so later models cannot take the room it waits for.
void pump(sched_pointer self) {
  auto& st = self->state;
  // Drains are decided afresh by this pass; leases held back for models no longer
  // draining are handed out at its end.
  for (auto& [name, m] : st.models) m.draining = false;
  std::set<int32_t> reserved;
  std::deque<std::string> still;
  while (!st.pending.empty()) {
    auto name = std::move(st.pending.front());
    st.pending.pop_front();
    auto& m = st.models.at(name);
    if (m.state == residency::resident || m.state == residency::loading) {
      m.queued = false;
      continue;
    }
    if (m.waiters.empty()) {
      m.queued = false;  // every waiter gave up
      continue;
    }
    if (auto d = lost_device(st, m); d >= 0) {
      m.queued = false;
      auto e = unavailable_error(m, d);
      finish_waiters(m.waiters, &e);
      continue;
    }
    if (auto why = never_fits(self, m); !why.empty()) {
      m.queued = false;
      auto e = make_error(ec::out_of_device_memory, why);
      finish_waiters(m.waiters, &e);
      continue;
    }
    bool blocked = m.state == residency::evicting;
    for (auto d : m.placement.devices)
      blocked = blocked || reserved.count(d) > 0 ||
                st.devices[static_cast<size_t>(d)].transfers >= st.opts.max_transfers_per_link;
    if (!blocked && make_room(self, m) == plan::start) {
      m.queued = false;
      start_load(self, name);
      continue;
    }
    for (auto d : m.placement.devices) reserved.insert(d);
    still.push_back(std::move(name));
  }
  st.pending = std::move(still);
  std::vector<std::pair<std::string, std::vector<held_lease>>> released;
  for (auto& [name, m] : st.models)
    if (!m.draining && !m.held.empty()) released.emplace_back(name, std::move(m.held));
  for (auto& [name, held] : released) {
    auto& m = st.models.at(name);
    m.held.clear();
    if (m.state == residency::resident) {
      for (auto& h : held) h(nullptr, false);
    } else {
      // Evicted meanwhile: these requests wait for it to come back, like any other.
      for (auto& h : held) want_loaded(self, name, [h](const caf::error* err) { h(err, true); });
    }
  }
}

void want_loaded(sched_pointer self, const std::string& name, load_waiter w) {
  auto& m = self->state.models.at(name);
  m.waiters.push_back(std::move(w));
  if (m.state == residency::loading || m.queued) return;
  m.queued = true;
  self->state.pending.push_back(name);
  pump(self);
}

swap_scheduler_actor::behavior_type swap_scheduler(sched_pointer self,
                                                   std::vector<scheduler_device> devices,
                                                   swap_scheduler_options opts,
                                                   std::shared_ptr<eviction_policy> policy) {
  auto& st = self->state;
  for (auto& d : devices) st.devices.push_back({d, d.capacity_bytes - opts.workspace_bytes, 0, 0});
  st.opts = std::move(opts);
  st.policy = std::move(policy);
  publish_usage(self);
  auto find = [=](const std::string& name) -> scheduled_model* {
    auto i = self->state.models.find(name);
    return i == self->state.models.end() ? nullptr : &i->second;
  };
  auto unknown = [](const std::string& name) {
    return make_error(ec::unknown_model, "no model named " + name);
  };
  return {
      [=](register_atom, model_placement& p) -> caf::result<bool> {
        auto& st = self->state;
        if (p.devices.empty() || p.devices.size() != p.bytes.size())
          return make_error(ec::invalid_configuration, "placement of " + p.model + " is malformed");
        for (auto d : p.devices)
          if (d < 0 || static_cast<size_t>(d) >= st.devices.size())
            return make_error(ec::invalid_configuration,
                              "placement of " + p.model + " names device " + std::to_string(d));
        if (auto i = st.models.find(p.model); i != st.models.end()) {
          if (i->second.placement.devices == p.devices && i->second.placement.bytes == p.bytes)
            return true;
          return make_error(ec::invalid_state,
                            "model " + p.model + " is registered with another placement");
        }
        auto& m = st.models[p.model];
        m.placement = p;
        m.pinned = p.pinned;
        for (auto b : p.bytes) m.total_bytes += b;
        return true;
      },
      [=](acquire_atom, std::string& name) -> caf::result<lease> {
        auto m = find(name);
        if (!m) return unknown(name);
        if (auto d = lost_device(self->state, *m); d >= 0) return unavailable_error(*m, d);
        if (m->state == residency::resident && !m->draining) {
          ++m->leases;
          m->last_used_s = now_s();
          return lease{name, false, 0};
        }
        auto rp = self->make_response_promise<lease>();
        auto t0 = now_s();
        held_lease grant = [=](const caf::error* err, bool loaded) mutable {
          if (err) {
            rp.deliver(*err);
            return;
          }
          auto& m = self->state.models.at(name);
          ++m.leases;
          m.last_used_s = now_s();
          rp.deliver(lease{name, loaded, (now_s() - t0) * 1e3});
        };
        if (m->state == residency::resident)  // draining: wait for the verdict
          m->held.push_back(std::move(grant));
        else
          want_loaded(self, name, [grant](const caf::error* err) mutable { grant(err, true); });
        return rp;
      },
      [=](release_atom, std::string& name) {
        auto m = find(name);
        if (!m || m->leases == 0) {
          log::warn("release of {} without a lease", name);
          return;
        }
        --m->leases;
        m->last_used_s = now_s();
        if (m->leases == 0) pump(self);
      },
      [=](load_atom, std::string& name) -> caf::result<residency_report> {
        auto m = find(name);
        if (!m) return unknown(name);
        if (auto d = lost_device(self->state, *m); d >= 0) return unavailable_error(*m, d);
        if (m->state == residency::resident) return report_of(self->state, *m);
        auto rp = self->make_response_promise<residency_report>();
        want_loaded(self, name, [=](const caf::error* err) mutable {
          if (err)
            rp.deliver(*err);
          else
            rp.deliver(report_of(self->state, self->state.models.at(name)));
        });
        return rp;
      },
      [=](unload_atom, std::string& name) -> caf::result<residency_report> {
        auto m = find(name);
        if (!m) return unknown(name);
        if (m->state == residency::offloaded) return report_of(self->state, *m);
        if (m->leases > 0)
          return make_error(ec::invalid_state, "model " + name + " has " +
                                                   std::to_string(m->leases) +
                                                   " batches in flight; retry when they end");
        if (m->state == residency::loading)
          return make_error(ec::invalid_state,
                            "model " + name + " is loading; retry when it is resident");
        auto rp = self->make_response_promise<residency_report>();
        m->evict_waiters.push_back([=](const caf::error* err) mutable {
          if (err)
            rp.deliver(*err);
          else
            rp.deliver(report_of(self->state, self->state.models.at(name)));
        });
        if (m->state == residency::resident) start_evict(self, name);
        return rp;
      },
      [=](pin_atom, std::string& name, bool pinned) -> caf::result<residency_report> {
        auto m = find(name);
        if (!m) return unknown(name);
        m->pinned = pinned;
        if (!pinned) pump(self);
        return report_of(self->state, *m);
      },
      [=](demand_atom, std::string& name, uint32_t n) {
        if (auto m = find(name)) m->demand.note(n, now_s());
      },
      [=](status_atom) {
        std::vector<residency_report> out;
        for (auto& [name, m] : self->state.models) out.push_back(report_of(self->state, m));
        return out;
      },
      [=](lost_atom, std::vector<int32_t>& devs) {
        auto& st = self->state;
        for (auto d : devs) st.lost.insert(d);
        std::vector<std::string> gone;
        for (auto& [name, m] : st.models)
          if (m.state == residency::resident && lost_device(st, m) >= 0) gone.push_back(name);
        for (auto& name : gone) forget(self, name);
        // Loads and evictions in flight fail by themselves (the guards answer at once).
        pump(self);
      },
      [=](policy_atom, std::string& name) -> caf::result<std::string> {
        auto& st = self->state;
        if (name.empty() || name == st.opts.policy) return st.opts.policy;
        auto p = make_eviction_policy(name);
        if (!p) return p.error();
        st.policy = std::shared_ptr<eviction_policy>(std::move(*p));
        st.opts.policy = name;
        log::info("eviction policy is now {}", name);
        return name;
      },
      [=](found_atom, std::vector<int32_t>& devs) {
        auto& st = self->state;
        for (auto d : devs) st.lost.erase(d);
        pump(self);
      },
      [=](report_atom) {
        auto& st = self->state;
        caf::settings out;
        out["policy"] = caf::config_value{st.opts.policy};
        caf::config_value::list models;
        for (auto& [name, m] : st.models) {
          auto r = report_of(st, m);
          caf::settings x;
          x["model"] = caf::config_value{name};
          x["state"] = caf::config_value{r.state};
          x["bytes"] = caf::config_value{static_cast<int64_t>(r.bytes)};
          x["leases"] = caf::config_value{static_cast<int64_t>(r.leases)};
          x["pinned"] = caf::config_value{r.pinned};
          x["loads"] = caf::config_value{static_cast<int64_t>(r.loads)};
          x["evictions"] = caf::config_value{static_cast<int64_t>(r.evictions)};
          models.emplace_back(std::move(x));
        }
        out["models"] = caf::config_value{std::move(models)};
        caf::config_value::list devices;
        for (size_t d = 0; d < st.devices.size(); ++d) {
          caf::settings x;
          x["device"] = caf::config_value{static_cast<int64_t>(d)};
          x["usable-bytes"] = caf::config_value{static_cast<int64_t>(st.devices[d].usable_bytes)};
          x["used-bytes"] = caf::config_value{static_cast<int64_t>(st.devices[d].used_bytes)};
          x["transfers"] = caf::config_value{static_cast<int64_t>(st.devices[d].transfers)};
          x["lost"] = caf::config_value{st.lost.count(static_cast<int32_t>(d)) > 0};
          devices.emplace_back(std::move(x));
        }
        out["devices"] = caf::config_value{std::move(devices)};
        out["pending-loads"] = caf::config_value{static_cast<int64_t>(st.pending.size())};
        return out;
      },
      [=](devices_atom) {
        std::vector<device_usage> out;
        auto& st = self->state;
        for (size_t d = 0; d < st.devices.size(); ++d)
          out.push_back({static_cast<int32_t>(d), st.devices[d].usable_bytes,
                         st.devices[d].used_bytes, st.devices[d].transfers});
        return out;
      },
  };
}

}  // namespace

caf::expected<swap_scheduler_actor> spawn_swap_scheduler(caf::actor_system& sys,
                                                         std::vector<scheduler_device> devices,
                                                         swap_scheduler_options opts) {
  if (devices.empty()) return make_error(ec::invalid_configuration, "scheduler without devices");
  auto policy = make_eviction_policy(opts.policy);
  if (!policy) return policy.error();
  if (opts.max_transfers_per_link == 0)
    return make_error(ec::invalid_configuration, "max_transfers_per_link must be at least 1");
  for (auto& d : devices)
    if (opts.workspace_bytes >= d.capacity_bytes)
      return make_error(ec::invalid_configuration,
                        "workspace of " + std::to_string(opts.workspace_bytes) +
                            " bytes leaves nothing of a " + std::to_string(d.capacity_bytes) +
                            "-byte device");
  if (!opts.obs) opts.obs = null_observer();
  return sys.spawn(swap_scheduler, std::move(devices), std::move(opts),
                   std::shared_ptr<eviction_policy>(std::move(*policy)));
}

}  // namespace computron::actors
