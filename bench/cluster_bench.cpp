#include "bench/cluster_bench.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/node.hpp"
#include "common/child_process.hpp"
#include "common/error.hpp"
#include "net/cluster.hpp"

namespace computron::bench {

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using namespace computron::actors;

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

latency_figures figures(std::vector<double> ms) {
  if (ms.empty()) return {};
  std::sort(ms.begin(), ms.end());
  auto at = [&](double p) {
    return ms[std::min(ms.size() - 1,
                       static_cast<size_t>(p * static_cast<double>(ms.size() - 1) + 0.5))];
  };
  return {at(0.5), at(0.99)};
}

/// A `computron node` child process of this binary.
struct node_child {
  std::unique_ptr<child_process> proc;
  net::node_address addr;
};

caf::expected<node_child> start_node(int devices, uint64_t capacity_bytes, double link_gbps) {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return make_error(ec::io_error, "cannot find this binary to start nodes");
  node_child n;
  n.proc = std::make_unique<child_process>(
      std::vector<std::string>{exe.string(), "--log-level", "warn", "node", "--port", "0", "--kind",
                               "emulated", "--devices", std::to_string(devices), "--capacity-mb",
                               fmt::format("{}", static_cast<double>(capacity_bytes) / 1048576.0),
                               "--link-gbps", fmt::format("{}", link_gbps)});
  auto line = n.proc->read_line(60s);
  auto at = line ? line->find("listening on ") : std::string::npos;
  if (at == std::string::npos) return make_error(ec::io_error, "a node did not start");
  auto addr = net::parse_node_address(line->substr(at + 13, line->find(' ', at + 13) - at - 13));
  if (!addr) return addr.error();
  n.addr = *addr;
  return n;
}

model_config toy(const std::string& name, int tp, int pp, std::vector<int32_t> devices,
                 uint64_t shard_bytes) {
  model_config m;
  m.name = name;
  m.kind = "toy";
  m.tp = tp;
  m.pp = pp;
  m.devices = std::move(devices);
  m.toy_shard_bytes = shard_bytes;
  return m;
}

/// One request, waited for; its result is dropped (only time and errors matter here).
template <class Result, class Handle, class... Ts>
caf::error ask(caf::scoped_actor& self, const Handle& h, Ts... xs) {
  caf::error err;
  self->request(h, caf::timespan{10min}, xs...)
      .receive([](Result&) {}, [&](caf::error& e) { err = e; });
  return err;
}

/// Median seconds of loading `model` (each load after an unload; the first round only
/// faults memory in).
caf::expected<double> median_load(caf::scoped_actor& self, const runtime& rt,
                                  const std::string& model, int repeats) {
  std::vector<double> ts;
  for (int i = 0; i < repeats + 1; ++i) {
    auto t0 = clock_type::now();
    if (auto err = ask<model_info>(self, rt.manager, load_atom_v, model)) return err;
    if (i > 0) ts.push_back(since(t0));
    if (auto err = ask<model_info>(self, rt.manager, unload_atom_v, model)) return err;
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

template <class Handle>
caf::expected<latency_figures> hops(caf::scoped_actor& self, const Handle& h, int n) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    auto t0 = clock_type::now();
    if (auto err = ask<device_report>(self, h, devices_atom_v)) return err;
    ms.push_back(since(t0) * 1e3);
  }
  return figures(std::move(ms));
}

caf::expected<latency_figures> steps(caf::scoped_actor& self, const runtime& rt, int n) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    infer_request r;
    r.model = "span";
    r.tokens = {1, 2, 3, 4};
    r.max_tokens = 1;
    auto t0 = clock_type::now();
    if (auto err = ask<infer_reply>(self, rt.frontend, infer_atom_v, r)) return err;
    ms.push_back(since(t0) * 1e3);
  }
  return figures(std::move(ms));
}

runtime_options bench_runtime(const cluster_bench_options& o) {
  runtime_options ro;
  ro.devices.kind = "emulated";
  ro.devices.count = 4;
  ro.devices.emulated_capacity_bytes = o.swap_bytes / 4 + (64ull << 20);
  ro.devices.emulated_link_gbps = o.link_gbps;
  ro.manager.batching.batch_window = 0ms;
  return ro;
}

/// Registers the swap model ("four": 4 shards on devices 0-3) and the 2-stage model
/// ("span": stages on devices 1 and 2), then loads "four" and returns its GB/s.
caf::expected<double> swap_gbps(caf::scoped_actor& self, const runtime& rt,
                                const cluster_bench_options& o) {
  if (auto err = ask<model_info>(self, rt.registry, register_atom_v,
                                 toy("four", 4, 1, {0, 1, 2, 3}, o.swap_bytes / 4)))
    return err;
  if (auto err =
          ask<model_info>(self, rt.registry, register_atom_v, toy("span", 1, 2, {1, 2}, 1 << 20)))
    return err;
  auto t = median_load(self, rt, "four", o.swap_repeats);
  if (!t) return t.error();
  return static_cast<double>(o.swap_bytes) / *t / 1e9;
}

}  // namespace

caf::expected<cluster_bench_result> run_cluster_bench(const cluster_bench_options& o) {
  if (o.hops < 1 || o.steps < 1 || o.swap_repeats < 1 || o.swap_bytes < (4u << 20) ||
      !(o.link_gbps > 0))
    return make_error(ec::invalid_request,
                      "hops, steps and repeats must be positive, the link too; swap >= 4 MiB");
  cluster_bench_result res;
  net::cluster_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto ro = bench_runtime(o);
  const auto capacity = ro.devices.emulated_capacity_bytes;

  // In process: the reference of every figure.
  {
    auto rt = start_runtime(sys, ro, torch_free_engines());
    if (!rt) return rt.error();
    auto g = swap_gbps(self, *rt, o);
    if (!g) return g.error();
    res.gbps_in_process = *g;
    auto h = hops(self, rt->node.workers[0], o.hops);
    if (!h) return h.error();
    res.local_hop = *h;
    auto s = steps(self, *rt, o.steps);
    if (!s) return s.error();
    res.local_step = *s;
    rt->shutdown();
  }
  // Over nodes: one node process with 4 devices, then two with 2 each.
  for (int nodes : {1, 2}) {
    std::vector<node_child> children;
    net::cluster_options co;
    for (int k = 0; k < nodes; ++k) {
      auto n = start_node(4 / nodes, capacity, o.link_gbps);
      if (!n) return n.error();
      co.nodes.push_back(n->addr);
      children.push_back(std::move(*n));
    }
    auto c = net::connect_cluster(sys, co);
    if (!c) return c.error();
    auto rro = ro;
    rro.registry.device_nodes = c->device_nodes;
    auto rt = start_runtime_over(sys, rro, torch_free_engines(), c->devices);
    if (!rt) return rt.error();
    auto g = swap_gbps(self, *rt, o);
    if (!g) return g.error();
    (nodes == 1 ? res.gbps_one_node : res.gbps_two_nodes) = *g;
    if (nodes == 2) {
      std::vector<shard_worker_actor> workers;
      caf::error err;
      self->request(c->nodes[0], caf::timespan{10s}, workers_atom_v)
          .receive([&](std::vector<shard_worker_actor>& ws) { workers = std::move(ws); },
                   [&](caf::error& e) { err = e; });
      if (err) return err;
      auto remote = hops(self, workers.at(0), o.hops);
      if (!remote) return remote.error();
      res.remote_hop = *remote;
      auto guarded = hops(self, c->guards[0], o.hops);
      if (!guarded) return guarded.error();
      res.guarded_hop = *guarded;
      auto s = steps(self, *rt, o.steps);
      if (!s) return s.error();
      res.spanning_step = *s;
    }
    rt->shutdown();
    c->shutdown();
  }
  res.two_nodes_ratio = res.gbps_in_process > 0 ? res.gbps_two_nodes / res.gbps_in_process : 0;
  return res;
}

std::string to_json(const cluster_bench_result& r) {
  auto lat = [](const latency_figures& f) {
    return nlohmann::json{{"p50_ms", f.p50_ms}, {"p99_ms", f.p99_ms}};
  };
  return nlohmann::json{
      {"local_hop", lat(r.local_hop)},         {"remote_hop", lat(r.remote_hop)},
      {"guarded_hop", lat(r.guarded_hop)},     {"local_step", lat(r.local_step)},
      {"spanning_step", lat(r.spanning_step)}, {"gbps_in_process", r.gbps_in_process},
      {"gbps_one_node", r.gbps_one_node},      {"gbps_two_nodes", r.gbps_two_nodes},
      {"two_nodes_ratio", r.two_nodes_ratio}}
      .dump();
}

std::string to_table(const cluster_bench_result& r) {
  auto row = [](const char* what, const latency_figures& f) {
    return fmt::format("{:<44} p50 {:7.3f} ms  p99 {:7.3f} ms\n", what, f.p50_ms, f.p99_ms);
  };
  return row("hop in process (devices request)", r.local_hop) +
         row("hop to a node (remote actor, loopback)", r.remote_hop) +
         row("hop to a node through its guard", r.guarded_hop) +
         row("2-stage step, stages in process", r.local_step) +
         row("2-stage step, stages on two nodes", r.spanning_step) +
         fmt::format(
             "4-shard load: in process {:.3f} GB/s, 1 node {:.3f} GB/s, 2 nodes {:.3f} "
             "GB/s (2 nodes / in process = {:.3f})\n",
             r.gbps_in_process, r.gbps_one_node, r.gbps_two_nodes, r.two_nodes_ratio);
}

}  // namespace computron::bench
