#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "apps/computron/loadgen.hpp"
#include "net/client/llm_dataset.hpp"
#include "net/client/llm_lengths.hpp"
#include "net/client/llm_prompts.hpp"
#include "net/client/loadgen.hpp"
#include "workload/arrivals.hpp"

/// The parts of `computron loadgen` that its LLM mode adds: the lengths the flags
/// describe, the choice of API, and the streamed run with vLLM's report.
namespace computron::app {

/// The models a run drives as the flags name them (--models, or a trace's), empty when it
/// drives every model the server has. Errors: the trace or the list is bad.
caf::expected<std::vector<std::string>> models_named(const loadgen_cli& cli);

/// The prompts of --dataset-path (read before the server is asked), empty without one.
/// Errors (invalid_request): the dataset flags or the file are bad.
caf::expected<std::vector<net::dataset_prompt>> dataset_of(const loadgen_cli& cli);

/// The route a run streams from, or none for KServe infer. Errors (invalid_request): a
/// model without a tokenizer under --api completions or chat, or with a dataset (its
/// prompts are text).
caf::expected<std::optional<net::llm_api>> api_of(const loadgen_cli& cli,
                                                  const std::vector<net::served_model>& served,
                                                  const workload::schedule& sched);

/// The text prompts of a run that sends text (chat, or a dataset), counted by the server
/// before anything is sent; none for the completions route's token-id prompts. Errors: as
/// net::make_text_prompts.
caf::expected<net::text_prompts> text_prompts_of(const loadgen_cli& cli,
                                                 const net::server_address& at,
                                                 const std::vector<net::served_model>& served,
                                                 const workload::schedule& sched, net::llm_api api,
                                                 const std::vector<net::dataset_prompt>& dataset);

/// The run's lengths: the CSV's rows (`rows`, read before the server was asked), else the
/// distributions around --prompt-len and --max-tokens (or the completions mode's defaults
/// where those were not given).
caf::expected<net::length_source> lengths_of(const loadgen_cli& cli, bool completions,
                                             std::vector<net::length_pair> rows);

/// Runs the schedule as streamed (chat) completions over `texts` (token ids when empty)
/// and prints the report (or JSON), writing the report folder when asked. The exit code,
/// as run_loadgen_cli's.
int run_llm_cli(const loadgen_cli& cli, const net::server_address& at,
                const std::vector<net::served_model>& served, const workload::schedule& sched,
                net::llm_api api, net::text_prompts texts, const std::string& described_json,
                std::function<void(const net::open_loop_progress&)> on_progress,
                const std::atomic<bool>* cancel);

/// Requests in flight at most: --max-concurrency within --max-connections.
size_t in_flight_bound(const loadgen_cli& cli);

/// The first message of each kind of failure, one line each ("  first http_400: ..."),
/// for the infer mode's table.
std::string first_errors(const std::vector<workload::request_record>& records);

}  // namespace computron::app
