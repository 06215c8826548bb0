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
  /// It has a tokenizer, so it speaks text (/v1/completions).
  bool tokenizer = false;
  /// Prompt plus output positions at most (0: not known).
  int64_t max_model_len = 0;
};

/// Waits up to `wait` for the server to answer and for the models a run drives to be
/// ready, then lists every ready model. `wanted` names the models the run drives; those
/// the server does not list are not waited for (the caller reports them as unknown).
/// Empty: every model the server was asked to serve, once none is still registering; a
/// model that failed is left out rather than waited for. Only the driven models count, so
/// a folder that failed elsewhere in the repository never blocks a run. Errors: io_error
/// "cannot reach a ready server ..." or "model M is not ready after S s: REASON".
caf::expected<std::vector<served_model>> discover(const server_address& at,
                                                  std::chrono::milliseconds wait,
                                                  const std::vector<std::string>& wanted = {});

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

/// The server's account of a run: its transfer counters before, and after the run the
/// transfers during it and when each swap happened (on the client's clock, whose zero is
/// `start`). A server that died mid-run has none to give; the records already say so.
struct server_account {
  /// Scrapes /metrics before the run.
  static server_account before(const server_address& at);
  void after(const server_address& at, std::chrono::steady_clock::time_point start,
             std::vector<workload::device_traffic>& devices,
             std::vector<workload::swap_event>& swaps) const;
  std::string metrics_before;
};

/// The message of an error answer: OpenAI's error.message, KServe's "error" string, else
/// the body itself (cut to 300 characters).
std::string error_message(const std::string& body);

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
