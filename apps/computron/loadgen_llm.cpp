#include "apps/computron/loadgen_llm.hpp"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "net/client/llm_loadgen.hpp"
#include "net/client/llm_metrics.hpp"
#include "net/client/llm_report.hpp"

namespace computron::app {

namespace {

using json = nlohmann::json;

constexpr int exit_unreachable = 1;
constexpr int exit_usage = 2;
constexpr int exit_some_failed = 3;

bool has_tokenizer(const std::vector<net::served_model>& served, const std::string& name) {
  for (auto& m : served)
    if (m.name == name) return m.tokenizer;
  return false;
}

}  // namespace

void add_llm_flags(CLI::App& cmd, loadgen_cli& cli) {
  cmd.add_option("--api", cli.api,
                 "auto (completions when every model driven has a tokenizer), completions "
                 "(streamed /v1/completions: TTFT, TPOT, ITL), chat (streamed "
                 "/v1/chat/completions, the prompt as one user message) or infer (KServe)")
      ->capture_default_str();
  cmd.add_option("--dataset-name", cli.dataset_name,
                 "random (token ids; chat: made text by the server's /detokenize), custom "
                 "(JSONL, one {\"prompt\": ..., \"output_tokens\": N} a line) or sharegpt "
                 "(ShareGPT's JSON: the first turn the prompt, the second's tokens the output); "
                 "default: from --dataset-path's extension (.jsonl, .json)");
  cmd.add_option("--dataset-path", cli.dataset_path,
                 "local file of prompts, drawn in a --seed shuffled order and cycled; each "
                 "counted by the server's /tokenize before the run");
  cmd.add_option("--prompt-dist", cli.prompt_dist,
                 "prompt lengths around --prompt-len: fixed, uniform:SPREAD (0..1) or "
                 "lognormal:CV")
      ->capture_default_str();
  cmd.add_option("--output-dist", cli.output_dist,
                 "output lengths around --max-tokens: fixed, uniform:SPREAD or lognormal:CV")
      ->capture_default_str();
  cmd.add_option("--lengths", cli.lengths_csv,
                 "CSV of prompt_len,output_len rows; each request draws one at random");
  cmd.add_option("--max-concurrency", cli.max_concurrency,
                 "requests in flight at most; a due request waits for one to finish");
  cmd.add_option("--num-prompts", cli.num_prompts,
                 "closed loop: N requests due at the start, over the models in turn");
  cmd.add_option("--slo-ttft-ms", cli.slo_ttft_ms, "goodput's SLO on time to first token (ms)");
  cmd.add_option("--slo-tpot-ms", cli.slo_tpot_ms, "goodput's SLO on time per output token (ms)");
  cmd.add_option("--metric-percentiles", cli.metric_percentiles,
                 "percentiles the report prints and plots, comma list")
      ->capture_default_str();
  // The completions mode has length defaults of its own, so note which were given.
  if (auto o = cmd.get_option_no_throw("--prompt-len"))
    o->each([&cli](const std::string&) { cli.prompt_len_given = true; });
  if (auto o = cmd.get_option_no_throw("--max-tokens"))
    o->each([&cli](const std::string&) { cli.max_tokens_given = true; });
}

caf::error check_llm_flags(const loadgen_cli& cli) {
  auto bad = [](std::string why) { return make_error(ec::invalid_request, std::move(why)); };
  if (cli.api != "auto" && cli.api != "completions" && cli.api != "chat" && cli.api != "infer")
    return bad("--api takes auto, completions, chat or infer, not '" + cli.api + "'");
  auto dataset = net::dataset_kind_of(cli.dataset_name, cli.dataset_path);
  if (!dataset) return dataset.error();
  if (*dataset != net::dataset_kind::random) {
    if (cli.api == "infer")
      return bad(
          "--api infer sends token ids: it takes no --dataset-path (use completions or chat)");
    if (!cli.lengths_csv.empty() || cli.prompt_dist != "fixed" || cli.prompt_len_given)
      return bad(
          "--dataset-path gives the prompts: it takes no --lengths, --prompt-len or "
          "--prompt-dist");
  }
  if (auto d = net::parse_length_dist(cli.prompt_dist, cli.prompt_len, "--prompt-dist"); !d)
    return d.error();
  if (auto d = net::parse_length_dist(cli.output_dist, cli.max_tokens, "--output-dist"); !d)
    return d.error();
  if (!cli.lengths_csv.empty() && (cli.prompt_dist != "fixed" || cli.output_dist != "fixed"))
    return bad(
        "--lengths draws both lengths from its rows: it takes no --prompt-dist or "
        "--output-dist");
  if (auto p = net::parse_percentiles(cli.metric_percentiles, "--metric-percentiles"); !p)
    return p.error();
  for (auto [v, flag] :
       {std::pair{cli.slo_ttft_ms, "--slo-ttft-ms"}, std::pair{cli.slo_tpot_ms, "--slo-tpot-ms"}})
    if (!(v >= 0) || !std::isfinite(v)) return bad(std::string{flag} + " must be 0 or more ms");
  if (cli.max_concurrency < 0) return bad("--max-concurrency must be 0 (no bound) or more");
  // A bound on what one run may ask for: every request is built before the first is sent.
  if (cli.num_prompts < 0 || cli.num_prompts > 10'000'000)
    return bad("--num-prompts must be 0..10000000");
  if (cli.num_prompts > 0 &&
      (!cli.trace.empty() || !cli.rates.empty() || cli.power_law_alpha || cli.total_rate))
    return bad(
        "--num-prompts sends its requests at the start (a closed loop): it takes no "
        "--trace, --rates, --power-law or --total-rate");
  return {};
}

caf::expected<std::vector<std::string>> models_named(const loadgen_cli& cli) {
  if (!cli.trace.empty()) {
    auto s = workload::read_trace(cli.trace);
    if (!s) return s.error();
    return s->models;
  }
  if (!cli.models.empty()) return workload::split_list(cli.models, "--models");
  return std::vector<std::string>{};
}

caf::expected<std::vector<net::dataset_prompt>> dataset_of(const loadgen_cli& cli) {
  auto kind = net::dataset_kind_of(cli.dataset_name, cli.dataset_path);
  if (!kind) return kind.error();
  if (*kind == net::dataset_kind::random) return std::vector<net::dataset_prompt>{};
  return net::read_dataset(*kind, cli.dataset_path);
}

caf::expected<std::optional<net::llm_api>> api_of(const loadgen_cli& cli,
                                                  const std::vector<net::served_model>& served,
                                                  const workload::schedule& sched) {
  using result = std::optional<net::llm_api>;
  if (cli.api == "infer") return result{};
  const auto api = cli.api == "chat" ? net::llm_api::chat : net::llm_api::completions;
  const bool text = !cli.dataset_path.empty();
  for (auto& m : sched.models) {
    if (has_tokenizer(served, m)) continue;
    if (cli.api == "auto" && !text) return result{};
    return make_error(ec::invalid_request,
                      "model " + m + " has no tokenizer, so /v1/" +
                          (api == net::llm_api::chat ? "chat/completions" : "completions") +
                          " cannot answer it" + (text ? " nor count a dataset's prompts" : "") +
                          ": drive it with --api infer" + (text ? " and no --dataset-path" : ""));
  }
  return result{api};
}

caf::expected<net::text_prompts> text_prompts_of(const loadgen_cli& cli,
                                                 const net::server_address& at,
                                                 const std::vector<net::served_model>& served,
                                                 const workload::schedule& sched, net::llm_api api,
                                                 const std::vector<net::dataset_prompt>& dataset) {
  if (api == net::llm_api::completions && dataset.empty()) return net::text_prompts{};
  net::text_prompt_options o;
  o.server = at;
  o.api = api;
  o.seed = cli.seed;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(cli.timeout_s * 1000));
  return net::make_text_prompts(sched, served, dataset, o);
}

caf::expected<net::length_source> lengths_of(const loadgen_cli& cli, bool completions,
                                             std::vector<net::length_pair> rows) {
  auto prompt_mean = completions && !cli.prompt_len_given ? llm_default_prompt_len : cli.prompt_len;
  auto output_mean = completions && !cli.max_tokens_given ? llm_default_max_tokens : cli.max_tokens;
  auto prompt = net::parse_length_dist(cli.prompt_dist, prompt_mean, "--prompt-dist");
  if (!prompt) return prompt.error();
  auto output = net::parse_length_dist(cli.output_dist, output_mean, "--output-dist");
  if (!output) return output.error();
  return net::length_source{*prompt, *output, std::move(rows)};
}

size_t in_flight_bound(const loadgen_cli& cli) {
  return cli.max_concurrency > 0
             ? std::min(static_cast<size_t>(cli.max_concurrency), cli.max_connections)
             : cli.max_connections;
}

std::string first_errors(const std::vector<workload::request_record>& records) {
  std::map<std::string, std::string> first;
  for (auto& r : records)
    if (r.sent() && !r.ok()) first.emplace(r.error_kind, r.error);
  std::string out;
  for (auto& [kind, message] : first)
    if (!message.empty()) out += fmt::format("  first {}: {}\n", kind, message);
  return out;
}

int run_llm_cli(const loadgen_cli& cli, const net::server_address& at,
                const std::vector<net::served_model>& served, const workload::schedule& sched,
                net::llm_api api, net::text_prompts texts, const std::string& described_json,
                std::function<void(const net::open_loop_progress&)> on_progress,
                const std::atomic<bool>* cancel) {
  net::llm_options o;
  o.server = at;
  if (cli.drop_late) o.deadline_ms = static_cast<uint32_t>(std::lround(cli.slo_s * 1000));
  o.seed = cli.seed;
  o.api = api;
  o.texts = std::move(texts.prompts);
  o.max_concurrency = in_flight_bound(cli);
  o.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(cli.timeout_s * 1000));
  o.on_progress = std::move(on_progress);
  o.cancel = cancel;
  auto run = net::run_llm_loadgen(sched, served, o);
  if (!run) {
    std::cerr << "computron loadgen: " << render(run.error()) << '\n';
    return is(run.error(), ec::invalid_request) ? exit_usage : exit_unreachable;
  }
  auto percentiles = net::parse_percentiles(cli.metric_percentiles, "--metric-percentiles");
  if (!percentiles) return exit_usage;  // checked before the run
  net::llm_slo slo{cli.slo_ttft_ms / 1e3, cli.slo_tpot_ms / 1e3, cli.slo_s};
  auto summary = net::summarize_llm(sched.models, run->records, slo, *percentiles);
  summary.max_concurrency = static_cast<size_t>(cli.max_concurrency);
  summary.clipped = run->clipped + texts.clipped;
  json extra{{"url", cli.url}, {"api", to_string(api)}, {"workload", json::parse(described_json)}};
  if (auto kind = net::dataset_kind_of(cli.dataset_name, cli.dataset_path);
      kind && *kind != net::dataset_kind::random)
    extra["workload"]["dataset"] = {{"name", to_string(*kind)}, {"path", cli.dataset_path}};
  if (cancel && cancel->load()) extra["interrupted"] = true;
  if (cli.json)
    std::cout << net::llm_json(summary, run->devices, extra.dump()) << '\n';
  else
    std::cout << net::llm_table(summary, run->devices);
  if (!cli.report_dir.empty()) {
    if (auto err = net::write_llm_report(cli.report_dir, summary, run->records, run->devices,
                                         run->swaps, extra.dump())) {
      std::cerr << "computron loadgen: " << render(err) << '\n';
      return exit_unreachable;
    }
    if (!cli.json) std::cout << "report written to " << cli.report_dir << '\n';
  }
  return summary.overall.failed > 0 || summary.unsent > 0 ? exit_some_failed : 0;
}

}  // namespace computron::app
