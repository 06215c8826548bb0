#include "net/cluster.hpp"

#include <filesystem>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "actors/join.hpp"
#include "actors/worker_guard.hpp"
#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::net {

using namespace std::chrono_literals;
using actors::node_actor;

caf::error validate(const tls_options& tls) {
  if (!tls.enabled()) return {};
  if (tls.certificate.empty() || tls.key.empty() || tls.cafile.empty())
    return make_error(ec::invalid_configuration,
                      "TLS needs a certificate, its key and the CA file that signed the peers' "
                      "certificates, all three");
  for (auto* f : {&tls.certificate, &tls.key, &tls.cafile}) {
    std::error_code err;
    if (!std::filesystem::is_regular_file(*f, err))
      return make_error(ec::invalid_configuration, "TLS file " + *f + " does not exist");
  }
  return {};
}

cluster_config::cluster_config(const tls_options& tls, const liveness_options& live) {
  load<caf::io::middleman>();
  if (tls.enabled()) {
    load<caf::openssl::manager>();
    openssl_certificate = tls.certificate;
    openssl_key = tls.key;
    openssl_cafile = tls.cafile;
    openssl_passphrase = tls.passphrase;
  }
  // Without a heartbeat a frozen peer is never noticed (CAF_0.17.md §5).
  set("middleman.heartbeat-interval", caf::timespan{live.heartbeat});
  set("middleman.connection-timeout", caf::timespan{live.timeout});
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

caf::error check_publish(const std::string& host, const tls_options& tls, bool allow_insecure) {
  if (auto err = validate(tls)) return err;
  if (!tls.enabled() && !is_loopback(host) && !allow_insecure)
    return make_error(ec::invalid_configuration,
                      "refusing to publish on " + host +
                          " without TLS: CAF's plain transport has no authentication and a "
                          "crafted header makes it allocate 4 GiB. Give --tls-certificate, "
                          "--tls-key and --tls-cafile, or (nodes) --insecure-public on a "
                          "network you trust");
  return {};
}

caf::error publish_error(const std::string& host, uint16_t port, const caf::error& why) {
  return make_error(ec::io_error,
                    "cannot publish on " + host + ":" + std::to_string(port) + ": " + render(why));
}

namespace {

caf::expected<node_actor> connect_node(caf::actor_system& sys, const node_address& a, bool tls) {
  auto r = tls ? caf::openssl::remote_actor<node_actor>(sys, a.host, a.port)
               : caf::io::remote_actor<node_actor>(sys, a.host, a.port);
  if (!r)
    return make_error(ec::unavailable, "cannot reach node " + a.str() + ": " + render(r.error()));
  return *r;
}

struct link_state {
  static constexpr const char* name = "node_link";
  node_address addr;
  bool tls = false;
  std::chrono::milliseconds interval{500};
  node_actor node;
  std::vector<actors::worker_guard_actor> guards;
  std::vector<int32_t> devices;
  actors::registry_actor registry;
  bool online = true;
  bool rebinding = false;
  uint64_t losses = 0;
  uint64_t rejoins = 0;
  std::string last_error;
};

using link_pointer = actors::node_link_actor::stateful_pointer<link_state>;

void watch(link_pointer self, node_actor n) {
  self->state.node = std::move(n);
  self->monitor(self->state.node);
}

actors::node_link_actor::behavior_type node_link(link_pointer self, link_state init) {
  self->state = std::move(init);
  watch(self, self->state.node);
  self->set_down_handler([=](caf::down_msg& m) {
    auto& st = self->state;
    if (m.source != st.node.address() || !st.online) return;
    st.online = false;
    ++st.losses;
    st.last_error = render(m.reason);
    log::warn("node {} is gone ({}): {} devices unavailable until it is back", st.addr.str(),
              st.last_error, st.devices.size());
    self->send(st.registry, actors::lost_atom_v, st.devices);
    self->delayed_send(self, st.interval, actors::tick_atom_v);
  });
  return {
      [=](actors::tick_atom) {
        auto& st = self->state;
        if (st.online || st.rebinding) return;
        auto retry = [=](std::string why) {
          auto& st = self->state;
          st.rebinding = false;
          st.last_error = std::move(why);
          log::debug("node {}: {}", st.addr.str(), st.last_error);
          self->delayed_send(self, st.interval, actors::tick_atom_v);
        };
        // This actor is detached: blocking here blocks nothing else.
        auto n = connect_node(self->system(), st.addr, st.tls);
        if (!n) return retry(render(n.error()));
        st.rebinding = true;
        auto node = *n;
        self->request(node, caf::timespan{10s}, actors::workers_atom_v)
            .then(
                [=](std::vector<actors::shard_worker_actor>& ws) mutable {
                  auto& st = self->state;
                  if (ws.size() != st.guards.size())
                    return retry("it came back with " + std::to_string(ws.size()) +
                                 " devices instead of " + std::to_string(st.guards.size()));
                  auto j = actors::make_join<bool>(
                      ws.size(),
                      [=](std::vector<bool>) mutable {
                        auto& st = self->state;
                        st.rebinding = false;
                        st.online = true;
                        ++st.rejoins;
                        watch(self, node);
                        log::info("node {} rejoined: {} devices serving again", st.addr.str(),
                                  st.devices.size());
                        self->send(st.registry, actors::found_atom_v, st.devices);
                      },
                      [=](caf::error e, size_t) mutable { retry(render(e)); });
                  for (size_t i = 0; i < ws.size(); ++i)
                    self->request(st.guards[i], caf::timespan{10min}, actors::rebind_atom_v, ws[i])
                        .then([=](bool ok) { j->ok(i, ok); },
                              [=](caf::error& e) { j->failed(std::move(e), i); });
                },
                [=](caf::error& e) mutable { retry(render(e)); });
      },
      [=](actors::report_atom) {
        auto& st = self->state;
        caf::settings s;
        s["node"] = caf::config_value{st.addr.str()};
        s["online"] = caf::config_value{st.online};
        s["tls"] = caf::config_value{st.tls};
        s["losses"] = caf::config_value{static_cast<int64_t>(st.losses)};
        s["rejoins"] = caf::config_value{static_cast<int64_t>(st.rejoins)};
        if (!st.last_error.empty()) s["last-error"] = caf::config_value{st.last_error};
        return s;
      },
  };
}

}  // namespace

void cluster::shutdown() {
  for (auto& l : links) caf::anon_send_exit(l, caf::exit_reason::user_shutdown);
  for (auto& g : guards) caf::anon_send_exit(g, caf::exit_reason::user_shutdown);
}

caf::expected<cluster> connect_cluster(caf::actor_system& sys, const cluster_options& opts) {
  if (opts.nodes.empty()) return make_error(ec::invalid_configuration, "a cluster without nodes");
  cluster c;
  caf::scoped_actor self{sys};
  for (auto& addr : opts.nodes) {
    auto until = std::chrono::steady_clock::now() + opts.connect_wait;
    caf::expected<node_actor> n = caf::error{};
    for (;;) {
      n = connect_node(sys, addr, opts.tls);
      if (n || std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(200ms);
    }
    if (!n) return n.error();
    caf::error err;
    std::vector<actors::device_report> reports;
    std::vector<actors::shard_worker_actor> workers;
    self->request(*n, caf::timespan{10s}, actors::devices_atom_v)
        .receive([&](std::vector<actors::device_report>& r) { reports = std::move(r); },
                 [&](caf::error& e) { err = e; });
    if (!err)
      self->request(*n, caf::timespan{10s}, actors::workers_atom_v)
          .receive([&](std::vector<actors::shard_worker_actor>& w) { workers = std::move(w); },
                   [&](caf::error& e) { err = e; });
    if (!err && (workers.empty() || workers.size() != reports.size()))
      err = make_error(ec::invalid_state, "node reported " + std::to_string(reports.size()) +
                                              " devices and " + std::to_string(workers.size()) +
                                              " workers");
    if (err) {
      c.shutdown();
      return make_error(ec::unavailable, "node " + addr.str() + ": " + render(err));
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      actors::worker_guard_options go;
      go.device_index = static_cast<int32_t>(c.devices.size());
      go.node = addr.str();
      auto g = actors::spawn_worker_guard(sys, workers[i], go);
      if (!g) {
        c.shutdown();
        return g.error();
      }
      c.guards.push_back(*g);
      c.devices.push_back(
          {caf::actor_cast<actors::shard_worker_actor>(*g), reports[i].capacity_bytes,
           reports[i].link_gbps,
           reports[i].kind == "cuda" ? gpu::device_kind::cuda : gpu::device_kind::emulated});
      c.device_nodes.push_back(addr.str());
    }
    c.nodes.push_back(*n);
    log::info("node {}: {} {} devices", addr.str(), workers.size(), reports.front().kind);
  }
  return c;
}

void watch_cluster(caf::actor_system& sys, cluster& c, const cluster_options& opts,
                   actors::registry_actor registry) {
  size_t first = 0;
  for (size_t k = 0; k < c.nodes.size(); ++k) {
    link_state init;
    init.addr = opts.nodes[k];
    init.tls = opts.tls;
    init.interval = opts.reconnect_interval;
    init.node = c.nodes[k];
    init.registry = registry;
    for (size_t i = first; i < c.device_nodes.size() && c.device_nodes[i] == init.addr.str(); ++i) {
      init.guards.push_back(c.guards[i]);
      init.devices.push_back(static_cast<int32_t>(i));
    }
    first += init.guards.size();
    c.links.push_back(sys.spawn<caf::detached>(node_link, std::move(init)));
  }
}

}  // namespace computron::net
