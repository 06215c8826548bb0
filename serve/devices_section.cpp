// The serve config's `devices` section: which devices, how many, their memory and links,
// and their gpu-lets (compute lanes with a share of the SMs).
#include "sched/gpulets.hpp"
#include "serve/json_fields.hpp"
#include "serve/sections.hpp"

namespace computron::serve {

namespace {

/// `gpulets`: "auto", or per device an array of shares (percent); and the planner's knobs.
caf::error read_gpulets(const nlohmann::json& d, const std::string& dw, sched::gpulet_config& g) {
  caf::error e;
  double replan_ms = g.replan_s * 1e3;
  if ((e = read(d, "gpulets_per_device", dw, g.plan.max_per_device)) ||
      (e = read(d, "gpulet_interference", dw, g.plan.interference)) ||
      (e = read(d, "gpulet_replan_ms", dw, replan_ms)) ||
      (e = read(d, "gpulet_shares", dw, g.plan.shares)))
    return e;
  g.replan_s = replan_ms / 1e3;
  auto it = d.find("gpulets");
  if (it == d.end()) return {};
  if (it->is_string()) {
    if (*it != "auto") return bad(dw, "gpulets must be \"auto\" or an array of shares per device");
    g.automatic = true;
    return {};
  }
  if (!it->is_array())
    return bad(dw,
               "gpulets must be \"auto\" or an array of shares per device, like [[50, 50], [100]]");
  g.partitions.clear();
  for (auto& p : *it) {
    if (!p.is_array())
      return bad(dw, "gpulets: each device's entry is an array of shares, not " + p.dump());
    std::vector<int32_t> shares;
    for (auto& v : p) {
      if (!fits<int32_t>(v))
        return bad(dw, "gpulets: a share is an integer percent, not " + v.dump());
      shares.push_back(v.get<int32_t>());
    }
    g.partitions.push_back(std::move(shares));
  }
  return {};
}

}  // namespace

caf::error read_devices(const nlohmann::json& file, const std::string& where, serve_config& c) {
  auto d = file.find("devices");
  if (d == file.end()) return {};
  auto dw = where + " devices";
  auto& devices = c.runtime.devices;
  caf::error e;
  if ((e = check_keys(
           *d, dw,
           {"kind", "count", "capacity_mb", "link_gbps", "prefault", "reserved_mb", "gpulets",
            "gpulets_per_device", "gpulet_interference", "gpulet_replan_ms", "gpulet_shares"})))
    return e;
  if ((e = read_gpulets(*d, dw, c.runtime.manager.gpulets))) return e;
  double cap = static_cast<double>(devices.emulated_capacity_bytes) / mib;
  double reserved = static_cast<double>(devices.cuda_reserved_bytes) / mib;
  if ((e = read(*d, "kind", dw, devices.kind)) || (e = read(*d, "count", dw, devices.count)) ||
      (e = read(*d, "capacity_mb", dw, cap)) ||
      (e = read(*d, "link_gbps", dw, devices.emulated_link_gbps)) ||
      (e = read(*d, "prefault", dw, devices.emulated_prefault)) ||
      (e = read(*d, "reserved_mb", dw, reserved)))
    return e;
  if (!(cap > 0) || !(devices.emulated_link_gbps > 0))
    return bad(dw, "capacity_mb and link_gbps must be positive");
  if ((e = mib_to_bytes(cap, dw, "capacity_mb", devices.emulated_capacity_bytes)) ||
      (e = mib_to_bytes(reserved, dw, "reserved_mb", devices.cuda_reserved_bytes)))
    return e;
  // On GPUs capacity_mb caps the weights' share only when it is given.
  if (d->contains("capacity_mb")) devices.cuda_capacity_bytes = devices.emulated_capacity_bytes;
  return {};
}

}  // namespace computron::serve
