// `computron sim`: its flags (serve's config, loadgen's workload, the cost model), then the
// simulator (sim_cli.cpp).
#include <memory>

#include <CLI/CLI.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/sim_cli.hpp"

namespace computron::app {

namespace {

struct sim_flags {
  sim_cli sim;
  double alpha = 0;
  double total = 0;
  CLI::Option* alpha_opt = nullptr;
  CLI::Option* total_opt = nullptr;
};

int run(sim_flags f) {
  if (f.alpha_opt->count() > 0) f.sim.workload.power_law_alpha = f.alpha;
  if (f.total_opt->count() > 0) f.sim.workload.total_rate = f.total;
  return run_sim_cli(f.sim);
}

const registration sim_command{
    {"sim", "simulate a serve config under a loadgen workload (no server, no weights)", 80,
     [](CLI::App& cmd) -> command_run {
       auto f = std::make_shared<sim_flags>();
       auto& sim = f->sim;
       cmd.add_option("--config", sim.config, "serve config (default: serve's built-in one)");
       cmd.add_option("--repository", sim.repository, "model repository folder");
       cmd.add_option("--models", sim.workload.models, "comma list of models (default: all)");
       cmd.add_option("--rates", sim.workload.rates, "requests/s per model, comma list");
       cmd.add_option("--cv", sim.workload.cv, "coefficient of variation of the gaps")
           ->capture_default_str();
       cmd.add_option("--duration", sim.workload.duration_s, "seconds of arrivals")
           ->capture_default_str();
       cmd.add_option("--seed", sim.workload.seed, "seed of arrivals")->capture_default_str();
       cmd.add_option("--trace", sim.workload.trace, "replay a CSV trace");
       f->alpha_opt =
           cmd.add_option("--power-law", f->alpha, "skew rates as (i+1)^-ALPHA over the models");
       f->total_opt = cmd.add_option("--total-rate", f->total, "requests/s over all models");
       cmd.add_option("--prompt-len", sim.workload.prompt_len, "prompt tokens per request")
           ->capture_default_str();
       cmd.add_option("--max-tokens", sim.workload.max_tokens, "tokens generated per request")
           ->capture_default_str();
       cmd.add_option("--prompt-dist", sim.workload.prompt_dist,
                      "prompt lengths around --prompt-len, as loadgen's: fixed, uniform:SPREAD "
                      "or lognormal:CV")
           ->capture_default_str();
       cmd.add_option("--output-dist", sim.workload.output_dist,
                      "output lengths around --max-tokens: fixed, uniform:SPREAD or lognormal:CV")
           ->capture_default_str();
       cmd.add_option("--lengths", sim.workload.lengths_csv,
                      "CSV of prompt_len,output_len rows; each request draws one at random");
       cmd.add_option("--slo", sim.workload.slo_s, "latency SLO in seconds");
       cmd.add_flag("--drop-late", sim.workload.drop_late,
                    "the SLO is each request's deadline, refused rather than served late "
                    "(needs --slo)");
       cmd.add_flag("--json", sim.workload.json, "print the summary as one JSON object");
       cmd.add_option("--report", sim.workload.report_dir,
                      "write summary.json, requests.csv and SVG plots into this folder");
       cmd.add_option("--profile", sim.profile, "cost model: emulated or a100")
           ->capture_default_str();
       cmd.add_option("--cost", sim.cost_file, "JSON object of cost-model fields");
       cmd.add_option("--calibrate", sim.calibrate,
                      "a running server's URL (its /metrics) or a bench exp1 --json file");
       cmd.add_option("--tflops", sim.tflops, "OPT compute per device, TFLOP/s");
       cmd.add_option("--capacity-gb", sim.capacity_gb, "GB per device (CUDA configs)");
       cmd.add_option("--link-gbps", sim.link_gbps, "link GB/s per device (CUDA configs)");
       cmd.add_flag("--warm-up", sim.warm_up,
                    "one request per model, in order, before the arrivals (as bench exp2)");
       return [f] { return run(*f); };
     }}};

}  // namespace

}  // namespace computron::app
