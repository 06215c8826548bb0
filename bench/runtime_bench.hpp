#pragma once

#include <cstdint>
#include <string>

#include <caf/expected.hpp>

/// `computron bench runtime`: what the actor runtime and the HTTP API add. Three parts,
/// each measured in one run on emulated devices with the toy model (no torch compute):
/// the actor path's dispatch rate and added latency, HTTP requests per second with
/// keep-alive, and a swap-heavy load of a 4-shard model against the same bytes in 1 shard.
namespace computron::bench {

struct runtime_bench_options {
  /// Closed-loop clients for the dispatch-rate and HTTP parts.
  int clients = 16;
  double seconds = 3.0;
  /// Sequential requests timed for the added latency.
  int latency_requests = 300;
  /// Decode part: tokens each request generates, the rows of the larger batch, and the
  /// rounds (each a batch of 1 and one of `decode_rows`).
  int64_t decode_tokens = 256;
  int decode_rows = 8;
  int decode_repeats = 3;
  /// Whole model bytes of the swap part and the emulated link rate.
  uint64_t swap_bytes = 512ull << 20;
  double link_gbps = 2.0;
  int swap_repeats = 3;
  /// CAF's idle polling in the bench's actor system (actors/node.hpp): the default, or
  /// CAF's own, to compare the two in one binary.
  bool caf_polling = false;
};

struct runtime_bench_result {
  double batches_per_s = 0;
  double requests_per_s = 0;
  double mean_batch_rows = 0;
  double added_p50_ms = 0;
  double added_p99_ms = 0;
  /// Per decode step of a running batch: its wall time less its compute and queueing,
  /// over the tokens each row generated (median over rows and rounds).
  double decode_host_ms_1 = 0;
  double decode_host_ms_many = 0;
  int decode_rows = 0;
  double http_requests_per_s = 0;
  double http_p50_ms = 0;
  double load_4_shards_s = 0;
  double load_1_shard_s = 0;
  double swap_speedup = 0;
  bool caf_polling = false;
};

caf::expected<runtime_bench_result> run_runtime_bench(const runtime_bench_options& opts);

/// One JSON object, or a readable table.
std::string to_json(const runtime_bench_result& r);
std::string to_table(const runtime_bench_result& r);

}  // namespace computron::bench
