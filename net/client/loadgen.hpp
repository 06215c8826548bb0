#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "net/client/open_loop.hpp"
#include "workload/arrivals.hpp"
#include "workload/report.hpp"

/// `computron loadgen`'s engine: a workload schedule turned into KServe infer requests,
/// sent open-loop to a live server, and the server's own account of the run (swaps and
/// GB/s from /metrics, swap events from /v2/trace) joined to the client's.
namespace computron::net {

struct server_address {
  std::string host;
  uint16_t port = 0;
};

/// Parses "http://HOST:PORT[/]" (the port defaults to 80). Errors name what is wrong;
/// https is refused (the server speaks plain HTTP).
caf::expected<server_address> parse_url(const std::string& url);

struct served_model {
  std::string name;
  int64_t vocab = 0;
};

/// Waits up to `wait` for the server to answer ready, then lists its models. Errors:
/// io_error "cannot reach ..." with the last reason.
caf::expected<std::vector<served_model>> discover(const server_address& at,
                                                  std::chrono::milliseconds wait);

struct loadgen_options {
  server_address server;
  /// Defaults of arrivals that do not say (traces may).
  int64_t prompt_len = 8;
  int64_t max_tokens = 1;
  /// Non-zero: each request's deadline, and it asks to be dropped rather than served late.
  uint32_t deadline_ms = 0;
  /// Seeds the prompts' token ids.
  uint64_t seed = 1;
  size_t max_connections = 256;
  std::chrono::milliseconds request_timeout{300000};
  std::function<void(const open_loop_progress&)> on_progress;
  const std::atomic<bool>* cancel = nullptr;
};

struct loadgen_run {
  std::vector<workload::request_record> records;
  std::vector<workload::device_traffic> devices;
  std::vector<workload::swap_event> swaps;
};

/// Runs a schedule against the server. `models` is what discover() returned; every
/// model of the schedule must be among them (unknown_model otherwise, before anything
/// is sent). A server that refuses or dies shows up in the records, not as an error.
caf::expected<loadgen_run> run_loadgen(const workload::schedule& s,
                                       const std::vector<served_model>& models,
                                       const loadgen_options& opts);

/// The kind of a failed request ("http_429", "connect", "timeout", "io", "cancelled"),
/// empty for a success.
std::string error_kind(const timed_result& r);

/// Each device's transfer counters in a /metrics text (totals since the server started).
std::map<std::string, workload::device_traffic> device_traffic(const std::string& metrics_text);

/// Sums a metric's samples per value of `label` from Prometheus text (an absent label
/// sums under "").
std::map<std::string, double> prometheus_sum(const std::string& text, const std::string& metric,
                                             const std::string& label);

}  // namespace computron::net
