#include "actors/swap_scheduler.hpp"

#include <optional>
#include <unordered_map>
#include <vector>

#include <caf/all.hpp>

#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "sched/residency.hpp"

namespace computron::actors {

namespace {

using sched::model_id;
using sched::model_state;

/// A caller waiting on the residency core: a lease request (with when it asked) or an
/// explicit load or unload.
struct pending_waiter {
  std::optional<caf::typed_response_promise<lease>> lease_rp;
  std::optional<caf::typed_response_promise<residency_report>> report_rp;
  sched::time_point asked{};
  /// A KV ask: blocks granted, and the most the model could ever hold.
  std::optional<caf::typed_response_promise<uint64_t, uint64_t>> kv_rp{};
};

struct swap_scheduler_state {
  static constexpr const char* name = "swap_scheduler";
  /// The ledger and who waits (sched/residency): this actor carries out its effects.
  std::shared_ptr<sched::residency> core;
  std::vector<shard_worker_actor> workers;
  std::unordered_map<sched::waiter_id, pending_waiter> waiters;
  sched::waiter_id next_waiter = 1;
  swap_scheduler_options opts;
  /// The ledger's residency epoch of the last lease that carried the resident set.
  std::optional<uint64_t> sent_epoch;
  /// When the tick already asked for comes (a load waiting to be retried).
  std::optional<sched::time_point> tick_at;
  /// Transfers after which a device held more than the ledger counts for it (check_device):
  /// /v2/status shows it, and the soaks require 0.
  uint64_t ledger_below_device = 0;
};

using sched_pointer = swap_scheduler_actor::stateful_pointer<swap_scheduler_state>;

sched::time_point now(sched_pointer self) {
  return self->clock().now();
}

caf::error to_error(const sched::refusal& r) {
  return make_error(r.code, r.reason);
}

const sched::ledger& ledger_of(sched_pointer self) {
  return self->state.core->ledger();
}

model_lifecycle lifecycle_of(model_state s) {
  switch (s) {
    case model_state::offloaded:
      return model_lifecycle::offloaded;
    case model_state::loading:
      return model_lifecycle::loading;
    case model_state::resident:
      return model_lifecycle::resident;
    case model_state::evicting:
      return model_lifecycle::evicting;
    case model_state::unavailable:
      return model_lifecycle::unavailable;
  }
  return model_lifecycle::unknown;
}

residency_report report_of(sched_pointer self, model_id id) {
  auto& l = ledger_of(self);
  auto& m = l.model(id);
  auto t = now(self);
  residency_report r;
  r.model = m.name;
  r.state = lifecycle_of(l.state_of(id));
  r.bytes = m.total_bytes;
  r.leases = m.leases;
  r.pinned = m.pinned;
  r.loads = m.loads;
  r.evictions = m.evictions;
  r.demand_per_s = m.demand.rate(t);
  r.idle_s = m.leases > 0 ? 0 : m.last_used ? sched::seconds_between(*m.last_used, t) : -1;
  r.reason = l.unavailable_reason(id);
  r.kv_blocks = m.kv_blocks;
  for (auto b : m.where.kv_block_bytes) r.kv_bytes += m.kv_blocks * b;
  return r;
}

void publish_usage(sched_pointer self) {
  auto& l = ledger_of(self);
  size_t resident = 0;
  auto per_device = l.resident_per_device(&resident);
  auto& obs = *self->state.opts.obs;
  for (size_t d = 0; d < l.device_count(); ++d) {
    auto& a = l.device(d);
    obs.device_usage(static_cast<int32_t>(d), a.used_bytes, a.slot.usable_bytes, per_device[d]);
    auto taken = a.used_bytes + a.kv_bytes;
    obs.kv_device(static_cast<int32_t>(d), a.kv_bytes,
                  a.slot.usable_bytes > taken ? a.slot.usable_bytes - taken : 0);
  }
  for (model_id id = 0; id < l.model_count(); ++id)
    if (!l.model(id).where.kv_block_bytes.empty() && !l.model(id).removed)
      obs.kv_model(l.model(id).name, l.model(id).kv_blocks);
  self->state.opts.obs->resident_models(resident);
}

std::vector<shard_worker_actor> workers_of(sched_pointer self, model_id id) {
  std::vector<shard_worker_actor> ws;
  for (auto d : ledger_of(self).model(id).where.devices)
    ws.push_back(self->state.workers[static_cast<size_t>(d)]);
  return ws;
}

/// What the workers said of their free blocks with a transfer.
std::vector<sched::free_block> free_blocks(const std::vector<transfer_report>& reports) {
  std::vector<sched::free_block> out;
  for (auto& r : reports)
    if (r.largest_free_bytes >= 0)
      out.push_back({static_cast<size_t>(r.device), static_cast<uint64_t>(r.largest_free_bytes)});
  return out;
}

/// The models resident now, for lease::resident; empty when the set has not changed since
/// the last lease (every lease goes to the one manager, in order, so it still knows it).
std::vector<std::string> resident_names(sched_pointer self) {
  auto& l = ledger_of(self);
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
  auto name = ledger_of(self).model(id).name;
  for (auto& w : workers_of(self, id))
    self->request(w, self->state.opts.load_timeout, evict_atom_v, name)
        .then([](transfer_report&) {}, [](caf::error&) {});
}

void start_evict(sched_pointer self, model_id id);
void start_load(sched_pointer self, model_id id);

/// The device's own figure after a transfer beside the ledger's: published, and checked
/// (an error in the log and a count in /v2/status, in every build: CI's builds define NDEBUG).
/// The ledger counts a load's pages from its start and an eviction's to its end, a KV pool's
/// pages as no fewer than it reported nor than its batches' blocks, and an ended batch's blocks
/// until its caches are gone; a pool grows only by its step's need and its batch's spare. So the
/// device never holds more, but for a chunk's rounding up to whole pages (under a page per model
/// with KV there: the slack), and for a failed load's shards that the ledger freed at once while
/// their discard is still on its way.
void check_device(sched_pointer self, const transfer_report& r) {
  auto& l = ledger_of(self);
  if (r.device < 0 || static_cast<size_t>(r.device) >= l.device_count()) return;
  self->state.opts.obs->device_mapped(r.device, r.mapped_bytes);
  auto& a = l.device(static_cast<size_t>(r.device));
  uint64_t slack = 0;
  for (model_id m = 0; m < l.model_count(); ++m)
    for (auto d : l.model(m).where.devices)
      if (d == r.device && l.model(m).kv_blocks > 0) slack += a.slot.page_bytes;
  if (r.mapped_bytes <= a.used_bytes + a.kv_bytes + slack) return;
  ++self->state.ledger_below_device;
  log::error("device {} has {} bytes mapped, the ledger counts {} (weights {}, KV {})", r.device,
             r.mapped_bytes, a.used_bytes + a.kv_bytes, a.used_bytes, a.kv_bytes);
}

/// Carries out what the core decided. `failure_error`, where given, is what the failing
/// waiters hear instead of the core's refusal (a worker's own error keeps its code).
void carry_out(sched_pointer self, sched::residency_effects e,
               const caf::error* failure_error = nullptr) {
  auto& st = self->state;
  // Discards first: a worker frees a lost or failed model's shard before a load the
  // same pass started there needs the room.
  for (auto id : e.discards) evict_everywhere(self, id);
  for (auto id : e.evictions) start_evict(self, id);
  for (auto id : e.loads) start_load(self, id);
  if (!e.evictions.empty() || !e.discards.empty()) publish_usage(self);
  auto take = [&](sched::waiter_id w) {
    auto i = st.waiters.find(w);
    std::optional<pending_waiter> p;
    if (i != st.waiters.end()) {
      p = std::move(i->second);
      st.waiters.erase(i);
    }
    return p;
  };
  for (auto& g : e.grants) {
    auto p = take(g.waiter);
    if (!p || !p->lease_rp) continue;
    auto& l = ledger_of(self);
    auto t = now(self);
    p->lease_rp->deliver(lease{
        l.model(g.model).name, g.loaded, sched::seconds_between(p->asked, t) * 1e3,
        l.load_seconds(g.model) * 1e3, resident_names(self),
        l.model(g.model).state == model_state::loading, l.load_left_seconds(g.model, t) * 1e3});
  }
  for (auto& g : e.kv_grants) {
    auto p = take(g.waiter);
    if (p && p->kv_rp) {
      p->kv_rp->deliver(g.blocks, g.ceiling);
    } else if (g.blocks > 0) {
      // Its asker is gone (it cannot be: asks are answered whole); the blocks go back.
      st.core->ledger().kv_give(g.model, g.blocks);
    }
  }
  if (!e.kv_grants.empty()) publish_usage(self);
  for (auto& d : e.done) {
    auto p = take(d.waiter);
    if (p && p->report_rp) p->report_rp->deliver(report_of(self, d.model));
  }
  for (auto& f : e.failures) {
    auto p = take(f.waiter);
    if (!p) continue;
    auto err = failure_error ? *failure_error : to_error(f.why);
    if (p->lease_rp) p->lease_rp->deliver(err);
    if (p->report_rp) p->report_rp->deliver(err);
  }
  if (e.wake_at && (!st.tick_at || *e.wake_at < *st.tick_at || *st.tick_at <= now(self))) {
    st.tick_at = *e.wake_at;
    auto wait = std::max(sched::duration::zero(), *e.wake_at - now(self));
    self->delayed_send(self, std::chrono::duration_cast<std::chrono::nanoseconds>(wait),
                       tick_atom_v);
  }
}

void start_evict(sched_pointer self, model_id id) {
  auto name = ledger_of(self).model(id).name;
  auto t0 = now_s();
  log::debug("evicting {}", name);
  fan_out_all<transfer_report>(
      self, workers_of(self, id), self->state.opts.load_timeout,
      [=](std::vector<transfer_report> reports) {
        auto& st = self->state;
        auto e = st.core->evict_done(id, now(self), free_blocks(reports));
        for (auto& r : reports) {
          st.opts.obs->transfer_done(name, r.device, false, r.bytes, t0, r.seconds);
          check_device(self, r);
        }
        publish_usage(self);
        carry_out(self, std::move(e));
      },
      [=](caf::error err, size_t i) {
        log::error("evicting {} failed on device {}: {}", name,
                   ledger_of(self).model(id).where.devices[i], render(err));
        // The worker's code stays (a device error is a 500, a timed-out request a 503).
        auto e = with_context(err, "evicting " + name + " failed");
        carry_out(self,
                  self->state.core->evict_failed(id, {ec::device_error, render(e)}, now(self)), &e);
      },
      evict_atom_v, name);
}

/// A load failed on shard `i` (starting or finishing): whatever arrived elsewhere is
/// freed and everyone waiting for the model hears why.
void load_failed(sched_pointer self, model_id id, const caf::error& err, size_t i) {
  auto name = ledger_of(self).model(id).name;
  auto device = ledger_of(self).model(id).where.devices[i];
  log::warn("loading {} failed on device {}: {}", name, device, render(err));
  auto code = is(err, ec::out_of_device_memory) ? ec::out_of_device_memory
              : is(err, ec::unavailable)        ? ec::unavailable
                                                : ec::device_error;
  auto e = self->state.core->load_failed(id,
                                         {code, "loading " + name + " failed on device " +
                                                    std::to_string(device) + ": " + render(err)},
                                         now(self));
  publish_usage(self);
  carry_out(self, std::move(e));
}

/// Waits for every shard's copy to arrive (the second half of a load).
void finish_load(sched_pointer self, model_id id, double t0) {
  auto name = ledger_of(self).model(id).name;
  fan_out_all<transfer_report>(
      self, workers_of(self, id), self->state.opts.load_timeout,
      [=](std::vector<transfer_report> reports) {
        auto& st = self->state;
        std::vector<sched::transfer_sample> copies;
        for (auto& r : reports)
          copies.push_back({static_cast<size_t>(r.device), r.bytes, r.seconds});
        auto e = st.core->load_done(id, now(self), free_blocks(reports), copies);
        for (auto& r : reports) {
          st.opts.obs->transfer_done(name, r.device, true, r.bytes, t0, r.seconds);
          check_device(self, r);
        }
        publish_usage(self);
        carry_out(self, std::move(e));
      },
      [=](caf::error err, size_t i) { load_failed(self, id, err, i); }, load_atom_v, name);
}

void start_load(sched_pointer self, model_id id) {
  auto& m = ledger_of(self).model(id);
  auto name = m.name;
  publish_usage(self);
  auto t0 = now_s();
  log::debug("loading {} ({} bytes over {} devices)", name, m.total_bytes, m.where.devices.size());
  if (!ledger_of(self).options().compute_while_loading) {
    finish_load(self, id, t0);
    return;
  }
  // First every shard queues its copies; then the batches waiting for the model start
  // (each layer waits for its own bytes) while the copies run.
  fan_out_all<transfer_report>(
      self, workers_of(self, id), self->state.opts.load_timeout,
      [=](std::vector<transfer_report>) {
        carry_out(self, self->state.core->load_started(id, now(self)));
        finish_load(self, id, t0);
      },
      [=](caf::error err, size_t i) { load_failed(self, id, err, i); }, begin_load_atom_v, name);
}

/// A new waiter's number, its entry made.
sched::waiter_id add_waiter(sched_pointer self, pending_waiter p) {
  auto w = self->state.next_waiter++;
  self->state.waiters.emplace(w, std::move(p));
  return w;
}

swap_scheduler_actor::behavior_type swap_scheduler(sched_pointer self,
                                                   std::shared_ptr<sched::residency> core,
                                                   std::vector<shard_worker_actor> workers,
                                                   swap_scheduler_options opts) {
  auto& st = self->state;
  st.core = std::move(core);
  st.workers = std::move(workers);
  st.opts = std::move(opts);
  publish_usage(self);
  auto find = [=](const std::string& name) { return ledger_of(self).find(name); };
  auto unknown = [](const std::string& name) {
    return make_error(ec::unknown_model, "no model named " + name);
  };
  return {
      [=](register_atom, model_placement& p) -> caf::result<bool> {
        auto& l = self->state.core->ledger();
        sched::placement where{p.devices, p.bytes, p.pinned, p.priority, p.kv_block_bytes, p.base};
        // A model larger than its devices is refused here, not at every request.
        std::vector<uint64_t> usable;
        for (size_t d = 0; d < l.device_count(); ++d)
          usable.push_back(l.device(d).slot.usable_bytes);
        if (auto no = sched::check_fits(p.model, where, usable)) return to_error(*no);
        sched::refusal why;
        if (!l.add(p.model, where, &why)) return to_error(why);
        return true;
      },
      [=](kv_reserve_atom, std::string& name, uint64_t want, uint64_t need,
          bool wait) -> caf::result<uint64_t, uint64_t> {
        auto id = find(name);
        if (!id) return unknown(name);
        auto rp = self->make_response_promise<uint64_t, uint64_t>();
        pending_waiter p;
        p.kv_rp = rp;
        p.asked = now(self);
        auto w = add_waiter(self, std::move(p));
        carry_out(self, self->state.core->kv_reserve(*id, w, want, need, wait, now(self)));
        return rp;
      },
      [=](kv_return_atom, std::string& name, uint64_t blocks) {
        auto id = find(name);
        if (!id) return;
        carry_out(self, self->state.core->kv_return(*id, blocks, now(self)));
        publish_usage(self);
      },
      [=](kv_pool_atom, std::string& name, std::vector<int32_t>& devs,
          std::vector<uint64_t>& bytes) {
        auto id = find(name);
        if (!id) return;
        carry_out(self, self->state.core->kv_pool(*id, devs, bytes, now(self)));
        publish_usage(self);
      },
      [=](acquire_atom, std::string& name) -> caf::result<lease> {
        auto id = find(name);
        if (!id) return unknown(name);
        auto rp = self->make_response_promise<lease>();
        auto w = add_waiter(self, {rp, std::nullopt, now(self)});
        carry_out(self, self->state.core->acquire(*id, w, now(self)));
        return rp;
      },
      [=](release_atom, std::string& name) {
        auto id = find(name);
        bool ok = false;
        if (id) {
          auto e = self->state.core->release(*id, now(self), &ok);
          carry_out(self, std::move(e));
        }
        if (!ok) log::warn("release of {} without a lease", name);
      },
      [=](load_atom, std::string& name) -> caf::result<residency_report> {
        auto id = find(name);
        if (!id) return unknown(name);
        auto rp = self->make_response_promise<residency_report>();
        auto w = add_waiter(self, {std::nullopt, rp, now(self)});
        carry_out(self, self->state.core->load(*id, w, now(self)));
        return rp;
      },
      [=](unload_atom, std::string& name) -> caf::result<residency_report> {
        auto id = find(name);
        if (!id) return unknown(name);
        auto rp = self->make_response_promise<residency_report>();
        auto w = add_waiter(self, {std::nullopt, rp, now(self)});
        carry_out(self, self->state.core->unload(*id, w, now(self)));
        return rp;
      },
      [=](unregister_atom, std::string& name) -> caf::result<bool> {
        auto id = find(name);
        if (!id) return unknown(name);
        if (auto why = self->state.core->remove(*id)) return to_error(*why);
        return true;
      },
      [=](pin_atom, std::string& name, bool pinned) -> caf::result<residency_report> {
        auto id = find(name);
        if (!id) return unknown(name);
        carry_out(self, self->state.core->pin(*id, pinned, now(self)));
        return report_of(self, *id);
      },
      [=](demand_atom, std::string& name, uint32_t n) {
        if (auto id = find(name)) self->state.core->ledger().note_demand(*id, n, now(self));
      },
      [=](status_atom) {
        std::vector<residency_report> out;
        for (model_id id = 0; id < ledger_of(self).model_count(); ++id)
          if (!ledger_of(self).model(id).removed) out.push_back(report_of(self, id));
        return out;
      },
      [=](lost_atom, std::vector<int32_t>& devs) {
        auto e = self->state.core->lose(devs, now(self));
        for (auto id : e.discards)
          log::warn("model {} lost its residency: a device's node is gone",
                    ledger_of(self).model(id).name);
        carry_out(self, std::move(e));
        publish_usage(self);
      },
      [=](policy_atom, std::string& name) -> caf::result<std::string> {
        auto& st = self->state;
        auto& l = st.core->ledger();
        if (name.empty() || name == l.options().policy) return l.options().policy;
        if (auto why = l.set_policy(name)) return to_error(*why);
        st.opts.ledger.policy = name;
        log::info("eviction policy is now {}", name);
        return name;
      },
      [=](found_atom, std::vector<int32_t>& devs) {
        carry_out(self, self->state.core->find_devices(devs, now(self)));
      },
      [=](tick_atom) {
        auto& st = self->state;
        if (st.tick_at && *st.tick_at <= now(self)) st.tick_at.reset();
        carry_out(self, st.core->tick(now(self)));
      },
      [=](report_atom) {
        auto& l = ledger_of(self);
        caf::settings out;
        out["policy"] = caf::config_value{l.options().policy};
        out["prefetch"] = caf::config_value{l.options().prefetch};
        caf::config_value::list models;
        for (model_id id = 0; id < l.model_count(); ++id) {
          if (l.model(id).removed) continue;
          auto r = report_of(self, id);
          caf::settings x;
          x["model"] = caf::config_value{r.model};
          x["state"] = caf::config_value{std::string{to_string(r.state)}};
          x["bytes"] = caf::config_value{static_cast<int64_t>(r.bytes)};
          x["leases"] = caf::config_value{static_cast<int64_t>(r.leases)};
          x["pinned"] = caf::config_value{r.pinned};
          x["loads"] = caf::config_value{static_cast<int64_t>(r.loads)};
          x["evictions"] = caf::config_value{static_cast<int64_t>(r.evictions)};
          auto& e = l.model(id);
          x["prefetches"] = caf::config_value{static_cast<int64_t>(e.prefetches)};
          x["prefetch-hits"] = caf::config_value{static_cast<int64_t>(e.prefetch_hits)};
          if (!e.where.kv_block_bytes.empty()) {
            x["kv-blocks"] = caf::config_value{static_cast<int64_t>(r.kv_blocks)};
            x["kv-bytes"] = caf::config_value{static_cast<int64_t>(r.kv_bytes)};
          }
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
          // KV blocks share the budget with the weights: what they hold, and what is left.
          x["kv-bytes"] = caf::config_value{static_cast<int64_t>(a.kv_bytes)};
          auto taken = a.used_bytes + a.kv_bytes;
          x["free-bytes"] = caf::config_value{
              static_cast<int64_t>(a.slot.usable_bytes > taken ? a.slot.usable_bytes - taken : 0)};
          x["transfers"] = caf::config_value{static_cast<int64_t>(a.transfers)};
          x["lost"] = caf::config_value{a.lost};
          if (a.largest_free_bytes)
            x["largest-free-bytes"] =
                caf::config_value{static_cast<int64_t>(*a.largest_free_bytes)};
          devices.emplace_back(std::move(x));
        }
        out["devices"] = caf::config_value{std::move(devices)};
        out["pending-loads"] = caf::config_value{static_cast<int64_t>(l.pending_loads())};
        out["ledger-below-device"] =
            caf::config_value{static_cast<int64_t>(self->state.ledger_below_device)};
        return out;
      },
      [=](devices_atom) {
        std::vector<device_usage> out;
        auto& l = ledger_of(self);
        for (size_t d = 0; d < l.device_count(); ++d)
          out.push_back({static_cast<int32_t>(d), l.device(d).slot.usable_bytes,
                         l.device(d).used_bytes, l.device(d).transfers, l.device(d).kv_bytes,
                         l.device(d).slot.page_bytes});
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
    slots.push_back({d.capacity_bytes - opts.workspace_bytes, d.link_gbps, d.page_bytes});
    workers.push_back(d.worker);
  }
  sched::refusal why;
  auto core = sched::residency::make(std::move(slots), opts.ledger, &why);
  if (!core) return to_error(why);
  if (!opts.obs) opts.obs = null_observer();
  return sys.spawn(swap_scheduler, std::shared_ptr<sched::residency>(std::move(core)),
                   std::move(workers), std::move(opts));
}

}  // namespace computron::actors
