// serve's flags over the serve config: the base config they start from, then each flag.
#include "serve/overrides.hpp"

#include <cmath>
#include <cstdint>

#include "common/error.hpp"
#include "serve/repository.hpp"

namespace computron::serve {

caf::expected<serve_config> base_serve_config(const serve_overrides& o) {
  // --repository is served instead of the config's `repository`, its models beside the
  // config's inline ones; without --config it replaces the built-in models.
  if (!o.config_path.empty()) return load_serve_config(o.config_path, o.repository);
  auto cfg = default_serve_config();
  if (!o.repository.empty()) {
    cfg.models.clear();
    if (auto err = add_repository(cfg, o.repository)) return err;
  }
  return cfg;
}

std::string apply_overrides(serve_config& cfg, const serve_overrides& o) {
  if (o.capacity_mb > 0) {
    // Emulated memory only: a GPU's memory is what it is (the config's
    // devices.capacity_mb caps its weights arena), and nodes bring their own devices.
    if (cfg.runtime.devices.kind != "emulated")
      return "--capacity-mb sets the memory of emulated devices, and the devices are '" +
             cfg.runtime.devices.kind +
             "' (set devices.kind to emulated, or cap a GPU's weights arena with "
             "devices.capacity_mb in the config)";
    if (!o.nodes.empty() || !cfg.cluster.nodes.empty())
      return "--capacity-mb sets this process's emulated devices, and it serves with nodes "
             "(give each `computron node` --capacity-mb)";
    cfg.runtime.devices.emulated_capacity_bytes =
        static_cast<uint64_t>(std::llround(o.capacity_mb * 1048576.0));
  }
  if (!o.host.empty()) cfg.http.host = o.host;
  if (o.port >= 0) cfg.http.port = static_cast<uint16_t>(o.port);
  if (o.devices > 0) cfg.runtime.devices.count = o.devices;
  if (!o.trace_file.empty()) cfg.trace_file = o.trace_file;
  if (!o.api_key.empty()) cfg.http.api_key = o.api_key;
  if (!o.nodes.empty()) {
    auto nodes = net::parse_node_list(o.nodes);
    if (!nodes) return render(nodes.error());
    cfg.cluster.nodes = std::move(*nodes);
  }
  if (o.tls.enabled()) cfg.tls = o.tls;
  if (o.console_port >= -1) cfg.console_port = o.console_port;
  return {};
}

}  // namespace computron::serve
