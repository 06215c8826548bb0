// The serve config's `devices` section: which devices, how many, their memory and links.
#include "serve/json_fields.hpp"
#include "serve/sections.hpp"

namespace computron::serve {

caf::error read_devices(const nlohmann::json& file, const std::string& where, serve_config& c) {
  auto d = file.find("devices");
  if (d == file.end()) return {};
  auto dw = where + " devices";
  auto& devices = c.runtime.devices;
  caf::error e;
  if ((e = check_keys(*d, dw, {"kind", "count", "capacity_mb", "link_gbps", "reserved_mb"})))
    return e;
  double cap = static_cast<double>(devices.emulated_capacity_bytes) / mib;
  double reserved = static_cast<double>(devices.cuda_reserved_bytes) / mib;
  if ((e = read(*d, "kind", dw, devices.kind)) || (e = read(*d, "count", dw, devices.count)) ||
      (e = read(*d, "capacity_mb", dw, cap)) ||
      (e = read(*d, "link_gbps", dw, devices.emulated_link_gbps)) ||
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
