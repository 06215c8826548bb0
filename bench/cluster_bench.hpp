#pragma once

#include <cstdint>
#include <string>

#include <caf/expected.hpp>

/// `computron bench cluster`: what distribution costs. Real `computron node` processes on
/// 127.0.0.1, this process as the controller (CAF's middleman between them), emulated
/// devices and the toy model:
/// - the added latency of a remote hop (controller -> node -> reply), straight to the
///   remote actor and through the worker guard, against the same request in process;
/// - one forward step of a 2-stage model whose stages are on two nodes, against both
///   stages in process;
/// - the load of a 4-shard model whose shards are on 2 node processes (2 each), on 1
///   node process (4), and in process: GB/s of each.
namespace computron::bench {

struct cluster_bench_options {
  int hops = 2000;
  int steps = 300;
  /// Whole model bytes of the swap part, and the emulated link rate per device.
  uint64_t swap_bytes = 512ull << 20;
  double link_gbps = 2.0;
  int swap_repeats = 3;
};

struct latency_figures {
  double p50_ms = 0;
  double p99_ms = 0;
};

struct cluster_bench_result {
  latency_figures local_hop, remote_hop, guarded_hop;
  latency_figures local_step, spanning_step;
  double gbps_in_process = 0;
  double gbps_one_node = 0;
  double gbps_two_nodes = 0;
  /// gbps_two_nodes / gbps_in_process (the target: within 10% of 1).
  double two_nodes_ratio = 0;
};

caf::expected<cluster_bench_result> run_cluster_bench(const cluster_bench_options& opts);

std::string to_json(const cluster_bench_result& r);
std::string to_table(const cluster_bench_result& r);

}  // namespace computron::bench
