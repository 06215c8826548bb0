// KV blocks in the ledger: every running batch's keys and values count against the same
// per-device budget as the weights (issue 30). A model's blocks sit on every one of its
// shards (each caches all sequences for its own layers and heads), so one count per model
// times each shard's block bytes is what each device holds.
#include <algorithm>
#include <limits>

#include "sched/ledger.hpp"

namespace computron::sched {

namespace {

/// Blocks of `block_bytes` that fit in `bytes`.
uint64_t blocks_in(uint64_t bytes, uint64_t block_bytes) {
  return block_bytes == 0 ? std::numeric_limits<uint64_t>::max() : bytes / block_bytes;
}

}  // namespace

uint64_t ledger::kv_free_bytes(size_t d) const {
  auto& a = devices_[d];
  if (opts_.kv_reserve_bytes > 0)
    return opts_.kv_reserve_bytes > a.kv_bytes ? opts_.kv_reserve_bytes - a.kv_bytes : 0;
  return free_bytes(d);
}

uint64_t ledger::kv_room(model_id id) const {
  auto& m = models_[id];
  if (m.where.kv_block_bytes.empty()) return std::numeric_limits<uint64_t>::max();
  auto room = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < m.where.devices.size(); ++i)
    room = std::min(room, blocks_in(kv_free_bytes(static_cast<size_t>(m.where.devices[i])),
                                    m.where.kv_block_bytes[i]));
  return room;
}

bool ledger::kv_fits(model_id id, uint64_t blocks) const {
  return blocks <= kv_room(id);
}

uint64_t ledger::kv_charge(model_id id, size_t i) const {
  auto& m = models_[id];
  if (i >= m.where.kv_block_bytes.size()) return 0;
  auto granted = m.kv_blocks * m.where.kv_block_bytes[i];
  return i < m.kv_pool_bytes.size() ? std::max(granted, m.kv_pool_bytes[i]) : granted;
}

template <class F>
void ledger::recharge_kv(model_entry& m, F change) {
  auto id = static_cast<model_id>(&m - models_.data());
  std::vector<uint64_t> before;
  for (size_t i = 0; i < m.where.devices.size(); ++i) before.push_back(kv_charge(id, i));
  change();
  for (size_t i = 0; i < m.where.devices.size(); ++i) {
    auto& d = devices_[static_cast<size_t>(m.where.devices[i])];
    d.kv_bytes = d.kv_bytes - std::min(d.kv_bytes, before[i]) + kv_charge(id, i);
  }
}

void ledger::kv_take(model_id id, uint64_t blocks) {
  auto& m = models_[id];
  if (m.where.kv_block_bytes.empty() || blocks == 0) return;
  recharge_kv(m, [&] { m.kv_blocks += blocks; });
}

void ledger::kv_give(model_id id, uint64_t blocks) {
  auto& m = models_[id];
  blocks = std::min(blocks, m.kv_blocks);
  if (m.where.kv_block_bytes.empty() || blocks == 0) return;
  // The pools may hold the blocks' pages until the next step or the batch's end: what
  // they last reported counts until they report again (kv_pool).
  recharge_kv(m, [&] { m.kv_blocks -= blocks; });
}

bool ledger::kv_pool(model_id id, const std::vector<int32_t>& devices,
                     const std::vector<uint64_t>& bytes) {
  auto& m = models_[id];
  if (m.where.kv_block_bytes.empty()) return false;
  uint64_t before = 0, after = 0;
  for (size_t i = 0; i < m.where.devices.size(); ++i) before += kv_charge(id, i);
  recharge_kv(m, [&] {
    m.kv_pool_bytes.resize(m.where.devices.size(), 0);
    for (size_t k = 0; k < devices.size() && k < bytes.size(); ++k)
      for (size_t i = 0; i < m.where.devices.size(); ++i)
        if (m.where.devices[i] == devices[k]) m.kv_pool_bytes[i] = bytes[k];
  });
  for (size_t i = 0; i < m.where.devices.size(); ++i) after += kv_charge(id, i);
  return after < before;
}

void ledger::free_kv(model_entry& m, bool live_pools_stay) {
  // Its blocks go (its batches fail with its device), and what its pools last held on a
  // lost device. A pool on a device still here keeps its pages until its batches' caches
  // are dropped there, and the cancels' answers report that.
  recharge_kv(m, [&] {
    m.kv_blocks = 0;
    if (!live_pools_stay) {
      m.kv_pool_bytes.clear();
      return;
    }
    for (size_t i = 0; i < m.kv_pool_bytes.size() && i < m.where.devices.size(); ++i)
      if (devices_[static_cast<size_t>(m.where.devices[i])].lost) m.kv_pool_bytes[i] = 0;
  });
}

std::optional<std::vector<model_id>> ledger::kv_victims(model_id id, uint64_t blocks,
                                                        time_point now) const {
  auto& m = models_[id];
  std::vector<model_id> victims;
  if (m.where.kv_block_bytes.empty()) return victims;
  // A fixed reserve is all the KV there is: evicting weights frees none of it.
  if (opts_.kv_reserve_bytes > 0) return std::nullopt;
  std::map<size_t, int64_t> short_bytes;
  for (size_t i = 0; i < m.where.devices.size(); ++i) {
    auto d = static_cast<size_t>(m.where.devices[i]);
    auto need = static_cast<int64_t>(blocks * m.where.kv_block_bytes[i]) -
                static_cast<int64_t>(free_bytes(d));
    if (need > 0) short_bytes[d] = need;
  }
  if (short_bytes.empty()) return victims;
  // Evictions under way free their bytes soon: count them, so that a second ask while
  // they run does not pick more victims than it needs.
  for (auto& other : models_)
    if (other.state == model_state::evicting)
      for (size_t k = 0; k < other.where.devices.size(); ++k) {
        auto it = short_bytes.find(static_cast<size_t>(other.where.devices[k]));
        if (it != short_bytes.end()) it->second -= static_cast<int64_t>(other.where.bytes[k]);
      }
  std::vector<model_id> free_ones;
  for (model_id o = 0; o < models_.size(); ++o) {
    auto& other = models_[o];
    if (may_evict_for(o, id) && other.leases == 0 && !other.draining) free_ones.push_back(o);
  }
  if (!cover(free_ones, short_bytes, now, victims)) return std::nullopt;
  return with_adapters(victims);
}

void ledger::begin_kv_evictions(const std::vector<model_id>& victims) {
  for (auto v : victims) begin_evict(v);
}

bool ledger::kv_held_beside(model_id id) const {
  auto& m = models_[id];
  for (model_id o = 0; o < models_.size(); ++o) {
    if (o == id || models_[o].kv_blocks == 0) continue;
    for (auto d : models_[o].where.devices)
      if (std::find(m.where.devices.begin(), m.where.devices.end(), d) != m.where.devices.end())
        return true;
  }
  return false;
}

uint64_t ledger::kv_ceiling(model_id id) const {
  auto& m = models_[id];
  if (m.where.kv_block_bytes.empty()) return std::numeric_limits<uint64_t>::max();
  auto ceiling = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < m.where.devices.size(); ++i) {
    auto d = static_cast<size_t>(m.where.devices[i]);
    uint64_t pinned = 0;
    for (auto& other : models_)
      if (&other != &m && other.pinned && other.state != model_state::offloaded)
        for (size_t k = 0; k < other.where.devices.size(); ++k)
          if (static_cast<size_t>(other.where.devices[k]) == d) pinned += other.where.bytes[k];
    auto usable = devices_[d].slot.usable_bytes;
    auto left = opts_.kv_reserve_bytes > 0           ? opts_.kv_reserve_bytes
                : usable > m.where.bytes[i] + pinned ? usable - m.where.bytes[i] - pinned
                                                     : 0;
    ceiling = std::min(ceiling, blocks_in(left, m.where.kv_block_bytes[i]));
  }
  return ceiling;
}

}  // namespace computron::sched
