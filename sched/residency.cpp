#include "sched/residency.hpp"

#include <algorithm>

namespace computron::sched {

std::unique_ptr<residency> residency::make(std::vector<device_slot> devices, ledger_options opts,
                                           refusal* why) {
  auto l = ledger::make(std::move(devices), std::move(opts), why);
  if (!l) return nullptr;
  return std::unique_ptr<residency>(new residency(std::move(l)));
}

residency::waiters& residency::of(model_id id) {
  // Models are added to the ledger directly (registration decides nothing about waiters).
  if (waiting_.size() <= id) waiting_.resize(static_cast<size_t>(id) + 1);
  return waiting_[id];
}

void residency::grant_waiting(model_id id, time_point now, residency_effects& out) {
  auto ws = std::move(of(id).leases);
  of(id).leases.clear();
  for (auto w : ws) {
    ledger_->grant(id, now);
    out.grants.push_back({w, id, true});
  }
}

void residency::fail_all(model_id id, std::vector<waiter_id> waiters::*which, const refusal& why,
                         residency_effects& out) {
  auto ws = std::move(of(id).*which);
  (of(id).*which).clear();
  for (auto w : ws) out.failures.push_back({w, id, why});
}

bool residency::try_kv(const kv_ask& a, time_point now, residency_effects& out, bool no_evict) {
  auto room = ledger_->kv_room(a.model);
  if (room >= a.need) {
    auto blocks = std::min(room, a.want);
    ledger_->kv_take(a.model, blocks);
    out.kv_grants.push_back({a.waiter, a.model, blocks, ledger_->kv_ceiling(a.model)});
    return true;
  }
  auto victims = no_evict ? std::nullopt : ledger_->kv_victims(a.model, a.need, now);
  if (victims) {
    // Room comes from lease-free models' weights (those evictions, or ones under way).
    ledger_->begin_kv_evictions(*victims);
    out.evictions.insert(out.evictions.end(), victims->begin(), victims->end());
    return false;
  }
  if (a.wait && !no_evict && ledger_->kv_held_beside(a.model)) return false;
  ledger_->kv_take(a.model, room);
  out.kv_grants.push_back({a.waiter, a.model, room, ledger_->kv_ceiling(a.model)});
  return true;
}

void residency::serve_kv(time_point now, residency_effects& out, bool no_evict) {
  auto asks = std::move(kv_waiting_);
  kv_waiting_.clear();
  for (auto& a : asks)
    if (!try_kv(a, now, out, no_evict)) kv_waiting_.push_back(a);
}

residency_effects residency::kv_reserve(model_id id, waiter_id w, uint64_t want, uint64_t need,
                                        bool wait, time_point now) {
  residency_effects out;
  kv_ask a{id, w, std::max(want, need), need, wait};
  // Tried at once, whatever waits: queued behind a first step that waits for this very
  // batch's KV, a growing batch would wait for ever. An earlier ask whose evictions this
  // one takes the room of evicts more, or gets less, when they end.
  if (!try_kv(a, now, out)) kv_waiting_.push_back(a);
  return out;
}

residency_effects residency::kv_pool(model_id id, const std::vector<int32_t>& devices,
                                     const std::vector<uint64_t>& bytes, time_point now) {
  residency_effects out;
  if (ledger_->kv_pool(id, devices, bytes)) pump(now, out);
  return out;
}

residency_effects residency::kv_return(model_id id, uint64_t blocks, time_point now) {
  residency_effects out;
  ledger_->kv_give(id, blocks);
  pump(now, out);
  return out;
}

void residency::pump(time_point now, residency_effects& out) {
  serve_kv(now, out);
  for (;;) {
    auto d = ledger_->pump(now);
    if (d.wake_at) out.wake_at = out.wake_at ? std::min(*out.wake_at, *d.wake_at) : *d.wake_at;
    if (d.empty()) return;
    out.evictions.insert(out.evictions.end(), d.evictions.begin(), d.evictions.end());
    out.loads.insert(out.loads.end(), d.loads.begin(), d.loads.end());
    for (auto& [id, why] : d.refused) {
      fail_all(id, &waiters::leases, why, out);
      fail_all(id, &waiters::loads, why, out);
    }
    bool again = false;
    for (auto id : d.undrained) {
      auto held = std::move(of(id).held);
      of(id).held.clear();
      if (ledger_->model(id).state == model_state::resident) {
        for (auto w : held) {
          ledger_->grant(id, now);
          out.grants.push_back({w, id, false});
        }
        continue;
      }
      // Evicted meanwhile: these requests wait for it to come back, like any other.
      auto& leases = of(id).leases;
      leases.insert(leases.end(), held.begin(), held.end());
      if (!ledger_->want(id))
        fail_all(id, &waiters::leases, {ec::unavailable, ledger_->unavailable_reason(id)}, out);
      again = true;
    }
    if (!again) return;
  }
}

residency_effects residency::acquire(model_id id, waiter_id w, time_point now) {
  residency_effects out;
  switch (ledger_->acquire(id, now)) {
    case acquire_result::granted:
      out.grants.push_back({w, id, false});
      break;
    case acquire_result::unavailable:
      out.failures.push_back({w, id, {ec::unavailable, ledger_->unavailable_reason(id)}});
      break;
    case acquire_result::wait_drain:
      of(id).held.push_back(w);
      break;
    case acquire_result::wait_load:
      of(id).leases.push_back(w);
      pump(now, out);
      break;
  }
  return out;
}

residency_effects residency::load(model_id id, waiter_id w, time_point now) {
  residency_effects out;
  auto state = ledger_->state_of(id);
  if (state == model_state::unavailable) {
    out.failures.push_back({w, id, {ec::unavailable, ledger_->unavailable_reason(id)}});
  } else if (state == model_state::resident) {
    out.done.push_back({w, id});
  } else {
    of(id).loads.push_back(w);
    ledger_->want(id);
    pump(now, out);
  }
  return out;
}

residency_effects residency::unload(model_id id, waiter_id w, time_point) {
  residency_effects out;
  if (ledger_->model(id).state == model_state::offloaded) {
    out.done.push_back({w, id});
    return out;
  }
  bool start = false;
  std::vector<model_id> adapters;
  if (auto why = ledger_->begin_unload(id, &start, &adapters)) {
    out.failures.push_back({w, id, std::move(*why)});
    return out;
  }
  of(id).evictions.push_back(w);
  out.evictions.insert(out.evictions.end(), adapters.begin(), adapters.end());
  if (start) out.evictions.push_back(id);
  return out;
}

residency_effects residency::release(model_id id, time_point now, bool* ok) {
  residency_effects out;
  bool last = false;
  bool had = ledger_->release(id, now, &last);
  if (ok) *ok = had;
  if (had && last) pump(now, out);
  return out;
}

residency_effects residency::load_started(model_id id, time_point now) {
  residency_effects out;
  if (ledger_->load_started(id, now)) grant_waiting(id, now, out);
  return out;
}

residency_effects residency::load_done(model_id id, time_point now,
                                       const std::vector<free_block>& free,
                                       const std::vector<transfer_sample>& copies) {
  residency_effects out;
  ledger_->load_done(id, now);
  for (auto& f : free) ledger_->note_largest_free(f.device, f.bytes);
  for (auto& c : copies) ledger_->note_transfer(c.device, c.bytes, c.seconds);
  grant_waiting(id, now, out);
  auto loads = std::move(of(id).loads);
  of(id).loads.clear();
  for (auto w : loads) out.done.push_back({w, id});
  pump(now, out);
  return out;
}

residency_effects residency::load_failed(model_id id, const refusal& why, time_point now) {
  residency_effects out;
  out.discards.push_back(id);
  ledger_->load_failed(id);
  auto& w = of(id);
  bool waited_for = !w.leases.empty() || !w.loads.empty();
  // A base loads for its adapters' requests too.
  for (auto a : ledger_->model(id).adapters)
    waited_for = waited_for || !of(a).leases.empty() || !of(a).loads.empty();
  // A device short of pages that the ledger counted as free: room that comes back by
  // itself. The requests wait for it (their deadlines still bound them); a model that
  // can never fit is refused by the pass with the sizes, as before.
  if (!(why.code == ec::out_of_device_memory && waited_for && ledger_->retry_later(id, now))) {
    fail_all(id, &waiters::leases, why, out);
    fail_all(id, &waiters::loads, why, out);
    // Adapters waiting for this base cannot load either.
    for (auto a : ledger_->drop_waiting_adapters(id)) {
      refusal base_why{why.code,
                       "its base " + ledger_->model(id).name + " failed to load: " + why.reason};
      fail_all(a, &waiters::leases, base_why, out);
      fail_all(a, &waiters::loads, base_why, out);
    }
  }
  pump(now, out);
  return out;
}

residency_effects residency::tick(time_point now) {
  residency_effects out;
  pump(now, out);
  return out;
}

residency_effects residency::evict_done(model_id id, time_point now,
                                        const std::vector<free_block>& free) {
  residency_effects out;
  ledger_->evict_done(id);
  for (auto& f : free) ledger_->note_largest_free(f.device, f.bytes);
  auto ws = std::move(of(id).evictions);
  of(id).evictions.clear();
  for (auto w : ws) out.done.push_back({w, id});
  pump(now, out);
  return out;
}

residency_effects residency::evict_failed(model_id id, const refusal& why, time_point now) {
  residency_effects out;
  if (ledger_->state_of(id) == model_state::unavailable) {
    // Its node is gone, and its copy with it.
    out.discards.push_back(id);
    ledger_->forget(id);
    auto ws = std::move(of(id).evictions);
    of(id).evictions.clear();
    for (auto w : ws) out.done.push_back({w, id});
    pump(now, out);
    return out;
  }
  ledger_->evict_failed(id);
  fail_all(id, &waiters::evictions, why, out);
  // KV asks that waited for it get what fits now (the batch preempts) instead of choosing
  // the same victim again and again.
  serve_kv(now, out, true);
  return out;
}

residency_effects residency::pin(model_id id, bool pinned, time_point now) {
  residency_effects out;
  ledger_->pin(id, pinned);
  if (!pinned) pump(now, out);
  return out;
}

residency_effects residency::lose(const std::vector<int32_t>& devices, time_point now) {
  residency_effects out;
  for (auto id : ledger_->lose(devices)) {
    // What it holds on the other devices is freed; it loads again once all are back.
    out.discards.push_back(id);
    ledger_->forget(id);
  }
  // Loads and evictions in flight fail by themselves (the workers' guards answer at once).
  pump(now, out);
  return out;
}

residency_effects residency::find_devices(const std::vector<int32_t>& devices, time_point now) {
  residency_effects out;
  ledger_->find_devices(devices);
  pump(now, out);
  return out;
}

std::optional<refusal> residency::remove(model_id id) {
  if (auto why = ledger_->remove(id)) return why;
  if (id < waiting_.size()) waiting_[id] = {};
  return std::nullopt;
}

}  // namespace computron::sched
