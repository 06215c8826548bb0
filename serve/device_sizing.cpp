#include "serve/device_sizing.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace computron::serve {

caf::expected<std::string> size_devices_to_models(serve_config& cfg,
                                                  const actors::engine_registry& engines) {
  auto& d = cfg.runtime.devices;
  if (!cfg.size_devices_to_models || d.kind != "emulated" || !cfg.cluster.nodes.empty())
    return std::string{};
  uint64_t largest = 0;
  int32_t widest = 0;
  std::string largest_model;
  // The dtype "auto" becomes where the registry places the model: one of these devices.
  const std::vector<gpu::device_kind> kinds(static_cast<size_t>(std::max(d.count, 1)),
                                            gpu::device_kind::emulated);
  for (auto& given : cfg.models) {
    auto m = actors::resolve_dtype(given, kinds, true);
    auto e = engines.find(m.kind);
    if (e == engines.end()) continue;  // registration names the unknown kind
    widest = std::max(widest, m.tp * m.pp);
    for (int32_t k = 0; k < m.pp; ++k)
      for (int32_t r = 0; r < m.tp; ++r) {
        auto layout = e->second->layout(actors::shard_spec{m, r, k, {}});
        if (!layout) return layout.error();
        if (layout->total_bytes() > largest) {
          largest = layout->total_bytes();
          largest_model = m.name;
        }
      }
  }
  constexpr uint64_t mib = 1ull << 20;
  // KV blocks share a device's budget with the weights: room for half the shard again,
  // and at least 256 MiB (a few thousand positions of a small model).
  uint64_t want = largest + std::max(largest / 2, 256 * mib);
  want = (want + 64 * mib - 1) / (64 * mib) * (64 * mib);
  std::string changed;
  if (largest > 0 && want > d.emulated_capacity_bytes) {
    d.emulated_capacity_bytes = want;
    changed = fmt::format("{} MiB each (the largest shard, of {}, holds {} MiB)", want / mib,
                          largest_model, (largest + mib - 1) / mib);
  }
  if (widest > d.count) {
    d.count = widest;
    changed += (changed.empty() ? "" : "; ") + fmt::format("{} of them (tp x pp)", widest);
  }
  if (changed.empty()) return changed;
  return "emulated devices sized to the models: " + changed +
         " (--capacity-mb and --devices set them)";
}

}  // namespace computron::serve
