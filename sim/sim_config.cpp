// The simulator's configuration: the cost model's profiles, its load times, and the
// checks a config passes before a run (simulator.cpp runs it).
#include <algorithm>
#include <cmath>
#include <string>

#include "sim/simulator.hpp"

#include "common/error.hpp"

namespace computron::sim {

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

caf::error check(const sim_config& cfg) {
  auto bad = [](std::string why) { return make_error(ec::invalid_configuration, std::move(why)); };
  if (cfg.devices.empty()) return bad("no devices");
  for (size_t d = 0; d < cfg.devices.size(); ++d) {
    if (cfg.devices[d].capacity_bytes <= cfg.workspace_bytes)
      return bad("device " + std::to_string(d) + " has no room beside its workspace");
    if (!(cfg.devices[d].link_gbps > 0) || !std::isfinite(cfg.devices[d].link_gbps))
      return bad("device " + std::to_string(d) + " needs a positive link_gbps");
  }
  std::set<std::string> names;
  for (auto& m : cfg.models) {
    if (!names.insert(m.name).second) return bad("model " + m.name + " is named twice");
    if (m.tp < 1 || m.pp < 1 || m.devices.size() != static_cast<size_t>(m.tp * m.pp) ||
        m.shard_bytes.size() != m.devices.size())
      return bad("model " + m.name + " needs tp x pp devices and a size per shard");
    if (!(m.step_s >= 0) || !(m.step_per_token_s >= 0))
      return bad("model " + m.name + " has a negative compute time");
    if (m.layers < 1) return bad("model " + m.name + " needs at least one layer per stage");
    if (!m.kv_block_bytes.empty() && m.kv_block_bytes.size() != m.devices.size())
      return bad("model " + m.name + " needs a KV block size per shard, or none");
    if (!m.base.empty()) {
      // An adapter runs in its base's batches: the base is a whole model listed before it,
      // on the same devices.
      auto b = std::find_if(cfg.models.begin(), cfg.models.end(),
                            [&](auto& x) { return x.name == m.base; });
      if (b == cfg.models.end() || b >= std::find_if(cfg.models.begin(), cfg.models.end(),
                                                     [&](auto& x) { return &x == &m; }))
        return bad("adapter " + m.name + " names base " + m.base +
                   ", which is not listed before it");
      if (!b->base.empty())
        return bad("adapter " + m.name + "'s base " + m.base + " is an adapter");
      if (b->devices != m.devices || b->tp != m.tp || b->pp != m.pp)
        return bad("adapter " + m.name + " must run on its base " + m.base + "'s devices");
      if (!m.kv_block_bytes.empty()) return bad("adapter " + m.name + " keeps no KV of its own");
    }
  }
  auto& c = cfg.cost;
  for (double x : {c.link_efficiency, c.load_overhead_s, c.evict_s, c.stage_overhead_s,
                   c.request_overhead_s, c.lease_overhead_s})
    if (!(x >= 0) || !std::isfinite(x)) return bad("cost model values must be finite and >= 0");
  if (!(c.link_efficiency > 0) || c.link_efficiency > 1)
    return bad("link_efficiency must be in (0, 1]");
  if (cfg.prompt_len < 1 || cfg.max_tokens < 1)
    return bad("prompt_len and max_tokens must be >= 1");
  return {};
}

}  // namespace computron::sim
