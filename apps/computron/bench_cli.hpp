#pragma once

#include <optional>

#include <CLI/CLI.hpp>

#include "apps/computron/sim_fidelity.hpp"
#include "bench/cluster_bench.hpp"
#include "bench/experiments/experiments.hpp"
#include "bench/forward_bench.hpp"
#include "bench/runtime_bench.hpp"
#include "bench/startup_bench.hpp"
#include "bench/swap_bench.hpp"

/// `computron bench ...` as one piece of the CLI: its subcommands and flags, and running
/// the one chosen.
namespace computron::app {

class bench_cli {
 public:
  /// Adds `bench` and its subcommands to `app`.
  explicit bench_cli(CLI::App& app);
  /// Runs the bench subcommand that was parsed and returns the exit code; nullopt when
  /// none was.
  std::optional<int> run();

 private:
  CLI::App* bench_cmd = nullptr;
  CLI::App* swap_cmd = nullptr;
  bench::swap_bench_options swap;
  double size_mb = 0;
  double chunk_mb = 0;
  bool no_baseline = false;
  bool no_verify = false;
  bool swap_json = false;
  CLI::App* layout_cmd = nullptr;
  std::string layout_dtype = "bf16";
  CLI::App* fwd_cmd = nullptr;
  bench::forward_bench_options fwd;
  bool fwd_json = false;
  CLI::App* su_cmd = nullptr;
  bench::startup_bench_options sub;
  bool su_json = false;
  CLI::App* rt_cmd = nullptr;
  bench::runtime_bench_options rtb;
  double rt_swap_mb = 0;
  bool rt_json = false;
  CLI::App* cl_cmd = nullptr;
  bench::cluster_bench_options clb;
  double cl_swap_mb = 0;
  bool cl_json = false;
  bench::experiment_options exp;
  bool exp_no_overlap = false;
  CLI::App* exp1_cmd = nullptr;
  CLI::App* exp2_cmd = nullptr;
  CLI::App* simfid_cmd = nullptr;
};

}  // namespace computron::app
