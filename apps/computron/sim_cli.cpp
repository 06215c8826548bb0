#include "apps/computron/sim_cli.hpp"
#include "serve/sim_view.hpp"

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/opt_engine.hpp"
#include "common/error.hpp"
#include "net/client/llm_lengths.hpp"
#include "net/client/loadgen.hpp"
#include "workload/report.hpp"

namespace computron::app {

namespace {

using json = nlohmann::json;

constexpr int exit_failed = 1;
constexpr int exit_usage = 2;
constexpr int exit_some_failed = 3;

int usage(const std::string& why) {
  std::cerr << "computron sim: " << why << '\n';
  return exit_usage;
}

}  // namespace

int run_sim_cli(const sim_cli& cli) {
  if (auto err = check_workload_flags(cli.workload)) return usage(render(err));
  // 0 (or absent) means the default; a negative or NaN value is a mistake, not a default.
  for (auto [flag, v] :
       {std::pair{"--tflops", cli.tflops}, std::pair{"--capacity-gb", cli.capacity_gb},
        std::pair{"--link-gbps", cli.link_gbps}})
    if (!(v >= 0)) return usage(fmt::format("{} must be above 0 (or absent), got {}", flag, v));
  serve_config cfg = default_serve_config();
  if (!cli.config.empty()) {
    auto c = load_serve_config(cli.config);
    if (!c) return usage(render(c.error()));
    cfg = std::move(*c);
  }
  if (!cli.repository.empty()) {
    auto models = load_repository(cli.repository);
    if (!models) return usage(render(models.error()));
    if (cli.config.empty()) cfg.models.clear();
    for (auto& m : *models) cfg.models.push_back(m);
  }
  sim::cost_model cost;
  if (cli.profile == "a100")
    cost = sim::profile_a100_pcie4();
  else if (cli.profile != "emulated")
    return usage("--profile must be emulated or a100, got '" + cli.profile + "'");
  if (!cli.cost_file.empty()) {
    auto c = serve::read_cost_file(cli.cost_file, cost);
    if (!c) return usage(render(c.error()));
    cost = *c;
  }
  if (cli.tflops > 0) cost.tflops = cli.tflops;
  auto sc =
      serve::sim_config_from(cfg, actors::all_engines(), cost, cli.capacity_gb, cli.link_gbps);
  if (!sc) return usage(render(sc.error()));
  // Models whose step time a server measured (--calibrate URL), for the output.
  std::map<std::string, double> measured_steps, measured_per_token;
  if (!cli.calibrate.empty()) {
    auto c = serve::calibrate(cli.calibrate, *sc, cost);
    if (!c) return usage("--calibrate " + cli.calibrate + ": " + render(c.error()));
    sc->cost = c->cost;
    for (auto& m : sc->models)
      if (auto i = c->step_s.find(m.name); i != c->step_s.end()) {
        m.step_s = i->second;
        auto t = c->step_per_token_s.find(m.name);
        m.step_per_token_s = t == c->step_per_token_s.end() ? 0 : t->second;
        measured_steps[m.name] = i->second;
        measured_per_token[m.name] = m.step_per_token_s;
      }
  }
  sc->prompt_len = cli.workload.prompt_len;
  sc->max_tokens = cli.workload.max_tokens;
  sc->warm_up = cli.warm_up;
  if (cli.workload.drop_late)
    sc->drop_late_deadline_ms = static_cast<int64_t>(std::lround(cli.workload.slo_s * 1000));
  std::vector<std::string> known;
  for (auto& m : sc->models) known.push_back(m.name);
  std::string described;
  auto sched = make_schedule(cli.workload, known, &described);
  if (!sched) return usage(render(sched.error()));
  // Mixed lengths as `computron loadgen` draws them (same flags and seed, same requests).
  if (cli.workload.prompt_dist != "fixed" || cli.workload.output_dist != "fixed" ||
      !cli.workload.lengths_csv.empty()) {
    std::vector<net::length_pair> rows;
    if (!cli.workload.lengths_csv.empty()) {
      auto r = net::read_length_pairs(cli.workload.lengths_csv);
      if (!r) return usage(render(r.error()));
      rows = std::move(*r);
    }
    auto prompt =
        net::parse_length_dist(cli.workload.prompt_dist, cli.workload.prompt_len, "--prompt-dist");
    if (!prompt) return usage(render(prompt.error()));
    auto output =
        net::parse_length_dist(cli.workload.output_dist, cli.workload.max_tokens, "--output-dist");
    if (!output) return usage(render(output.error()));
    net::assign_lengths(*sched, {*prompt, *output, std::move(rows)}, cli.workload.seed);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto ran = sim::run(*sc, *sched);
  if (!ran) return usage(render(ran.error()));
  auto& result = *ran;
  auto wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto summary =
      workload::summarize_run(sched->models, result.records, cli.workload.slo_s, result.devices);
  json extra{{"simulated", true},
             {"workload", json::parse(described)},
             {"profile", cli.profile},
             {"cost",
              {{"link_efficiency", sc->cost.link_efficiency},
               {"load_overhead_s", sc->cost.load_overhead_s},
               {"evict_s", sc->cost.evict_s},
               {"stage_overhead_s", sc->cost.stage_overhead_s},
               {"request_overhead_s", sc->cost.request_overhead_s},
               {"lease_overhead_s", sc->cost.lease_overhead_s},
               {"tflops", sc->cost.tflops}}},
             {"measured_step_s", measured_steps},
             {"measured_step_per_token_s", measured_per_token},
             {"events", result.events},
             {"scheduler",
              {{"policy", sc->scheduler.policy},
               {"prefetch", sc->scheduler.prefetch},
               {"prefetches", result.prefetches},
               {"prefetch_hits", result.prefetch_hits},
               {"dispatch", sc->batching.dispatch},
               {"drop_late", sc->drop_late_deadline_ms > 0}}},
             {"gpulets", {{"partitions", result.gpulets}, {"replans", result.replans}}},
             {"simulator_wall_s", wall}};
  if (cli.workload.json) {
    std::cout << workload::to_json(summary, extra.dump()) << '\n';
  } else {
    std::cout << fmt::format(
        "computron sim: {} requests to {} models, {:.1f} simulated s in {:.3f} s ({:.0f} "
        "requests/s simulated)\n",
        sched->arrivals.size(), sched->models.size(), result.simulated_s, wall,
        wall > 0 ? static_cast<double>(sched->arrivals.size()) / wall : 0.0);
    std::cout << workload::to_table(summary);
    if (sc->gpulets.enabled()) {
      std::string parts;
      for (auto& p : result.gpulets) parts += fmt::format(" [{}]", fmt::join(p, ","));
      std::cout << fmt::format("gpu-lets at the end:{} ({} re-plans took effect)\n", parts,
                               result.replans);
    }
  }
  if (!cli.workload.report_dir.empty()) {
    if (auto err = workload::write_report(cli.workload.report_dir, summary, result.records,
                                          result.swaps, extra.dump())) {
      std::cerr << "computron sim: " << render(err) << '\n';
      return exit_failed;
    }
    if (!cli.workload.json) std::cout << "report written to " << cli.workload.report_dir << '\n';
  }
  return summary.overall.failed > 0 ? exit_some_failed : 0;
}

}  // namespace computron::app
