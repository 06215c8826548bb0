#include "sched/ledger.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace computron::sched {

const char* to_string(model_state s) {
  switch (s) {
    case model_state::offloaded:
      return "offloaded";
    case model_state::loading:
      return "loading";
    case model_state::resident:
      return "resident";
    case model_state::evicting:
      return "evicting";
    case model_state::unavailable:
      return "unavailable";
  }
  return "unknown";
}

namespace {

/// Bytes as MiB for a person: one decimal, with the exact bytes when that rounds a
/// difference away.
std::string mib_text(uint64_t bytes, uint64_t other) {
  auto text = [](uint64_t b) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
    return std::string{buf};
  };
  auto t = text(bytes);
  if (t == text(other)) t += " (" + std::to_string(bytes) + " bytes)";
  return t;
}

}  // namespace

std::optional<refusal> check_fits(const std::string& name, const placement& p,
                                  const std::vector<uint64_t>& usable_bytes) {
  std::map<int32_t, uint64_t> need;
  for (size_t i = 0; i < p.devices.size() && i < p.bytes.size(); ++i)
    need[p.devices[i]] += p.bytes[i];
  for (auto& [d, bytes] : need) {
    uint64_t holds = d >= 0 && static_cast<size_t>(d) < usable_bytes.size()
                         ? usable_bytes[static_cast<size_t>(d)]
                         : 0;
    if (bytes > holds)
      return refusal{ec::out_of_device_memory,
                     "model " + name + " needs " + mib_text(bytes, holds) + " on device " +
                         std::to_string(d) + ", which holds " + mib_text(holds, bytes) +
                         " for weights: it can never be loaded there (give it more devices "
                         "(tp, pp), larger ones (capacity_mb), or a smaller dtype)"};
  }
  return std::nullopt;
}

std::unique_ptr<ledger> ledger::make(std::vector<device_slot> devices, ledger_options opts,
                                     refusal* why) {
  auto fail = [&](std::string text) -> std::unique_ptr<ledger> {
    if (why) *why = {ec::invalid_configuration, std::move(text)};
    return nullptr;
  };
  if (devices.empty()) return fail("scheduler without devices");
  if (opts.max_transfers_per_link == 0) return fail("max_transfers_per_link must be at least 1");
  for (size_t d = 0; d < devices.size(); ++d)
    if (opts.kv_reserve_bytes >= devices[d].usable_bytes && opts.kv_reserve_bytes > 0)
      return fail("the KV reserve of " + std::to_string(opts.kv_reserve_bytes) +
                  " bytes leaves no room for weights on device " + std::to_string(d));
  // A fixed KV reserve is not the weights' to use.
  for (auto& d : devices) d.usable_bytes -= opts.kv_reserve_bytes;
  auto policy = make_eviction_policy(opts.policy, why);
  if (!policy) return nullptr;
  return std::unique_ptr<ledger>(
      new ledger(std::move(devices), std::move(opts), std::move(policy)));
}

ledger::ledger(std::vector<device_slot> devices, ledger_options opts,
               std::unique_ptr<eviction_policy> policy)
    : opts_(std::move(opts)), policy_(std::move(policy)) {
  for (auto& d : devices) {
    device_account a;
    a.slot = d;
    devices_.push_back(a);
  }
}

std::optional<model_id> ledger::add(const std::string& name, const placement& p, refusal* why) {
  auto fail = [&](ec code, std::string text) -> std::optional<model_id> {
    if (why) *why = {code, std::move(text)};
    return std::nullopt;
  };
  if (p.devices.empty() || p.devices.size() != p.bytes.size() ||
      (!p.kv_block_bytes.empty() && p.kv_block_bytes.size() != p.devices.size()))
    return fail(ec::invalid_configuration, "placement of " + name + " is malformed");
  std::set<int32_t> seen;
  for (auto d : p.devices) {
    if (d < 0 || static_cast<size_t>(d) >= devices_.size())
      return fail(ec::invalid_configuration,
                  "placement of " + name + " names device " + std::to_string(d));
    if (!seen.insert(d).second)
      return fail(ec::invalid_configuration,
                  "placement of " + name + " names device " + std::to_string(d) + " twice");
  }
  if (auto i = by_name_.find(name); i != by_name_.end()) {
    auto& m = models_[i->second];
    if (m.where.devices == p.devices && m.where.bytes == p.bytes &&
        m.where.kv_block_bytes == p.kv_block_bytes)
      return i->second;
    return fail(ec::invalid_state, "model " + name + " is registered with another placement");
  }
  std::optional<model_id> base;
  if (!p.base.empty()) {
    base = find(p.base);
    if (!base)
      return fail(ec::unknown_model,
                  "adapter " + name + " names base model " + p.base + ", which is not registered");
    auto& b = models_[*base];
    if (b.base)
      return fail(ec::invalid_configuration, "adapter " + name + " names " + p.base +
                                                 " as its base, which is an adapter itself");
    if (b.where.devices != p.devices)
      return fail(ec::invalid_configuration,
                  "adapter " + name + " must be placed on its base " + p.base + "'s devices");
  }
  model_entry m;
  m.name = name;
  m.where = p;
  m.pinned = p.pinned;
  m.base = base;
  for (auto b : p.bytes) m.total_bytes += b;
  auto id = static_cast<model_id>(models_.size());
  models_.push_back(std::move(m));
  by_name_.emplace(name, id);
  if (base) models_[*base].adapters.push_back(id);
  return id;
}

std::optional<model_id> ledger::find(const std::string& name) const {
  auto i = by_name_.find(name);
  if (i == by_name_.end()) return std::nullopt;
  return i->second;
}

int32_t ledger::lost_device(const model_entry& m) const {
  for (auto d : m.where.devices)
    if (devices_[static_cast<size_t>(d)].lost) return d;
  return -1;
}

model_state ledger::state_of(model_id id) const {
  auto& m = models_[id];
  return lost_device(m) >= 0 ? model_state::unavailable : m.state;
}

std::string ledger::unavailable_reason(model_id id) const {
  auto& m = models_[id];
  auto d = lost_device(m);
  if (d < 0) return {};
  return "model " + m.name + " is unavailable: device " + std::to_string(d) + " is unreachable";
}

std::vector<size_t> ledger::resident_per_device(size_t* resident_total) const {
  std::vector<size_t> per(devices_.size(), 0);
  size_t total = 0;
  for (auto& m : models_) {
    if (m.state != model_state::resident) continue;
    ++total;
    for (auto d : m.where.devices) ++per[static_cast<size_t>(d)];
  }
  if (resident_total) *resident_total = total;
  return per;
}

uint64_t ledger::free_bytes(size_t d) const {
  auto& a = devices_[d];
  // With a fixed KV reserve, KV is not the weights' concern (kv_budget.cpp accounts it).
  auto taken = a.used_bytes + (opts_.kv_reserve_bytes > 0 ? 0 : a.kv_bytes);
  return a.slot.usable_bytes > taken ? a.slot.usable_bytes - taken : 0;
}

acquire_result ledger::acquire(model_id id, time_point now) {
  auto& m = models_[id];
  if (lost_device(m) >= 0) return acquire_result::unavailable;
  if (m.prefetched) {
    m.prefetched = false;
    ++m.prefetch_hits;
  }
  // An adapter computes only with its base: a base that is not there (yet) is loaded
  // first, by the adapter's own pending load (pump).
  const bool base_ready =
      !m.base || models_[*m.base].state == model_state::resident ||
      (models_[*m.base].state == model_state::loading && models_[*m.base].computable);
  if (m.state == model_state::resident && !m.draining && base_ready) {
    grant(id, now);
    return acquire_result::granted;
  }
  if (m.state == model_state::loading && m.computable && base_ready) {
    grant(id, now);
    return acquire_result::granted;
  }
  if (m.state == model_state::resident) {  // draining: wait for the verdict
    ++m.held;
    return acquire_result::wait_drain;
  }
  want(id);
  return acquire_result::wait_load;
}

void ledger::grant(model_id id, time_point now) {
  auto& m = models_[id];
  ++m.leases;
  m.last_used = now;
  // An adapter's lease holds its base: no pass evicts the base under its rows.
  if (m.base) {
    ++models_[*m.base].leases;
    models_[*m.base].last_used = now;
  }
}

bool ledger::release(model_id id, time_point now, bool* last) {
  auto& m = models_[id];
  if (m.leases == 0) return false;
  --m.leases;
  m.last_used = now;
  if (m.base) {
    bool base_last = false;
    release(*m.base, now, &base_last);
    // The base's last lease ended with it: a pass may evict it now.
    if (last) *last = m.leases == 0 || base_last;
    return true;
  }
  if (last) *last = m.leases == 0;
  // What its pools last reported still counts: a batch's caches go on its workers after
  // its lease ends here, and their answers (kv_pool) say when the pages went.
  return true;
}

bool ledger::want(model_id id) {
  auto& m = models_[id];
  if (lost_device(m) >= 0) return false;
  m.wanted = true;
  if (m.state == model_state::loading || m.queued) return true;
  m.queued = true;
  pending_.push_back(id);
  return true;
}

bool ledger::retry_later(model_id id, time_point now) {
  auto& m = models_[id];
  const auto wait_ms =
      std::min<int64_t>(1000, int64_t{20} << std::min<uint32_t>(m.device_refusals, 6));
  ++m.device_refusals;
  m.retry_at = now + std::chrono::milliseconds{wait_ms};
  return want(id);
}

void ledger::note_demand(model_id id, uint32_t n, time_point now) {
  models_[id].demand.note(n, now);
}

void ledger::pin(model_id id, bool pinned) {
  models_[id].pinned = pinned;
}

std::optional<refusal> ledger::set_policy(const std::string& name) {
  refusal why;
  auto p = make_eviction_policy(name, &why);
  if (!p) return why;
  policy_ = std::move(p);
  opts_.policy = name;
  return std::nullopt;
}

std::optional<refusal> ledger::begin_unload(model_id id, bool* start_evict,
                                            std::vector<model_id>* with) {
  auto& m = models_[id];
  *start_evict = false;
  for (auto a : m.adapters)
    if (models_[a].state == model_state::loading)
      return refusal{ec::invalid_state, "adapter " + models_[a].name + " of " + m.name +
                                            " is loading; retry when it is resident"};
  if (m.state == model_state::offloaded || m.state == model_state::evicting) return std::nullopt;
  if (m.leases > 0)
    return refusal{ec::invalid_state, "model " + m.name + " has " + std::to_string(m.leases) +
                                          " batches in flight; retry when they end"};
  if (m.state == model_state::loading)
    return refusal{ec::invalid_state, "model " + m.name + " is loading; retry when it is resident"};
  for (auto a : m.adapters)
    if (models_[a].state == model_state::resident) {
      begin_evict(a);
      if (with) with->push_back(a);
    }
  begin_evict(id);
  *start_evict = true;
  return std::nullopt;
}

void ledger::begin_load(model_id id) {
  auto& m = models_[id];
  m.state = model_state::loading;
  m.queued = false;
  for (size_t i = 0; i < m.where.devices.size(); ++i) {
    auto& d = devices_[static_cast<size_t>(m.where.devices[i])];
    d.used_bytes += m.where.bytes[i];
    ++d.transfers;
    d.largest_free_bytes.reset();  // taken from it: unknown until the device reports again
  }
}

void ledger::begin_evict(model_id id) {
  models_[id].state = model_state::evicting;
  ++residency_epoch_;
}

void ledger::free_shards(model_entry& m) {
  for (size_t k = 0; k < m.where.devices.size(); ++k) {
    auto& d = devices_[static_cast<size_t>(m.where.devices[k])];
    d.used_bytes -= std::min(d.used_bytes, m.where.bytes[k]);
  }
}

bool ledger::load_started(model_id id, time_point now) {
  auto& m = models_[id];
  if (!opts_.compute_while_loading || m.state != model_state::loading) return false;
  m.computable = true;
  m.computable_since = now;
  return true;
}

double ledger::load_left_seconds(model_id id, time_point now) const {
  auto& m = models_[id];
  if (m.state != model_state::loading || !m.computable) return 0;
  return std::max(0.0, load_seconds(id) - seconds_between(m.computable_since, now));
}

void ledger::load_done(model_id id, time_point now) {
  auto& m = models_[id];
  m.computable = false;
  for (auto d : m.where.devices) --devices_[static_cast<size_t>(d)].transfers;
  m.state = model_state::resident;
  ++residency_epoch_;
  m.wanted = false;
  m.device_refusals = 0;
  m.retry_at.reset();
  ++m.loads;
  m.last_used = now;
}

void ledger::load_failed(model_id id) {
  auto& m = models_[id];
  m.computable = false;
  for (auto d : m.where.devices) --devices_[static_cast<size_t>(d)].transfers;
  free_shards(m);
  m.state = model_state::offloaded;
  m.wanted = false;
  m.prefetched = false;
}

void ledger::evict_done(model_id id) {
  auto& m = models_[id];
  m.prefetched = false;
  // No batch runs on an evicted model. Blocks it still holds are those of ended batches
  // whose caches are still being dropped: they count until those returns come, and its
  // pools' pages until their workers report them gone. (Cleared here, a return arriving
  // after a reload would take the new batches' blocks.)
  free_shards(m);
  m.state = model_state::offloaded;
  ++m.evictions;
}

void ledger::evict_failed(model_id id) {
  models_[id].state = model_state::resident;
  ++residency_epoch_;
}

void ledger::forget(model_id id) {
  auto& m = models_[id];
  free_kv(m, true);
  if (m.state == model_state::offloaded) return;
  free_shards(m);
  m.state = model_state::offloaded;
  ++residency_epoch_;
}

std::optional<refusal> ledger::remove(model_id id) {
  auto& m = models_[id];
  if (m.removed) return std::nullopt;
  if (m.state != model_state::offloaded || m.leases > 0 || m.queued || m.held > 0)
    return refusal{ec::invalid_state,
                   "model " + m.name + " is " +
                       (m.state != model_state::offloaded ? std::string{"still on its devices"}
                                                          : std::string{"in use"}) +
                       ": unload it and let its requests finish first"};
  std::string registered;
  for (auto a : m.adapters) registered += (registered.empty() ? "" : ", ") + models_[a].name;
  if (!registered.empty())
    return refusal{ec::invalid_state, "model " + m.name + " is the base of adapters " + registered +
                                          ": unregister them first"};
  if (m.base) {
    auto& siblings = models_[*m.base].adapters;
    siblings.erase(std::remove(siblings.begin(), siblings.end(), id), siblings.end());
  }
  by_name_.erase(m.name);
  // Its workers forget its shards, pools and all; a late report would not find its name.
  free_kv(m, false);
  m.removed = true;
  m.pinned = false;
  m.wanted = false;
  m.draining = false;
  return std::nullopt;
}

void ledger::note_largest_free(size_t device, uint64_t bytes) {
  if (device < devices_.size()) devices_[device].largest_free_bytes = bytes;
}

void ledger::note_transfer(size_t device, uint64_t bytes, double seconds) {
  if (device >= devices_.size() || bytes < (1u << 20) || !(seconds > 0)) return;
  auto& d = devices_[device];
  double gbps = static_cast<double>(bytes) / seconds / 1e9;
  // An average over loads, the newest weighing half: one slow load (a busy link) moves it,
  // but does not replace what the others measured.
  d.learned_link_gbps = d.learned_link_gbps > 0 ? 0.5 * (d.learned_link_gbps + gbps) : gbps;
}

double ledger::link_gbps(size_t device) const {
  const auto& d = devices_[device];
  if (d.slot.link_gbps > 0) return d.slot.link_gbps;
  if (d.learned_link_gbps > 0) return d.learned_link_gbps;
  return 10.0;  // unknown and never measured: as the victim policies assume
}

std::vector<model_id> ledger::lose(const std::vector<int32_t>& devs) {
  ++residency_epoch_;
  for (auto d : devs)
    if (d >= 0 && static_cast<size_t>(d) < devices_.size())
      devices_[static_cast<size_t>(d)].lost = true;
  std::vector<model_id> gone;
  for (model_id id = 0; id < models_.size(); ++id)
    if (models_[id].state == model_state::resident && lost_device(models_[id]) >= 0)
      gone.push_back(id);
  return gone;
}

void ledger::find_devices(const std::vector<int32_t>& devs) {
  ++residency_epoch_;
  for (auto d : devs)
    if (d >= 0 && static_cast<size_t>(d) < devices_.size())
      devices_[static_cast<size_t>(d)].lost = false;
}

double ledger::load_seconds(model_id id) const {
  auto& m = models_[id];
  double slowest = 0;
  for (size_t k = 0; k < m.where.devices.size(); ++k) {
    auto gbps = link_gbps(static_cast<size_t>(m.where.devices[k]));
    slowest = std::max(slowest, static_cast<double>(m.where.bytes[k]) / (gbps * 1e9));
  }
  return slowest;
}

std::string ledger::never_fits(model_id id) const {
  auto& m = models_[id];
  for (size_t i = 0; i < m.where.devices.size(); ++i) {
    auto d = static_cast<size_t>(m.where.devices[i]);
    uint64_t pinned = 0;
    for (auto& other : models_)
      if (&other != &m && other.pinned && other.state != model_state::offloaded)
        for (size_t k = 0; k < other.where.devices.size(); ++k)
          if (static_cast<size_t>(other.where.devices[k]) == d) pinned += other.where.bytes[k];
    // An adapter is resident only beside its base.
    auto need = m.where.bytes[i] + (m.base ? models_[*m.base].where.bytes[i] : 0);
    if (m.base && models_[*m.base].pinned && models_[*m.base].state != model_state::offloaded)
      pinned -= std::min(pinned, models_[*m.base].where.bytes[i]);
    if (need + pinned > devices_[d].slot.usable_bytes)
      return "model " + m.name + " needs " + std::to_string(need) +
             (m.base ? " bytes with its base " + models_[*m.base].name : std::string{" bytes"}) +
             " on device " + std::to_string(d) + ", which has " +
             std::to_string(devices_[d].slot.usable_bytes) + " usable bytes" +
             (pinned > 0 ? " of which pinned models hold " + std::to_string(pinned) : "");
  }
  return {};
}

}  // namespace computron::sched
