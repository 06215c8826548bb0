#include "actors/swap_scheduler.hpp"

#include <functional>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "sched/ledger.hpp"

namespace computron::actors {

namespace {

using sched::model_id;
using sched::model_state;

/// Called once when a load the caller waits for ends: null on success.
using load_waiter = std::function<void(const caf::error*)>;

/// A lease held back while its model drains: called with null and whether the model
/// had to be loaded again, or with an error.
using held_lease = std::function<void(const caf::error*, bool loaded)>;

/// What the actor keeps beside the ledger: the callers waiting on each model. Lease
/// requests wait apart from explicit loads: with compute while loading they are granted
/// when the load starts, explicit loads only when it is done.
struct model_waiters {
  std::vector<load_waiter> leases;
  std::vector<load_waiter> loads;
  std::vector<load_waiter> evictions;
  std::vector<held_lease> held;
};

struct swap_scheduler_state {
  static constexpr const char* name = "swap_scheduler";
  std::shared_ptr<sched::ledger> ledger;
  std::vector<shard_worker_actor> workers;
  /// Indexed by model id.
  std::vector<model_waiters> waiting;
  swap_scheduler_options opts;
  /// The ledger's residency epoch of the last lease that carried the resident set.
  std::optional<uint64_t> sent_epoch;
};

using sched_pointer = swap_scheduler_actor::stateful_pointer<swap_scheduler_state>;

sched::time_point now(sched_pointer self) {
  return self->clock().now();
}

caf::error to_error(const sched::refusal& r) {
  return make_error(r.code, r.reason);
}

residency_report report_of(sched_pointer self, model_id id) {
  auto& l = *self->state.ledger;
  auto& m = l.model(id);
  auto t = now(self);
  residency_report r;
  r.model = m.name;
  r.state = sched::to_string(l.state_of(id));
  r.bytes = m.total_bytes;
  r.leases = m.leases;
  r.pinned = m.pinned;
  r.loads = m.loads;
  r.evictions = m.evictions;
  r.demand_per_s = m.demand.rate(t);
  r.idle_s = m.leases > 0 ? 0 : m.last_used ? sched::seconds_between(*m.last_used, t) : -1;
  r.reason = l.unavailable_reason(id);
  return r;
}

void publish_usage(sched_pointer self) {
  auto& l = *self->state.ledger;
  size_t resident = 0;
  auto per_device = l.resident_per_device(&resident);
  for (size_t d = 0; d < l.device_count(); ++d)
    self->state.opts.obs->device_usage(static_cast<int32_t>(d), l.device(d).used_bytes,
                                       l.device(d).slot.usable_bytes, per_device[d]);
  self->state.opts.obs->resident_models(resident);
}

std::vector<shard_worker_actor> workers_of(sched_pointer self, model_id id) {
  std::vector<shard_worker_actor> ws;
  for (auto d : self->state.ledger->model(id).where.devices)
    ws.push_back(self->state.workers[static_cast<size_t>(d)]);
  return ws;
}

void finish(std::vector<load_waiter>& ws, const caf::error* err) {
  auto taken = std::move(ws);
  ws.clear();
  for (auto& w : taken) w(err);
}

void note_reports(sched_pointer self, const std::vector<transfer_report>& reports) {
  for (auto& r : reports)
    if (r.largest_free_bytes >= 0)
      self->state.ledger->note_largest_free(static_cast<size_t>(r.device),
                                            static_cast<uint64_t>(r.largest_free_bytes));
}

void pump(sched_pointer self);

/// The models resident now, for lease::resident; empty when the set has not changed since
/// the last lease (every lease goes to the one manager, in order, so it still knows it).
std::vector<std::string> resident_names(sched_pointer self) {
  auto& l = *self->state.ledger;
  std::vector<std::string> out;
  if (self->state.sent_epoch == l.residency_epoch()) return out;
  self->state.sent_epoch = l.residency_epoch();
  for (model_id id = 0; id < l.model_count(); ++id)
    if (!l.model(id).removed && l.state_of(id) == model_state::resident)
      out.push_back(l.model(id).name);
  return out;
}

/// Frees what a model's shards hold on every worker, ignoring the answers (after a failed
/// load, or when a device of the model is gone); each worker runs it after its transfers.
void evict_everywhere(sched_pointer self, model_id id) {
  auto name = self->state.ledger->model(id).name;
  for (auto& w : workers_of(self, id))
    self->request(w, self->state.opts.load_timeout, evict_atom_v, name)
        .then([](transfer_report&) {}, [](caf::error&) {});
}

void start_evict(sched_pointer self, model_id id) {
  auto name = self->state.ledger->model(id).name;
  auto t0 = now_s();
  log::debug("evicting {}", name);
  fan_out_all<transfer_report>(
      self, workers_of(self, id), self->state.opts.load_timeout,
      [=](std::vector<transfer_report> reports) {
        auto& st = self->state;
        st.ledger->evict_done(id);
        note_reports(self, reports);
        for (auto& r : reports)
          st.opts.obs->transfer_done(name, r.device, false, r.bytes, t0, r.seconds);
        publish_usage(self);
        finish(st.waiting[id].evictions, nullptr);
        pump(self);
      },
      [=](caf::error err, size_t i) {
        auto& st = self->state;
        log::error("evicting {} failed on device {}: {}", name,
                   st.ledger->model(id).where.devices[i], render(err));
        if (st.ledger->state_of(id) == model_state::unavailable) {
          // Its node is gone, and its copy with it.
          evict_everywhere(self, id);
          st.ledger->forget(id);
          publish_usage(self);
          finish(st.waiting[id].evictions, nullptr);
          pump(self);
          return;
        }
        // The device copy is in an unknown state: it stays accounted as resident.
        st.ledger->evict_failed(id);
        // The worker's code stays (a device error is a 500, a timed-out request a 503).
        auto e = with_context(err, "evicting " + name + " failed");
        finish(st.waiting[id].evictions, &e);
      },
      evict_atom_v, name);
}

/// A load failed on shard `i` (starting or finishing): whatever arrived elsewhere is
/// freed and everyone waiting for the model hears why.
void load_failed(sched_pointer self, model_id id, const caf::error& err, size_t i) {
  auto& st = self->state;
  auto name = st.ledger->model(id).name;
  auto device = st.ledger->model(id).where.devices[i];
  log::warn("loading {} failed on device {}: {}", name, device, render(err));
  evict_everywhere(self, id);
  st.ledger->load_failed(id);
  publish_usage(self);
  auto code = is(err, ec::out_of_device_memory) ? ec::out_of_device_memory
              : is(err, ec::unavailable)        ? ec::unavailable
                                                : ec::device_error;
  auto e = make_error(
      code, "loading " + name + " failed on device " + std::to_string(device) + ": " + render(err));
  finish(st.waiting[id].leases, &e);
  finish(st.waiting[id].loads, &e);
  pump(self);
}

/// Waits for every shard's copy to arrive (the second half of a load).
void finish_load(sched_pointer self, model_id id, double t0) {
  auto name = self->state.ledger->model(id).name;
  fan_out_all<transfer_report>(
      self, workers_of(self, id), self->state.opts.load_timeout,
      [=](std::vector<transfer_report> reports) {
        auto& st = self->state;
        st.ledger->load_done(id, now(self));
        note_reports(self, reports);
        for (auto& r : reports)
          st.opts.obs->transfer_done(name, r.device, true, r.bytes, t0, r.seconds);
        publish_usage(self);
        finish(st.waiting[id].leases, nullptr);
        finish(st.waiting[id].loads, nullptr);
        pump(self);
      },
      [=](caf::error err, size_t i) { load_failed(self, id, err, i); }, load_atom_v, name);
}

void start_load(sched_pointer self, model_id id) {
  auto& m = self->state.ledger->model(id);
  auto name = m.name;
  publish_usage(self);
  auto t0 = now_s();
  log::debug("loading {} ({} bytes over {} devices)", name, m.total_bytes, m.where.devices.size());
  if (!self->state.ledger->options().compute_while_loading) {
    finish_load(self, id, t0);
    return;
  }
  // First every shard queues its copies; then the batches waiting for the model start
  // (each layer waits for its own bytes) while the copies run.
  fan_out_all<transfer_report>(
      self, workers_of(self, id), self->state.opts.load_timeout,
      [=](std::vector<transfer_report>) {
        auto& st = self->state;
        if (st.ledger->load_started(id, now(self))) finish(st.waiting[id].leases, nullptr);
        finish_load(self, id, t0);
      },
      [=](caf::error err, size_t i) { load_failed(self, id, err, i); }, begin_load_atom_v, name);
}

/// Registers a caller waiting for `id`'s load (an explicit load).
void wait_load(sched_pointer self, model_id id, load_waiter w) {
  self->state.waiting[id].loads.push_back(std::move(w));
}

/// Registers a lease request waiting for `id`'s load (or its start).
void wait_lease(sched_pointer self, model_id id, load_waiter w) {
  self->state.waiting[id].leases.push_back(std::move(w));
}

/// Runs the ledger's pass and carries out what it decided, until nothing more follows
/// (a drain called off may queue another load).
void pump(sched_pointer self) {
  auto& st = self->state;
  for (;;) {
    auto d = st.ledger->pump(now(self));
    if (d.empty()) return;
    for (auto id : d.evictions) start_evict(self, id);
    for (auto id : d.loads) start_load(self, id);
    for (auto& [id, why] : d.refused) {
      auto e = to_error(why);
      finish(st.waiting[id].leases, &e);
      finish(st.waiting[id].loads, &e);
    }
    bool again = false;
    for (auto id : d.undrained) {
      auto held = std::move(st.waiting[id].held);
      st.waiting[id].held.clear();
      if (st.ledger->model(id).state == model_state::resident) {
        for (auto& h : held) {
          st.ledger->grant(id, now(self));
          h(nullptr, false);
        }
        continue;
      }
      // Evicted meanwhile: these requests wait for it to come back, like any other.
      for (auto& h : held) wait_lease(self, id, [h](const caf::error* err) { h(err, true); });
      if (!st.ledger->want(id)) {
        auto e = make_error(ec::unavailable, st.ledger->unavailable_reason(id));
        finish(st.waiting[id].leases, &e);
      }
      again = true;
    }
    if (!again) return;
  }
}

swap_scheduler_actor::behavior_type swap_scheduler(sched_pointer self,
                                                   std::shared_ptr<sched::ledger> ledger,
                                                   std::vector<shard_worker_actor> workers,
                                                   swap_scheduler_options opts) {
  auto& st = self->state;
  st.ledger = std::move(ledger);
  st.workers = std::move(workers);
  st.opts = std::move(opts);
  publish_usage(self);
  auto find = [=](const std::string& name) { return self->state.ledger->find(name); };
  auto unknown = [](const std::string& name) {
    return make_error(ec::unknown_model, "no model named " + name);
  };
  auto unavailable = [=](model_id id) {
    return make_error(ec::unavailable, self->state.ledger->unavailable_reason(id));
  };
  return {
      [=](register_atom, model_placement& p) -> caf::result<bool> {
        auto& st = self->state;
        sched::placement where{p.devices, p.bytes, p.pinned, p.priority};
        // A model larger than its devices is refused here, not at every request.
        std::vector<uint64_t> usable;
        for (size_t d = 0; d < st.ledger->device_count(); ++d)
          usable.push_back(st.ledger->device(d).slot.usable_bytes);
        if (auto no = sched::check_fits(p.model, where, usable)) return to_error(*no);
        sched::refusal why;
        auto id = st.ledger->add(p.model, where, &why);
        if (!id) return to_error(why);
        if (st.waiting.size() <= *id) st.waiting.resize(*id + 1);
        return true;
      },
      [=](acquire_atom, std::string& name) -> caf::result<lease> {
        auto id = find(name);
        if (!id) return unknown(name);
        auto& st = self->state;
        auto t0 = now(self);
        auto result = st.ledger->acquire(*id, t0);
        if (result == sched::acquire_result::granted)
          return lease{name,
                       false,
                       0,
                       st.ledger->load_seconds(*id) * 1e3,
                       resident_names(self),
                       st.ledger->model(*id).state == model_state::loading,
                       st.ledger->load_left_seconds(*id, t0) * 1e3};
        if (result == sched::acquire_result::unavailable) return unavailable(*id);
        auto rp = self->make_response_promise<lease>();
        auto m = *id;
        held_lease grant = [=](const caf::error* err, bool loaded) mutable {
          if (err) {
            rp.deliver(*err);
            return;
          }
          auto& l = *self->state.ledger;
          if (loaded) l.grant(m, now(self));
          rp.deliver(lease{name, loaded, sched::seconds_between(t0, now(self)) * 1e3,
                           l.load_seconds(m) * 1e3, resident_names(self),
                           l.model(m).state == model_state::loading,
                           l.load_left_seconds(m, now(self)) * 1e3});
        };
        if (result == sched::acquire_result::wait_drain) {
          st.waiting[m].held.push_back(std::move(grant));
        } else {
          wait_lease(self, m, [grant](const caf::error* err) mutable { grant(err, true); });
          pump(self);
        }
        return rp;
      },
      [=](release_atom, std::string& name) {
        auto id = find(name);
        bool last = false;
        if (!id || !self->state.ledger->release(*id, now(self), &last)) {
          log::warn("release of {} without a lease", name);
          return;
        }
        if (last) pump(self);
      },
      [=](load_atom, std::string& name) -> caf::result<residency_report> {
        auto id = find(name);
        if (!id) return unknown(name);
        auto& st = self->state;
        auto state = st.ledger->state_of(*id);
        if (state == model_state::unavailable) return unavailable(*id);
        if (state == model_state::resident) return report_of(self, *id);
        auto rp = self->make_response_promise<residency_report>();
        auto m = *id;
        wait_load(self, m, [=](const caf::error* err) mutable {
          if (err)
            rp.deliver(*err);
          else
            rp.deliver(report_of(self, m));
        });
        st.ledger->want(m);
        pump(self);
        return rp;
      },
      [=](unload_atom, std::string& name) -> caf::result<residency_report> {
        auto id = find(name);
        if (!id) return unknown(name);
        auto& st = self->state;
        if (st.ledger->model(*id).state == model_state::offloaded) return report_of(self, *id);
        bool start = false;
        if (auto why = st.ledger->begin_unload(*id, &start)) return to_error(*why);
        auto rp = self->make_response_promise<residency_report>();
        auto m = *id;
        st.waiting[m].evictions.push_back([=](const caf::error* err) mutable {
          if (err)
            rp.deliver(*err);
          else
            rp.deliver(report_of(self, m));
        });
        if (start) start_evict(self, m);
        return rp;
      },
      [=](unregister_atom, std::string& name) -> caf::result<bool> {
        auto id = find(name);
        if (!id) return unknown(name);
        if (auto why = self->state.ledger->remove(*id)) return to_error(*why);
        self->state.waiting[*id] = {};
        return true;
      },
      [=](pin_atom, std::string& name, bool pinned) -> caf::result<residency_report> {
        auto id = find(name);
        if (!id) return unknown(name);
        self->state.ledger->pin(*id, pinned);
        if (!pinned) pump(self);
        return report_of(self, *id);
      },
      [=](demand_atom, std::string& name, uint32_t n) {
        if (auto id = find(name)) self->state.ledger->note_demand(*id, n, now(self));
      },
      [=](status_atom) {
        std::vector<residency_report> out;
        for (model_id id = 0; id < self->state.ledger->model_count(); ++id)
          if (!self->state.ledger->model(id).removed) out.push_back(report_of(self, id));
        return out;
      },
      [=](lost_atom, std::vector<int32_t>& devs) {
        auto& st = self->state;
        for (auto id : st.ledger->lose(devs)) {
          // What it holds on the other devices is freed; it loads again once all are back.
          evict_everywhere(self, id);
          st.ledger->forget(id);
          log::warn("model {} lost its residency: a device's node is gone",
                    st.ledger->model(id).name);
        }
        publish_usage(self);
        // Loads and evictions in flight fail by themselves (the guards answer at once).
        pump(self);
      },
      [=](policy_atom, std::string& name) -> caf::result<std::string> {
        auto& st = self->state;
        if (name.empty() || name == st.ledger->options().policy) return st.ledger->options().policy;
        if (auto why = st.ledger->set_policy(name)) return to_error(*why);
        st.opts.ledger.policy = name;
        log::info("eviction policy is now {}", name);
        return name;
      },
      [=](found_atom, std::vector<int32_t>& devs) {
        self->state.ledger->find_devices(devs);
        pump(self);
      },
      [=](report_atom) {
        auto& l = *self->state.ledger;
        caf::settings out;
        out["policy"] = caf::config_value{l.options().policy};
        out["prefetch"] = caf::config_value{l.options().prefetch};
        caf::config_value::list models;
        for (model_id id = 0; id < l.model_count(); ++id) {
          if (l.model(id).removed) continue;
          auto r = report_of(self, id);
          caf::settings x;
          x["model"] = caf::config_value{r.model};
          x["state"] = caf::config_value{r.state};
          x["bytes"] = caf::config_value{static_cast<int64_t>(r.bytes)};
          x["leases"] = caf::config_value{static_cast<int64_t>(r.leases)};
          x["pinned"] = caf::config_value{r.pinned};
          x["loads"] = caf::config_value{static_cast<int64_t>(r.loads)};
          x["evictions"] = caf::config_value{static_cast<int64_t>(r.evictions)};
          auto& e = l.model(id);
          x["prefetches"] = caf::config_value{static_cast<int64_t>(e.prefetches)};
          x["prefetch-hits"] = caf::config_value{static_cast<int64_t>(e.prefetch_hits)};
          models.emplace_back(std::move(x));
        }
        out["models"] = caf::config_value{std::move(models)};
        caf::config_value::list devices;
        for (size_t d = 0; d < l.device_count(); ++d) {
          auto& a = l.device(d);
          caf::settings x;
          x["device"] = caf::config_value{static_cast<int64_t>(d)};
          x["usable-bytes"] = caf::config_value{static_cast<int64_t>(a.slot.usable_bytes)};
          x["used-bytes"] = caf::config_value{static_cast<int64_t>(a.used_bytes)};
          x["transfers"] = caf::config_value{static_cast<int64_t>(a.transfers)};
          x["lost"] = caf::config_value{a.lost};
          if (a.largest_free_bytes)
            x["largest-free-bytes"] =
                caf::config_value{static_cast<int64_t>(*a.largest_free_bytes)};
          devices.emplace_back(std::move(x));
        }
        out["devices"] = caf::config_value{std::move(devices)};
        out["pending-loads"] = caf::config_value{static_cast<int64_t>(l.pending_loads())};
        return out;
      },
      [=](devices_atom) {
        std::vector<device_usage> out;
        auto& l = *self->state.ledger;
        for (size_t d = 0; d < l.device_count(); ++d)
          out.push_back({static_cast<int32_t>(d), l.device(d).slot.usable_bytes,
                         l.device(d).used_bytes, l.device(d).transfers});
        return out;
      },
  };
}

}  // namespace

caf::expected<swap_scheduler_actor> spawn_swap_scheduler(caf::actor_system& sys,
                                                         std::vector<scheduler_device> devices,
                                                         swap_scheduler_options opts) {
  if (devices.empty()) return make_error(ec::invalid_configuration, "scheduler without devices");
  std::vector<sched::device_slot> slots;
  std::vector<shard_worker_actor> workers;
  for (auto& d : devices) {
    if (opts.workspace_bytes >= d.capacity_bytes)
      return make_error(ec::invalid_configuration,
                        "workspace of " + std::to_string(opts.workspace_bytes) +
                            " bytes leaves nothing of a " + std::to_string(d.capacity_bytes) +
                            "-byte device");
    slots.push_back({d.capacity_bytes - opts.workspace_bytes, d.link_gbps});
    workers.push_back(d.worker);
  }
  sched::refusal why;
  auto ledger = sched::ledger::make(std::move(slots), opts.ledger, &why);
  if (!ledger) return to_error(why);
  if (!opts.obs) opts.obs = null_observer();
  return sys.spawn(swap_scheduler, std::shared_ptr<sched::ledger>(std::move(ledger)),
                   std::move(workers), std::move(opts));
}

}  // namespace computron::actors
