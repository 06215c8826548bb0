// `computron loadgen`: its workload, report and connection flags (the LLM mode's come from
// loadgen_llm.cpp), then the run (loadgen.cpp).
#include <memory>

#include <CLI/CLI.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/loadgen.hpp"

namespace computron::app {

namespace {

struct loadgen_flags {
  loadgen_cli lg;
  double alpha = 0;
  double total = 0;
  CLI::Option* alpha_opt = nullptr;
  CLI::Option* total_opt = nullptr;
  bool no_progress = false;
};

int run(loadgen_flags f) {
  if (f.alpha_opt->count() > 0) f.lg.power_law_alpha = f.alpha;
  if (f.total_opt->count() > 0) f.lg.total_rate = f.total;
  f.lg.progress = !f.no_progress;
  return run_loadgen_cli(f.lg);
}

const registration loadgen_command{
    {"loadgen",
     "open- or closed-loop workload against a running server; latency report (TTFT, TPOT, "
     "ITL and goodput for models with a tokenizer)",
     70, [](CLI::App& cmd) -> command_run {
       auto f = std::make_shared<loadgen_flags>();
       auto& lg = f->lg;
       cmd.add_option("--url", lg.url, "server, http://HOST:PORT")->capture_default_str();
       cmd.add_option("--models", lg.models, "comma list of models (default: all the server has)");
       cmd.add_option("--rates", lg.rates, "requests/s per model, comma list (default 1 each)");
       cmd.add_option("--cv", lg.cv, "coefficient of variation of the gaps (1 Poisson, 4 bursty)")
           ->capture_default_str();
       cmd.add_option("--duration", lg.duration_s, "seconds of arrivals")->capture_default_str();
       cmd.add_option("--seed", lg.seed, "seed of arrivals and prompts")->capture_default_str();
       cmd.add_option("--trace", lg.trace,
                      "replay a CSV trace: time_s,model[,prompt_len[,max_tokens]]");
       f->alpha_opt =
           cmd.add_option("--power-law", f->alpha, "skew rates as (i+1)^-ALPHA over the models");
       f->total_opt =
           cmd.add_option("--total-rate", f->total, "requests/s over all models (uniform alone)");
       cmd.add_option("--prompt-len", lg.prompt_len,
                      "prompt tokens per request (the mean of --prompt-dist; completions: 32)")
           ->capture_default_str();
       cmd.add_option("--max-tokens", lg.max_tokens,
                      "tokens generated per request (the mean of --output-dist; completions: 16)")
           ->capture_default_str();
       cmd.add_option("--slo", lg.slo_s,
                      "latency SLO in seconds for the attainment figure (and goodput's E2EL)");
       cmd.add_flag("--drop-late", lg.drop_late,
                    "send the SLO as each request's deadline, asking to be refused rather than "
                    "answered late (needs --slo)");
       cmd.add_flag("--json", lg.json, "print the summary as one JSON object");
       cmd.add_option("--report", lg.report_dir,
                      "write summary.json, requests.csv and SVG plots into this folder");
       cmd.add_option("--max-connections", lg.max_connections, "keep-alive connections at most")
           ->capture_default_str();
       cmd.add_option("--wait-ready", lg.wait_ready_s, "seconds to wait for a ready server")
           ->capture_default_str();
       cmd.add_option("--timeout", lg.timeout_s, "seconds before one request counts as failed")
           ->capture_default_str();
       cmd.add_flag("--no-progress", f->no_progress, "no progress bar on stderr");
       add_llm_flags(cmd, lg);
       return [f] { return run(*f); };
     }}};

}  // namespace

}  // namespace computron::app
