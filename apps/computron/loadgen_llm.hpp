#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "apps/computron/loadgen.hpp"
#include "net/client/llm_lengths.hpp"
#include "net/client/loadgen.hpp"
#include "workload/arrivals.hpp"

/// The parts of `computron loadgen` that its LLM mode adds: the lengths the flags
/// describe, the choice of API, and the streamed run with vLLM's report.
namespace computron::app {

/// The models a run drives as the flags name them (--models, or a trace's), empty when it
/// drives every model the server has. Errors: the trace or the list is bad.
caf::expected<std::vector<std::string>> models_named(const loadgen_cli& cli);

/// True for streamed completions, false for KServe infer. Errors (invalid_request): a
/// model without a tokenizer under --api completions.
caf::expected<bool> use_completions(const loadgen_cli& cli,
                                    const std::vector<net::served_model>& served,
                                    const workload::schedule& sched);

/// The run's lengths: the CSV's rows (`rows`, read before the server was asked), else the
/// distributions around --prompt-len and --max-tokens (or the completions mode's defaults
/// where those were not given).
caf::expected<net::length_source> lengths_of(const loadgen_cli& cli, bool completions,
                                             std::vector<net::length_pair> rows);

/// Runs the schedule as streamed completions and prints the report (or JSON), writing the
/// report folder when asked. The exit code, as run_loadgen_cli's.
int run_llm_cli(const loadgen_cli& cli, const net::server_address& at,
                const std::vector<net::served_model>& served, const workload::schedule& sched,
                const std::string& described_json,
                std::function<void(const net::open_loop_progress&)> on_progress,
                const std::atomic<bool>* cancel);

/// Requests in flight at most: --max-concurrency within --max-connections.
size_t in_flight_bound(const loadgen_cli& cli);

/// The first message of each kind of failure, one line each ("  first http_400: ..."),
/// for the infer mode's table.
std::string first_errors(const std::vector<workload::request_record>& records);

}  // namespace computron::app
