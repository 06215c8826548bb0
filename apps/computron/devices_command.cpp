// `computron devices`: the devices this process would open, as a table or JSON.
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/computron/command.hpp"
#include "common/error.hpp"
#include "gpu/backends.hpp"

namespace computron::app {

namespace {

int run_devices(const gpu::device_options& opts, bool json) {
  auto devs = gpu::open_devices(opts);
  if (!devs) {
    std::cerr << "computron devices: " << render(devs.error()) << '\n';
    return exit_failure;
  }
  nlohmann::json list = nlohmann::json::array();
  for (auto& d : *devs) {
    auto& i = d->info();
    if (json) {
      list.push_back({{"name", i.name},
                      {"kind", gpu::to_string(i.kind)},
                      {"ordinal", i.ordinal},
                      {"capacity_bytes", i.capacity_bytes},
                      {"link_gbps", i.link_gbps}});
    } else {
      std::cout << fmt::format(
          "{:<32} {:>10.2f} GiB  link {}\n", i.name,
          static_cast<double>(i.capacity_bytes) / (1ull << 30),
          i.link_gbps > 0 ? fmt::format("{:.2f} GB/s", i.link_gbps) : std::string{"not measured"});
    }
  }
  if (json) std::cout << list.dump() << '\n';
  return 0;
}

struct devices_flags {
  gpu::device_options devices;
  bool json = false;
};

const registration devices_command{
    {"devices", "list the devices this process would use", 20, [](CLI::App& cmd) -> command_run {
       auto f = std::make_shared<devices_flags>();
       cmd.add_option("--kind", f->devices.kind, "auto, emulated or cuda")
           ->check(CLI::IsMember({"auto", "emulated", "cuda"}))
           ->capture_default_str();
       cmd.add_option("--count", f->devices.count, "number of devices (0: all GPUs / 1)")
           ->capture_default_str();
       cmd.add_flag("--json", f->json, "print a JSON array");
       return [f] { return run_devices(f->devices, f->json); };
     }}};

}  // namespace

}  // namespace computron::app
