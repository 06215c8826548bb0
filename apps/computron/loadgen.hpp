#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "workload/arrivals.hpp"

/// `computron loadgen`: an open-loop workload against a running server, with a progress
/// bar, a summary (table or JSON) and an optional report folder.
namespace computron::app {

struct loadgen_cli {
  std::string url = "http://127.0.0.1:8000";
  /// Comma lists; empty models means every model the server has.
  std::string models;
  std::string rates;
  double cv = 1.0;
  double duration_s = 30;
  uint64_t seed = 1;
  std::string trace;
  std::optional<double> power_law_alpha;
  std::optional<double> total_rate;
  int64_t prompt_len = 8;
  int64_t max_tokens = 1;
  double slo_s = 0;
  /// Requests carry the SLO as their deadline and ask to be refused rather than served
  /// late (infer_request::drop_late).
  bool drop_late = false;
  bool json = false;
  std::string report_dir;
  size_t max_connections = 256;
  double wait_ready_s = 10;
  double timeout_s = 300;
  bool progress = true;
};

/// What is wrong with the workload flags, or empty (no server needed).
std::string check_workload_flags(const loadgen_cli& cli);

/// The workload the flags describe: a trace, or Gamma arrivals over the named models
/// (all of `known` when none are named). `described_json` gets a JSON object describing
/// it for reports. Shared with `computron sim`, so the same flags mean the same requests.
caf::expected<workload::schedule> make_schedule(const loadgen_cli& cli,
                                                const std::vector<std::string>& known,
                                                std::string* described_json);

/// Exit codes: 0 all requests answered 200; 1 the server cannot be reached or the run
/// cannot start; 2 bad input (flags, trace, unknown models); 3 the run finished but some
/// requests failed (the summary says which and why).
int run_loadgen_cli(const loadgen_cli& cli);

}  // namespace computron::app
