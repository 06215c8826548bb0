#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/io/publish.hpp>
#include <caf/openssl/publish.hpp>

#include "actors/interfaces.hpp"
#include "actors/node.hpp"
#include "actors/swap_scheduler.hpp"

/// Computron across processes and machines: `computron node` publishes a node actor
/// with CAF's middleman; the controller connects to every node and uses the same typed
/// actors remotely (CAF_0.17.md §5 lists what this CAF does and does not do on the
/// network, and this file is built around it).
namespace computron::net {

/// Certificates for CAF's OpenSSL transport. Empty: plain BASP (loopback only).
struct tls_options {
  std::string certificate;
  std::string key;
  std::string cafile;
  std::string passphrase;
  bool enabled() const { return !certificate.empty() || !key.empty() || !cafile.empty(); }
};

/// Checks that the files exist and come as a certificate-key pair.
caf::error validate(const tls_options& tls);

/// How fast a frozen peer is noticed: the middleman's heartbeat and the silence after
/// which a connection counts as dead (on both sides).
struct liveness_options {
  std::chrono::milliseconds heartbeat{200};
  std::chrono::milliseconds timeout{1000};
};

/// The actor system config of every process of a cluster: Computron's message types,
/// the middleman, OpenSSL when `tls` is enabled, and the heartbeat.
struct cluster_config : actors::system_config {
  explicit cluster_config(const tls_options& tls = {}, const liveness_options& live = {});
};

struct node_address {
  std::string host;
  uint16_t port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

/// "host:port" (an IPv6 host in brackets). Errors name the text.
caf::expected<node_address> parse_node_address(const std::string& text);

/// "a:1,b:2". Errors: an empty list, a bad entry, a duplicate.
caf::expected<std::vector<node_address>> parse_node_list(const std::string& text);

/// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback(const std::string& host);

/// Whether `host` may be published on: plain BASP has no authentication and a crafted
/// header makes it allocate 4 GiB, so any host but loopback needs TLS, unless
/// `allow_insecure` says the operator knows better. Also checks the TLS files.
caf::error check_publish(const std::string& host, const tls_options& tls, bool allow_insecure);

/// The error of a failed publish, naming the address.
caf::error publish_error(const std::string& host, uint16_t port, const caf::error& why);

/// Publishes `whom` (a node, the controller's console actor) on `host`:`port` (0: any
/// free port), with TLS when `tls` is enabled; returns the port.
template <class Handle>
caf::expected<uint16_t> publish_actor(const Handle& whom, const std::string& host, uint16_t port,
                                      const tls_options& tls, bool allow_insecure) {
  if (auto err = check_publish(host, tls, allow_insecure)) return err;
  // SO_REUSEADDR: a restarted process gets its port back at once.
  auto r = tls.enabled() ? caf::openssl::publish(whom, port, host.c_str(), true)
                         : caf::io::publish(whom, port, host.c_str(), true);
  if (!r) return publish_error(host, port, r.error());
  return *r;
}

struct cluster_options {
  std::vector<node_address> nodes;
  bool tls = false;
  /// Waiting for each node at start at most (nodes may start after the controller).
  std::chrono::milliseconds connect_wait{std::chrono::seconds(20)};
  /// Between two reconnection attempts to a lost node.
  std::chrono::milliseconds reconnect_interval{std::chrono::milliseconds(500)};
};

/// The nodes as the controller holds them. Global device index = position in `devices`
/// (the nodes' devices in the order the nodes are listed).
struct cluster {
  std::vector<actors::scheduler_device> devices;
  /// The node of each device (host:port), for cross-node tensor-parallel groups.
  std::vector<std::string> device_nodes;
  std::vector<actors::worker_guard_actor> guards;
  std::vector<actors::node_actor> nodes;
  std::vector<actors::node_link_actor> links;
  /// Asks the links and guards to exit.
  void shutdown();
};

/// Connects to every node (retrying until `connect_wait`), asks for its devices and
/// workers, and puts a guard in front of each worker. Errors name the node.
caf::expected<cluster> connect_cluster(caf::actor_system& sys, const cluster_options& opts);

/// Starts watching the nodes: a node that dies or freezes has its devices reported lost
/// to `registry` (which tells the scheduler; the guards already fail what was in
/// flight); the link reconnects every `reconnect_interval`, rebinds the guards to the
/// restarted node's workers, and reports the devices found (the registry tells the
/// scheduler and re-forms the tensor-parallel groups that span nodes).
void watch_cluster(caf::actor_system& sys, cluster& c, const cluster_options& opts,
                   actors::registry_actor registry);

}  // namespace computron::net
