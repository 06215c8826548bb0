// `computron bench sim`: the simulator's fidelity, experiment 1 and every experiment-2 cell
// run on the runtime (through `computron bench exp1/exp2 --json`, this binary) and in the
// simulator with the same configs, arrivals and seeds, side by side.
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/opt_engine.hpp"
#include "apps/computron/serve.hpp"
#include "apps/computron/sim_cli.hpp"
#include "apps/computron/sim_fidelity.hpp"
#include "bench/experiments/experiment_support.hpp"
#include "common/child_process.hpp"
#include "common/error.hpp"
#include "serve/sim_view.hpp"

namespace computron::app {

using namespace bench::detail;
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

/// Runs `computron bench ARGS --json` (this binary) and parses its one JSON line.
caf::expected<json> run_self_json(const std::vector<std::string>& args) {
  std::vector<std::string> argv{self_exe(), "--log-level", "warn", "bench"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json");
  child_process p{argv};
  std::string last;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(2);
  while (std::chrono::steady_clock::now() < deadline) {
    auto line = p.read_line(5s);
    if (line) {
      if (!line->empty() && (*line)[0] == '{') last = *line;
      continue;
    }
    if (p.exited()) break;
  }
  auto j = json::parse(last, nullptr, false);
  if (j.is_discarded())
    return make_error(ec::io_error, "computron bench " + args.front() + " printed no JSON");
  return j;
}

/// The simulator's view of a config file the experiment wrote for its server.
caf::expected<sim::sim_config> sim_of(const fs::path& config) {
  auto c = load_serve_config(config.string());
  if (!c) return c.error();
  return serve::sim_config_from(*c, actors::all_engines(), sim::cost_model{});
}

double pct(double sim, double real) {
  return real > 0 ? 100 * (sim - real) / real : 0;
}

}  // namespace

int run_sim_fidelity(const experiment_options& o) {
  auto dir = output_dir(o, "simfid");
  if (!dir) {
    std::cerr << "computron bench sim: " << render(dir.error()) << '\n';
    return 2;
  }
  json out{{"factor", o.factor}, {"seed", o.seed}, {"duration_s", o.duration_s}};
  auto common = std::vector<std::string>{"--factor", fmt::format("{}", o.factor), "--seed",
                                         std::to_string(o.seed)};
  if (!o.compute_while_loading) common.push_back("--no-overlap");
  // Experiment 1: the runtime's rows, then the simulator on the same configs with the
  // same blocking requests (10 s apart, so each ends before the next).
  {
    auto args = std::vector<std::string>{"exp1", "--out", (*dir / "exp1").string()};
    args.insert(args.end(), common.begin(), common.end());
    auto real = run_self_json(args);
    if (!real) {
      std::cerr << "computron bench sim: " << render(real.error()) << '\n';
      return 1;
    }
    if (!o.json)
      std::cout << "Experiment 1, runtime vs simulator (seconds; diff = sim/runtime - 1)\n"
                << fmt::format("{:<8} {:>16} {:>16} {:>16} {:>8}\n", "(TP,PP)", "load real/sim",
                               "exec real/sim", "response real/sim", "diff")
                << std::flush;
    json rows = json::array();
    double worst = 0;
    for (auto& row : (*real)["rows"]) {
      int tp = row["tp"], pp = row["pp"];
      auto cfg = sim_of(*dir / "exp1" / fmt::format("exp1-tp{}-pp{}.json", tp, pp));
      if (!cfg) {
        std::cerr << "computron bench sim: " << render(cfg.error()) << '\n';
        return 1;
      }
      cfg->prompt_len = 8;
      workload::schedule s;
      s.models = {"opt-13b-a", "opt-13b-b"};
      for (uint32_t i = 0; i < 24; ++i)
        for (int r = 0; r < 4; ++r) s.arrivals.push_back({10.0 * i, i % 2, 8, 1});
      s.duration_s = 240;
      auto ran = sim::run(*cfg, s);
      if (!ran) {
        std::cerr << "computron bench sim: " << render(ran.error()) << '\n';
        return 1;
      }
      auto& res = *ran;
      // Load and exec as bench exp1 measures them: a shard's copy, and compute alone.
      std::vector<double> exec, resp;
      for (size_t i = 16; i < res.records.size(); i += 4) {  // the first 4 requests dropped
        exec.push_back(res.records[i].compute_ms / 1e3);
        resp.push_back(res.records[i].latency_s());
      }
      double load_s = 0, shard_loads = 0;
      for (auto& d : res.devices) {
        load_s += d.load_seconds;
        shard_loads += d.shard_loads;
      }
      double sl = shard_loads > 0 ? load_s / shard_loads : 0, se = mean(exec), sr = mean(resp);
      double rl = row["load_s"], re = row["exec_s"], rr = row["response_s"];
      worst = std::max(worst, std::fabs(pct(sr, rr)));
      rows.push_back({{"tp", tp},
                      {"pp", pp},
                      {"runtime", {{"load_s", rl}, {"exec_s", re}, {"response_s", rr}}},
                      {"sim", {{"load_s", sl}, {"exec_s", se}, {"response_s", sr}}},
                      {"response_diff_pct", pct(sr, rr)}});
      if (!o.json)
        std::cout << fmt::format(
                         "({},{})    {:>7.3f}/{:<7.3f} {:>7.3f}/{:<7.3f} {:>7.3f}/{:<7.3f}  "
                         "{:>+6.1f}%\n",
                         tp, pp, rl, sl, re, se, rr, sr, pct(sr, rr))
                  << std::flush;
    }
    out["exp1"] = {{"rows", rows}, {"worst_response_diff_pct", worst}};
    if (!o.json) std::cout << fmt::format("worst response difference: {:.1f}%\n\n", worst);
  }
  // Experiment 2: every cell on the runtime (bench exp2), then the simulator on its
  // config with the same arrivals and the same warm-up.
  {
    auto args = std::vector<std::string>{"exp2",
                                         "--out",
                                         (*dir / "exp2").string(),
                                         "--duration",
                                         fmt::format("{}", o.duration_s),
                                         "--policy",
                                         o.policy};
    if (!o.only.empty()) {
      args.push_back("--only");
      args.push_back(o.only);
    }
    args.insert(args.end(), common.begin(), common.end());
    auto real = run_self_json(args);
    if (!real) {
      std::cerr << "computron bench sim: " << render(real.error()) << '\n';
      return 1;
    }
    if (!o.json)
      std::cout << "Experiment 2, runtime vs simulator (seconds; loads: model loads per device)\n"
                << fmt::format("{:<18} {:>5} {:>15} {:>15} {:>15} {:>11} {:>8}\n", "rates", "cv",
                               "mean real/sim", "p50 real/sim", "p99 real/sim", "loads r/s",
                               "mean diff")
                << std::flush;
    json cells = json::array();
    double worst_mean = 0, worst_loads = 0;
    for (auto& c : (*real)["cells"]) {
      fs::path report = c["report"].get<std::string>();
      auto name = report.filename().string();  // exp2-cellNN
      auto cell = static_cast<uint64_t>(std::stoul(name.substr(name.size() - 2)));
      auto cfg = sim_of(report.string() + ".json");
      if (!cfg) {
        std::cerr << "computron bench sim: " << render(cfg.error()) << '\n';
        return 1;
      }
      cfg->warm_up = true;
      std::vector<std::string> names;
      for (auto& m : cfg->models) names.push_back(m.name);
      auto rates = c["rates"].get<std::vector<double>>();
      double cv = c["cv"];
      auto s = workload::generate({names, rates, cv, o.duration_s, o.seed * 1000 + cell});
      if (!s) {
        std::cerr << "computron bench sim: " << render(s.error()) << '\n';
        return 1;
      }
      auto ran = sim::run(*cfg, *s);
      if (!ran) {
        std::cerr << "computron bench sim: " << render(ran.error()) << '\n';
        return 1;
      }
      auto& res = *ran;
      auto sum = workload::summarize_run(names, res.records, 0, res.devices);
      double loads = 0;
      for (auto& d : sum.devices) loads = std::max(loads, d.shard_loads);
      double rm = c["mean_s"], rp50 = c["p50_s"], rp99 = c["p99_s"], rl = c["model_loads"];
      auto& L = sum.overall.latency;
      worst_mean = std::max(worst_mean, std::fabs(pct(L.mean, rm)));
      worst_loads = std::max(worst_loads, std::fabs(pct(loads, rl)));
      cells.push_back(
          {{"rates", rates},
           {"cv", cv},
           {"runtime", {{"mean_s", rm}, {"p50_s", rp50}, {"p99_s", rp99}, {"loads", rl}}},
           {"sim",
            {{"mean_s", L.mean},
             {"p50_s", L.p50},
             {"p99_s", L.p99},
             {"loads", loads},
             {"ok", sum.overall.ok},
             {"sent", sum.overall.sent}}},
           {"mean_diff_pct", pct(L.mean, rm)},
           {"loads_diff_pct", pct(loads, rl)}});
      if (!o.json)
        std::cout << fmt::format(
                         "{:<18} {:>5} {:>7.3f}/{:<7.3f} {:>7.3f}/{:<7.3f} {:>7.3f}/{:<7.3f} "
                         "{:>5.0f}/{:<5.0f} {:>+7.1f}%\n",
                         rates_label(rates), cv, rm, L.mean, rp50, L.p50, rp99, L.p99, rl, loads,
                         pct(L.mean, rm))
                  << std::flush;
    }
    out["exp2"] = {{"cells", cells},
                   {"worst_mean_diff_pct", worst_mean},
                   {"worst_loads_diff_pct", worst_loads}};
    if (!o.json)
      std::cout << fmt::format(
          "worst mean difference: {:.1f}%, worst loads difference: {:.1f}% (target: 10% each)\n",
          worst_mean, worst_loads);
  }
  if (o.json) std::cout << out.dump() << '\n';
  return 0;
}

}  // namespace computron::app
