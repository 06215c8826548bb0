#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "workload/arrivals.hpp"

namespace CLI {
class App;
}

/// `computron loadgen`: an open-loop (or, with --max-concurrency, closed-loop) workload
/// against a running server, with a progress bar, a summary (table or JSON) and an
/// optional report folder. Models with a tokenizer are driven as an LLM server is
/// benchmarked (streamed completions: TTFT, TPOT, ITL, goodput); others with KServe infer.
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

  // The LLM mode (apps/computron/loadgen_llm.cpp).
  /// "auto" (completions when every model driven has a tokenizer, else infer),
  /// "completions" (streamed /v1/completions), "chat" (streamed /v1/chat/completions) or
  /// "infer" (KServe infer, token ids).
  std::string api = "auto";
  /// vLLM's dataset flags: random (token ids), custom (JSONL of {"prompt"}) or sharegpt
  /// (ShareGPT's JSON); empty: from the path's extension, random without a path.
  std::string dataset_name;
  std::string dataset_path;
  /// fixed, uniform:SPREAD or lognormal:SPREAD around --prompt-len and --max-tokens.
  std::string prompt_dist = "fixed";
  std::string output_dist = "fixed";
  /// A CSV of prompt_len,output_len rows; each request draws one (instead of the dists).
  std::string lengths_csv;
  /// Requests in flight at most (0: only --max-connections bounds them). Signed, so that
  /// a negative value is refused by name rather than wrapped around.
  int64_t max_concurrency = 0;
  /// Closed loop: this many requests due at the start, over the models in turn.
  int64_t num_prompts = 0;
  /// Goodput's SLOs in milliseconds (0: none); --slo is the end-to-end one.
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  std::string metric_percentiles = "50,90,99";
  /// Set when the flags were given: the completions mode has defaults of its own.
  bool prompt_len_given = false;
  bool max_tokens_given = false;
};

/// The completions mode's lengths where the flags leave them out: a 32-token prompt and
/// 16 tokens out, so TPOT and ITL have tokens to measure (infer's default is 1).
constexpr int64_t llm_default_prompt_len = 32;
constexpr int64_t llm_default_max_tokens = 16;

/// Adds the LLM mode's flags to loadgen's command, beside those loadgen_command.cpp declares.
void add_llm_flags(CLI::App& cmd, loadgen_cli& cli);

/// What is wrong with the LLM mode's flags (invalid_request, naming the flag), or none (no
/// server needed).
caf::error check_llm_flags(const loadgen_cli& cli);

/// What is wrong with the workload flags (invalid_request, naming the flag), or none (no
/// server needed).
caf::error check_workload_flags(const loadgen_cli& cli);

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
