// The ledger's room planning (sched/ledger.hpp): what a waiting load is short of, which
// victims cover it by the policy (a base with the adapters that go with it), and the pass
// that starts loads, evicts and drains. Its own file, as ledger.cpp is the accounting.
#include <algorithm>
#include <deque>
#include <map>
#include <vector>

#include "sched/ledger.hpp"

namespace computron::sched {

std::map<size_t, int64_t> ledger::shortfall(const model_entry& m, bool* fits_in_bytes) const {
  std::map<size_t, int64_t> short_bytes;
  *fits_in_bytes = true;
  for (size_t i = 0; i < m.where.devices.size(); ++i) {
    auto d = static_cast<size_t>(m.where.devices[i]);
    auto have = free_bytes(d);
    *fits_in_bytes = *fits_in_bytes && m.where.bytes[i] <= have;
    if (auto lf = devices_[d].largest_free_bytes) have = std::min(have, *lf);
    auto need = static_cast<int64_t>(m.where.bytes[i]) - static_cast<int64_t>(have);
    if (need > 0) short_bytes[d] = need;
  }
  return short_bytes;
}

bool ledger::cover(const std::vector<model_id>& candidates, std::map<size_t, int64_t>& short_bytes,
                   time_point now, std::vector<model_id>& victims) const {
  auto covered = [&] {
    for (auto& [d, b] : short_bytes)
      if (b > 0) return false;
    return true;
  };
  std::vector<victim_candidate> cands;
  std::vector<model_id> ids;
  for (auto o : candidates) {
    auto& other = models_[o];
    uint64_t freed = 0;
    double slowest = 0;
    for (size_t k = 0; k < other.where.devices.size(); ++k) {
      auto d = static_cast<size_t>(other.where.devices[k]);
      if (short_bytes.count(d) > 0) freed += bytes_with_adapters(other, k);
      auto gbps = link_gbps(d);
      slowest = std::max(slowest, static_cast<double>(other.where.bytes[k]) / (gbps * 1e9));
    }
    if (freed == 0) continue;
    double idle = other.last_used ? seconds_between(*other.last_used, now) : 1e18;
    cands.push_back(
        {other.name, freed, idle, slowest, other.demand.rate(now), other.where.priority});
    ids.push_back(o);
  }
  auto chosen = [&](model_id o) {
    return std::find(victims.begin(), victims.end(), o) != victims.end();
  };
  for (auto i : policy_->order(cands)) {
    auto& v = models_[ids[i]];
    // An adapter whose base went already went with it.
    if (v.base && chosen(*v.base)) continue;
    bool helps = false;
    for (size_t k = 0; k < v.where.devices.size(); ++k) {
      auto it = short_bytes.find(static_cast<size_t>(v.where.devices[k]));
      if (it != short_bytes.end() && it->second > 0) {
        helps = true;
        // A base takes its resident adapters along, less those chosen before it.
        auto freed = bytes_with_adapters(v, k);
        for (auto a : v.adapters)
          if (models_[a].state == model_state::resident && chosen(a))
            freed -= models_[a].where.bytes[k];
        it->second -= static_cast<int64_t>(freed);
      }
    }
    if (helps) victims.push_back(ids[i]);
    if (covered()) return true;
  }
  return covered();
}

bool ledger::may_evict_for(model_id o, model_id id) const {
  auto& other = models_[o];
  if (o == id || other.state != model_state::resident || other.pinned) return false;
  if (models_[id].base && *models_[id].base == o) return false;
  for (auto a : other.adapters) {
    auto& ad = models_[a];
    if (ad.state == model_state::loading || ad.state == model_state::evicting ||
        (ad.queued && ad.wanted))
      return false;
  }
  return true;
}

uint64_t ledger::bytes_with_adapters(const model_entry& o, size_t k) const {
  auto bytes = o.where.bytes[k];
  for (auto a : o.adapters)
    if (models_[a].state == model_state::resident) bytes += models_[a].where.bytes[k];
  return bytes;
}

std::vector<model_id> ledger::with_adapters(const std::vector<model_id>& victims) const {
  std::vector<model_id> out;
  auto add = [&](model_id o) {
    if (std::find(out.begin(), out.end(), o) == out.end()) out.push_back(o);
  };
  for (auto v : victims) {
    for (auto a : models_[v].adapters)
      if (models_[a].state == model_state::resident) add(a);
    add(v);
  }
  return out;
}

std::vector<model_id> ledger::drop_waiting_adapters(model_id base) {
  std::vector<model_id> out;
  for (auto a : models_[base].adapters) {
    auto& ad = models_[a];
    if (!ad.wanted) continue;
    ad.wanted = false;
    out.push_back(a);
  }
  return out;
}

ledger::room ledger::make_room(model_id id, time_point now, decisions& out) {
  auto& m = models_[id];
  bool fits_in_bytes = true;
  auto short_bytes = shortfall(m, &fits_in_bytes);
  if (short_bytes.empty()) return room::start;
  // Evictions already under way count as freed.
  for (auto& other : models_)
    if (other.state == model_state::evicting)
      for (size_t k = 0; k < other.where.devices.size(); ++k) {
        auto it = short_bytes.find(static_cast<size_t>(other.where.devices[k]));
        if (it != short_bytes.end()) it->second -= static_cast<int64_t>(other.where.bytes[k]);
      }
  bool covered = true;
  for (auto& [d, b] : short_bytes) covered = covered && b <= 0;
  if (covered) return room::evicting;
  // Victims by the policy among the lease-free models first (they can go now); when
  // they do not cover, more among the leased ones, and then all of them drain (no new
  // leases) so that this load gets its turn.
  auto resident_others = [&](bool leased) {
    std::vector<model_id> ids;
    for (model_id o = 0; o < models_.size(); ++o) {
      auto& other = models_[o];
      if (may_evict_for(o, id) && (other.leases > 0) == leased) ids.push_back(o);
    }
    return ids;
  };
  std::vector<model_id> victims;
  if (cover(resident_others(false), short_bytes, now, victims)) {
    for (auto v : with_adapters(victims)) {
      begin_evict(v);
      out.evictions.push_back(v);
    }
    return room::evicting;
  }
  if (cover(resident_others(true), short_bytes, now, victims)) {
    for (auto v : victims) models_[v].draining = true;
    return room::wait;
  }
  // Short only of a contiguous block and nothing left to evict: try anyway rather than
  // wait for a report that may never come (a failed allocation fails the load clearly).
  if (fits_in_bytes) return room::start;
  return room::wait;
}

decisions ledger::pump(time_point now) {
  decisions out;
  // Drains are decided afresh by this pass; held leases of models no longer draining go
  // ahead at its end.
  for (auto& m : models_) m.draining = false;
  std::vector<bool> reserved(devices_.size(), false);
  std::deque<model_id> still;
  while (!pending_.empty()) {
    auto id = pending_.front();
    pending_.pop_front();
    auto& m = models_[id];
    if (m.state == model_state::resident || m.state == model_state::loading || !m.wanted) {
      m.queued = false;
      continue;
    }
    // A refused base refuses the adapters that wait for it.
    auto refuse = [&](refusal why) {
      m.queued = false;
      m.wanted = false;
      for (auto a : drop_waiting_adapters(id))
        out.refused.push_back(
            {a, {why.code, "its base " + m.name + " cannot load: " + why.reason}});
      out.refused.push_back({id, std::move(why)});
    };
    if (lost_device(m) >= 0) {
      refuse({ec::unavailable, unavailable_reason(id)});
      continue;
    }
    if (auto why = never_fits(id); !why.empty()) {
      refuse({ec::out_of_device_memory, std::move(why)});
      continue;
    }
    if (m.retry_at && now < *m.retry_at) {
      // Not yet: it holds no devices meanwhile, so other loads go ahead.
      out.wake_at = out.wake_at ? std::min(*out.wake_at, *m.retry_at) : *m.retry_at;
      still.push_back(id);
      continue;
    }
    m.retry_at.reset();
    if (m.base) {
      // An adapter loads beside its base: the base first (asked for here, so it queues
      // behind this pass's head), then the adapter, at a later pass.
      auto& b = models_[*m.base];
      if (b.state != model_state::resident && b.state != model_state::loading) {
        if (b.state == model_state::offloaded && !want(*m.base)) {
          m.queued = false;
          m.wanted = false;
          out.refused.push_back({id, {ec::unavailable, unavailable_reason(*m.base)}});
          continue;
        }
        still.push_back(id);
        continue;
      }
    }
    bool blocked = m.state == model_state::evicting;
    for (auto d : m.where.devices)
      blocked = blocked || reserved[static_cast<size_t>(d)] ||
                devices_[static_cast<size_t>(d)].transfers >= opts_.max_transfers_per_link;
    if (!blocked && make_room(id, now, out) == room::start) {
      begin_load(id);
      out.loads.push_back(id);
      continue;
    }
    for (auto d : m.where.devices) reserved[static_cast<size_t>(d)] = true;
    still.push_back(id);
  }
  pending_ = std::move(still);
  // A base that drains holds its adapters' new leases too (theirs would lease it).
  for (auto& m : models_)
    if (m.base && models_[*m.base].draining) m.draining = true;
  for (model_id id = 0; id < models_.size(); ++id) {
    auto& m = models_[id];
    if (!m.draining && m.held > 0) {
      m.held = 0;
      out.undrained.push_back(id);
    }
  }
  if (opts_.prefetch && pending_.empty() && out.empty()) prefetch(now, out);
  return out;
}

}  // namespace computron::sched
