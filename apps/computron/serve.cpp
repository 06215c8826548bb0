#include "apps/computron/serve.hpp"

#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/controller.hpp"
#include "actors/opt_engine.hpp"
#include "common/error.hpp"
#include "common/json_file.hpp"
#include "common/log.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "engine/torch/gloo_collective.hpp"
#include "models/checkpoint.hpp"
#include "net/metrics.hpp"
#include "net/recent_stats.hpp"
#include "net/trace.hpp"
#include "serve/device_sizing.hpp"
#include "serve/overrides.hpp"

namespace computron::app {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// Blocks SIGINT and SIGTERM in every thread (CAF's and Asio's inherit the mask) so the
/// main thread can wait for them with sigwait.
sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

/// Bounds a graceful stop: once stopping, the process ends after `grace` at the latest
/// (exit status 2), with a line that says so. A stop can hang: once, under a loaded
/// test run, a controller waited forever in ~actor_system for a detached actor (CAF
/// 0.17's await_self_destroyed) after its node had gone, and, orphaned, held its port
/// and its test's pipe for 20 minutes. This ends such a stop as an orchestrator's
/// SIGKILL would, and says why. (Not a second signal: `timeout` and process-group
/// signals deliver one stop signal twice.)
void bound_the_stop(std::chrono::seconds grace) {
  std::thread([grace] {
    std::this_thread::sleep_for(grace);
    log::error("the stop took over {} s: exiting without waiting for it", grace.count());
    std::_Exit(2);
  }).detach();
}

constexpr std::chrono::seconds stop_grace{15};

}  // namespace

int run_serve(serve_config cfg) {
  auto stop_signals = block_stop_signals();
  // One max_tokens range: what the manager enforces, the HTTP routes say.
  cfg.http.max_tokens = cfg.runtime.manager.max_tokens_limit;
  if (cfg.compute_threads > 0) models::set_compute_threads(cfg.compute_threads);

  auto metrics = std::make_shared<net::metrics>();
  auto trace = std::make_shared<net::trace_recorder>();
  auto recent = std::make_shared<net::recent_stats>();
  cfg.runtime.obs = actors::combine({metrics, trace, recent});
  if (auto err = net::validate(cfg.tls)) {
    std::cerr << "computron serve: " << render(err) << '\n';
    return 1;
  }
  // The models' tokenizers, chat templates and generation defaults, opened here (this
  // thread) and by the registry's repository scans (its own thread), never on a
  // request's path.
  auto texts = std::make_shared<text::text_directory>();
  if (!cfg.repository.empty())
    cfg.runtime.registry.scan = [dir = cfg.repository, texts, served = cfg.served_name,
                                 flags = cfg.flags](const std::string& only) {
      auto folders = read_repository(dir, only, texts.get(), served);
      if (folders) {
        // serve's model flags hold for a folder read again as for the first time.
        for (auto& f : *folders)
          if (!f.error)
            if (auto why = serve::apply_model_flags(f.config, flags); !why.empty())
              f.error = make_error(ec::invalid_configuration, why);
        return std::move(*folders);
      }
      // The folder itself went away: one entry that says so.
      actors::repository_folder f;
      f.name = only.empty() ? dir : only;
      f.error = folders.error();
      return std::vector<actors::repository_folder>{f};
    };
  if (auto sized = serve::size_devices_to_models(cfg, actors::all_engines()); !sized) {
    std::cerr << "computron serve: " << render(sized.error()) << '\n';
    return 1;
  } else if (!sized->empty()) {
    log::info("{}", *sized);
  }
  net::cluster_config sys_cfg{cfg.tls};
  caf::actor_system sys{sys_cfg};
  caf::expected<actors::runtime> rt = caf::error{};
  net::cluster nodes;
  std::string where;
  if (cfg.cluster.nodes.empty()) {
    rt = actors::start_runtime(sys, cfg.runtime, actors::all_engines());
    if (rt)
      where = std::to_string(rt->devices.size()) + " " +
              gpu::to_string(rt->devices.front()->info().kind) + " devices";
  } else {
    cfg.cluster.tls = cfg.tls.enabled();
    auto c = net::connect_cluster(sys, cfg.cluster);
    if (!c) {
      std::cerr << "computron serve: " << render(c.error()) << '\n';
      return 1;
    }
    nodes = std::move(*c);
    cfg.runtime.registry.device_nodes = nodes.device_nodes;
    rt = actors::start_runtime_over(sys, cfg.runtime, actors::all_engines(), nodes.devices);
    if (rt) net::watch_cluster(sys, nodes, cfg.cluster, rt->registry);
    where = std::to_string(nodes.devices.size()) + " devices on " +
            std::to_string(nodes.nodes.size()) + " nodes";
  }
  if (!rt) {
    std::cerr << "computron serve: " << render(rt.error()) << '\n';
    nodes.shutdown();
    return 1;
  }
  size_t registered = 0;
  auto reg_start = std::chrono::steady_clock::now();
  for (auto& m : cfg.models)
    if (!m.tokenizer.empty())
      if (auto t = texts->open(m.tokenizer); !t)
        log::warn("model {}: its tokenizer cannot be read ({}); text requests will say so", m.name,
                  render(t.error()));
  {
    // Every model at once: their host copies fill in parallel (each worker fills its
    // shards over all cores, and the workers run side by side).
    caf::scoped_actor self{sys};
    using handle = decltype(self->request(rt->registry, caf::timespan{}, actors::register_atom_v,
                                          cfg.models.front()));
    // Models first, then LoRA adapters: an adapter registers beside its registered base.
    for (bool adapters : {false, true}) {
      std::vector<handle> pending;
      std::vector<const actors::model_config*> sent;
      for (auto& m : cfg.models)
        if (m.base.empty() != adapters) {
          pending.push_back(self->request(rt->registry, caf::timespan{std::chrono::hours(1)},
                                          actors::register_atom_v, m));
          sent.push_back(&m);
        }
      for (size_t i = 0; i < pending.size(); ++i)
        pending[i].receive([&](actors::model_info&) { ++registered; },
                           [&](caf::error& e) {
                             log::error("model {} not served: {}", sent[i]->name, render(e));
                           });
    }
  }
  auto reg_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - reg_start).count();
  // With a repository the operator can fix a folder and load it: start anyway.
  if (registered == 0 && !cfg.models.empty() && cfg.repository.empty()) {
    std::cerr << "computron serve: none of the " << cfg.models.size()
              << " models could be registered\n";
    rt->shutdown();
    nodes.shutdown();
    return 1;
  }
  auto srv =
      net::http_server::start(sys, rt->frontend, metrics, trace, cfg.http, rt->registry, texts);
  if (!srv) {
    std::cerr << "computron serve: " << render(srv.error()) << '\n';
    rt->shutdown();
    nodes.shutdown();
    return 1;
  }
  std::cout << "computron serve: listening on http://" << cfg.http.host << ':' << (*srv)->port()
            << " (" << registered << " models, " << where << ")" << std::endl;
  actors::controller_actor ctrl;
  if (cfg.console_port >= 0) {
    auto c = actors::spawn_controller(
        sys, rt->frontend, rt->scheduler,
        [trace](bool start, const std::string& path) -> caf::expected<std::string> {
          if (start) {
            trace->clear();
            return std::string{"tracing from now on"};
          }
          if (!trace->write(path)) return make_error(ec::io_error, "cannot write " + path);
          return "trace written to " + path + " on the controller's machine";
        },
        [recent] { return recent->summary(); });
    if (c) {
      ctrl = *c;
      // The same rules as a node's port: no plain CAF beyond loopback.
      auto port = net::publish_actor(ctrl, cfg.console_host,
                                     static_cast<uint16_t>(cfg.console_port), cfg.tls, false);
      if (port)
        std::cout << "computron serve: console on " << cfg.console_host << ':' << *port
                  << std::endl;
      else
        log::warn("no console port: {}", render(port.error()));
    } else {
      log::warn("no console: {}", render(c.error()));
    }
  }
  // Last, after every port is open: scripts may wait for this line.
  std::cout << "computron serve: ready (" << registered << " of " << cfg.models.size()
            << " models registered and warmed up in " << fmt::format("{:.1f}", reg_seconds) << " s)"
            << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  log::info("signal {}: stopping", sig);
  bound_the_stop(stop_grace);
  (*srv)->stop();
  if (!cfg.trace_file.empty() && !trace->write(cfg.trace_file))
    log::error("cannot write the trace to {}", cfg.trace_file);
  if (ctrl) caf::anon_send_exit(ctrl, caf::exit_reason::user_shutdown);
  nodes.shutdown();
  rt->shutdown();
  return 0;
}

int run_node(node_options opts) {
  auto stop_signals = block_stop_signals();
  if (opts.compute_threads > 0) models::set_compute_threads(opts.compute_threads);
  if (auto err = net::validate(opts.tls)) {
    std::cerr << "computron node: " << render(err) << '\n';
    return 2;
  }
  if (!opts.tls.enabled() && !net::is_loopback(opts.host) && !opts.insecure_public) {
    std::cerr << "computron node: refusing to listen on " << opts.host
              << " without TLS (CAF's plain transport has no authentication); give "
                 "--tls-certificate, --tls-key and --tls-cafile, or --insecure-public\n";
    return 2;
  }
  auto devs = gpu::open_devices(opts.devices);
  if (!devs) {
    std::cerr << "computron node: " << render(devs.error()) << '\n';
    return 1;
  }
  net::cluster_config sys_cfg{opts.tls};
  caf::actor_system sys{sys_cfg};
  actors::shard_worker_options wo;
  wo.groups = models::make_gloo_group_provider();
  wo.host = opts.host;
  wo.node = opts.host + ":" + std::to_string(opts.port);
  auto node = actors::spawn_node(sys, *devs, actors::all_engines(), wo);
  if (!node) {
    std::cerr << "computron node: " << render(node.error()) << '\n';
    return 1;
  }
  auto stop = [&] {
    caf::anon_send_exit(node->node, caf::exit_reason::user_shutdown);
    for (auto& w : node->workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  };
  auto port = net::publish_actor(node->node, opts.host, opts.port, opts.tls, opts.insecure_public);
  if (!port) {
    std::cerr << "computron node: " << render(port.error()) << '\n';
    stop();
    return 1;
  }
  std::cout << "computron node: listening on " << opts.host << ':' << *port << " (" << devs->size()
            << ' ' << gpu::to_string(devs->front()->info().kind) << " devices"
            << (opts.tls.enabled() ? ", TLS" : "") << ")" << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  log::info("signal {}: stopping", sig);
  bound_the_stop(stop_grace);
  stop();
  return 0;
}

int run_generate(const actors::model_config& cfg, const gpu::device_options& devices,
                 const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens,
                 const actors::row_sampling& sampling) {
  auto engines = actors::all_engines();
  auto devs = gpu::open_devices(devices);
  if (!devs) {
    std::cerr << "computron generate: " << render(devs.error()) << '\n';
    return 1;
  }
  std::vector<gpu::device_kind> kinds;
  for (auto& d : *devs) kinds.push_back(d->info().kind);
  auto placed = actors::resolve_dtype(cfg, kinds);
  if (placed.devices.empty())  // one model alone: its first tp x pp devices
    for (int32_t i = 0; i < placed.tp * placed.pp; ++i) placed.devices.push_back(i);
  if (auto err = actors::validate_model(engines, placed, kinds)) {
    std::cerr << "computron generate: " << render(err) << '\n';
    return 1;
  }
  auto out =
      actors::direct_generate(*engines.at(cfg.kind), placed, *devs, prompts, max_tokens, sampling);
  if (!out) {
    std::cerr << "computron generate: " << render(out.error()) << '\n';
    return 1;
  }
  std::cout << json(*out).dump() << '\n';
  return 0;
}

}  // namespace computron::app
