#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "workload/stats.hpp"

/// What a load run measured, summarised per model and overall, and written out for
/// people: a table, one JSON object, and a report folder (JSON, a CSV of every request,
/// a latency CDF and a timeline of requests and swaps as SVG).
namespace computron::workload {

/// One request as the client saw it. Times are seconds from the run's start.
struct request_record {
  std::string model;
  /// When it was due (its latency counts from here: open loop), written, and finished.
  double arrival_s = 0;
  double sent_s = -1;
  double done_s = -1;
  /// HTTP status, 0 when no answer.
  int status = 0;
  /// Empty for a success; else "http_429", "connect", "timeout", "io", "cancelled"...
  std::string error_kind;
  std::string error;
  /// The server's own breakdown (KServe response parameters) of a success.
  bool swapped = false;
  double queue_ms = 0;
  double load_ms = 0;
  double compute_ms = 0;

  bool ok() const { return status == 200 && error_kind.empty(); }
  bool sent() const { return sent_s >= 0; }
  double latency_s() const { return done_s - arrival_s; }
};

/// A load or eviction of one shard, on the client's clock.
struct swap_event {
  std::string model;
  int32_t device = 0;
  bool load = true;
  double start_s = 0;
  double seconds = 0;
  uint64_t bytes = 0;
};

/// One device's transfers during the run (from /metrics, after minus before).
struct device_traffic {
  std::string device;
  double shard_loads = 0;
  double evictions = 0;
  double bytes_loaded = 0;
  double load_seconds = 0;
  double evict_seconds = 0;
  double gbps() const { return load_seconds > 0 ? bytes_loaded / load_seconds / 1e9 : 0; }
};

struct group_summary {
  /// Requests sent, answered 200, and failed (sent = ok + failed).
  size_t sent = 0;
  size_t ok = 0;
  size_t failed = 0;
  /// Successful requests per second of the run.
  double throughput_rps = 0;
  /// Over the successes.
  latency_summary latency;
  /// Successes within the SLO over all sent (a failure misses it); 1 without an SLO.
  double slo_attainment = 1;
  /// Successes that waited for a swap.
  size_t swapped = 0;
  std::map<std::string, size_t> errors;
};

struct run_summary {
  std::vector<std::string> models;
  std::vector<group_summary> per_model;
  group_summary overall;
  /// Scheduled but never sent (a cancelled run).
  size_t unsent = 0;
  /// From the start to the last answer.
  double wall_s = 0;
  double slo_s = 0;
  std::vector<device_traffic> devices;
};

run_summary summarize_run(const std::vector<std::string>& models,
                          const std::vector<request_record>& records, double slo_s,
                          std::vector<device_traffic> devices);

/// The summary as one JSON object: sent, ok, failed, unsent, wall_s, slo_s,
/// overall{...}, models{name: {...}}, errors{kind: n}, swaps{...}; latencies in
/// seconds (mean_s, p50_s, p90_s, p99_s, max_s). `extra` (a JSON object, may be empty)
/// is merged in, for the workload's description.
std::string to_json(const run_summary& s, const std::string& extra = {});

/// A table for a terminal.
std::string to_table(const run_summary& s);

/// Writes summary.json (to_json), requests.csv, latency_cdf.svg and timeline.svg into
/// `dir` (created). Errors: io_error naming the file.
caf::error write_report(const std::string& dir, const run_summary& s,
                        const std::vector<request_record>& records,
                        const std::vector<swap_event>& swaps, const std::string& extra = {});

/// The two pictures, as SVG documents.
std::string latency_cdf_svg(const std::vector<std::string>& models,
                            const std::vector<request_record>& records);
std::string timeline_svg(const std::vector<std::string>& models,
                         const std::vector<request_record>& records,
                         const std::vector<swap_event>& swaps);

}  // namespace computron::workload
