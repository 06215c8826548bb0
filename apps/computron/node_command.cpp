// `computron node`: its flags, then this machine's devices and shard workers for a
// controller (run_node, serve.cpp).
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/serve.hpp"

namespace computron::app {

namespace {

struct node_flags {
  node_options node;
  double capacity_mb = 256;
  double link_gbps = 2.0;
};

int run(node_flags f) {
  if (!(f.capacity_mb > 0) || !(f.link_gbps > 0)) {
    std::cerr << "computron node: --capacity-mb and --link-gbps must be positive\n";
    return exit_usage;
  }
  f.node.devices.emulated_capacity_bytes = mib_to_bytes(f.capacity_mb);
  f.node.devices.emulated_link_gbps = f.link_gbps;
  return run_node(f.node);
}

const registration node_command{
    {"node", "run this machine's devices and shard workers for a controller (serve --nodes)", 40,
     [](CLI::App& cmd) -> command_run {
       auto f = std::make_shared<node_flags>();
       auto& node = f->node;
       node.devices.kind = "auto";
       node.devices.count = 2;
       cmd.add_option("--host", node.host, "address to listen on")->capture_default_str();
       cmd.add_option("--port", node.port, "port to listen on (0 picks a free one)")
           ->capture_default_str();
       cmd.add_option("--kind", node.devices.kind, "auto, emulated or cuda")->capture_default_str();
       cmd.add_option("--devices", node.devices.count, "number of devices")
           ->capture_default_str()
           ->check(CLI::Range(1, 1024));
       cmd.add_option("--capacity-mb", f->capacity_mb, "emulated: memory per device")
           ->capture_default_str();
       cmd.add_option("--link-gbps", f->link_gbps, "emulated: link rate per device")
           ->capture_default_str();
       cmd.add_flag("--insecure-public", node.insecure_public,
                    "allow a non-loopback address without TLS (anyone reaching the port "
                    "controls the node)");
       add_tls_flags(cmd, node.tls);
       return [f] { return run(*f); };
     }}};

}  // namespace

}  // namespace computron::app
