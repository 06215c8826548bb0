// The ledger's prefetch pass (ledger_options::prefetch): at the end of a pump, when
// nothing waits to load, a model in demand whose links are idle loads ahead of its
// requests, if room can be made from models less in demand.
#include <algorithm>
#include <map>
#include <vector>

#include "sched/ledger.hpp"

namespace computron::sched {

void ledger::prefetch(time_point now, decisions& out) {
  // Candidates: offloaded models in demand whose every link is idle, highest priority
  // class first, then most in demand.
  std::vector<std::pair<double, model_id>> cands;
  std::vector<bool> busy(devices_.size(), false);
  for (size_t d = 0; d < devices_.size(); ++d) busy[d] = devices_[d].transfers > 0;
  for (auto& m : models_)
    if (m.state == model_state::evicting)
      for (auto d : m.where.devices) busy[static_cast<size_t>(d)] = true;
  for (model_id id = 0; id < models_.size(); ++id) {
    auto& m = models_[id];
    // Adapters are not prefetched: their loads are a millisecond's copy, and one would
    // have to bring its base along.
    if (m.removed || m.base || m.state != model_state::offloaded || m.queued || lost_device(m) >= 0)
      continue;
    bool idle = true;
    for (auto d : m.where.devices) idle = idle && !busy[static_cast<size_t>(d)];
    auto rate = m.demand.rate(now);
    if (idle && rate > 0) cands.emplace_back(rate, id);
  }
  std::sort(cands.begin(), cands.end(), [&](auto& a, auto& b) {
    auto pa = models_[a.second].where.priority, pb = models_[b.second].where.priority;
    if (pa != pb) return pa > pb;
    if (a.first != b.first) return a.first > b.first;
    return a.second < b.second;
  });
  for (auto& [rate, id] : cands) {
    auto& m = models_[id];
    if (!never_fits(id).empty()) continue;
    bool fits_in_bytes = true;
    auto short_bytes = shortfall(m, &fits_in_bytes);
    std::vector<model_id> victims;
    if (!short_bytes.empty()) {
      // Only what is less likely to be used goes: lease-free, unpinned, of no higher
      // class, and clearly less in demand.
      std::vector<model_id> allowed;
      for (model_id o = 0; o < models_.size(); ++o) {
        auto& other = models_[o];
        if (may_evict_for(o, id) && other.leases == 0 && !other.draining &&
            other.where.priority <= m.where.priority &&
            other.demand.rate(now) * prefetch_margin < rate)
          allowed.push_back(o);
      }
      if (!cover(allowed, short_bytes, now, victims)) continue;
    }
    ++m.prefetches;
    m.prefetched = true;
    if (victims.empty()) {
      begin_load(id);
      out.loads.push_back(id);
      return;
    }
    // Room first: the load waits in the queue, as a requested one would, until the
    // evictions are done.
    for (auto v : with_adapters(victims)) {
      begin_evict(v);
      out.evictions.push_back(v);
    }
    m.wanted = true;
    m.queued = true;
    pending_.push_back(id);
    return;
  }
}

}  // namespace computron::sched
