#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "workload/report.hpp"

/// What an LLM benchmark measures, with `vllm bench serve`'s meanings: time to first token
/// (TTFT), time per output token after the first (TPOT), inter-token latency (ITL, the gaps
/// between streamed chunks), end-to-end latency (E2EL), token throughputs and goodput (the
/// requests per second that met every SLO). Plain functions over records, so the maths is
/// tested without a server; the report prints as vLLM's does.
namespace computron::net {

/// One streamed request as the client saw it. Times are seconds from the run's start.
struct stream_record {
  std::string model;
  /// When it was due, written to a connection (later under --max-concurrency), finished.
  double arrival_s = 0;
  double sent_s = -1;
  double done_s = -1;
  /// When each chunk that carried text arrived.
  std::vector<double> chunk_s;
  /// Tokens asked for, then the server's count (usage) where it gave one.
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  /// HTTP status, 0 when no answer.
  int status = 0;
  /// Empty for a success; else "http_400", "stream_unavailable", "timeout", "connect"...
  std::string error_kind;
  /// The server's message (OpenAI's error.message), or the client's reason.
  std::string error;

  bool ok() const { return status == 200 && error_kind.empty(); }
  bool sent() const { return sent_s >= 0; }
  /// From sending to the end of the stream, as vLLM measures (not from the due time).
  double e2e_s() const { return done_s - sent_s; }
  /// From sending to the first chunk with text; the whole request when none had any.
  double ttft_s() const { return (chunk_s.empty() ? done_s : chunk_s.front()) - sent_s; }
  /// (E2EL - TTFT) / (output tokens - 1); none for a single token.
  std::optional<double> tpot_s() const;
  /// The gaps between consecutive chunks with text.
  std::vector<double> itl_s() const;
};

/// Service-level objectives in seconds; 0 means none on that metric.
struct llm_slo {
  double ttft_s = 0;
  double tpot_s = 0;
  double e2e_s = 0;
  bool any() const { return ttft_s > 0 || tpot_s > 0 || e2e_s > 0; }
};

/// A success that met every SLO given (a single-token answer has no TPOT to miss).
bool meets_slo(const stream_record& r, const llm_slo& slo);

/// Mean, median, standard deviation and chosen percentiles of one metric, in seconds.
struct metric_summary {
  size_t count = 0;
  double mean = 0;
  double median = 0;
  double stdev = 0;
  double max = 0;
  /// (percentile in 0..100, value), in the order asked.
  std::vector<std::pair<double, double>> percentiles;
};

/// Percentiles interpolate linearly between order statistics (numpy's default, as vLLM).
metric_summary summarize_metric(const std::vector<double>& xs,
                                const std::vector<double>& percentiles);

struct llm_group {
  size_t sent = 0;
  size_t ok = 0;
  size_t failed = 0;
  /// Over the successes.
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  /// Successes that met every SLO.
  size_t good = 0;
  /// Per second of the run.
  double request_throughput = 0;
  double goodput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  /// good / sent (a failure misses the SLO); 1 without an SLO.
  double slo_attainment = 1;
  metric_summary ttft, tpot, itl, e2el;
  std::map<std::string, size_t> errors;
  /// The first message of each kind of error, as the server worded it.
  std::map<std::string, std::string> first_error;
};

struct llm_summary {
  std::vector<std::string> models;
  std::vector<llm_group> per_model;
  llm_group overall;
  /// Scheduled but never sent (a cancelled run).
  size_t unsent = 0;
  /// From the start to the last answer.
  double duration_s = 0;
  /// 0: open loop without a bound.
  size_t max_concurrency = 0;
  llm_slo slo;
  std::vector<double> percentiles;
  /// Requests shortened to fit their model's context.
  size_t clipped = 0;
};

/// Reads a comma list of percentiles (each in (0, 100]), sorted and without repeats;
/// errors name `flag`.
caf::expected<std::vector<double>> parse_percentiles(const std::string& text,
                                                     const std::string& flag);

llm_summary summarize_llm(const std::vector<std::string>& models,
                          const std::vector<stream_record>& records, const llm_slo& slo,
                          const std::vector<double>& percentiles);

/// vLLM's "Serving Benchmark Result" block, then a line per model, the errors with their
/// first message, and each device's swaps during the run.
std::string llm_table(const llm_summary& s, const std::vector<workload::device_traffic>& devices);

/// One JSON object with vLLM's result keys (completed, request_throughput, mean_ttft_ms,
/// p99_tpot_ms, ...) beside ours (sent, ok, failed, unsent, models, errors, first_errors);
/// `extra` (a JSON object, may be empty) is merged in.
std::string llm_json(const llm_summary& s, const std::vector<workload::device_traffic>& devices,
                     const std::string& extra = {});

/// "p99", "p99.9": a percentile's short name.
std::string percentile_name(double p);

}  // namespace computron::net
