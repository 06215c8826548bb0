#pragma once

#include <cstdint>
#include <string>

/// `computron bench exp1` and `computron bench exp2`: the original Computron's two
/// experiments (../shared/WORKLOADS.md) reproduced against a real `computron serve`
/// process on emulated devices, printed beside the original's published tables.
namespace computron::bench {

struct experiment_options {
  /// Model bytes and link bandwidth are both divided by this, so swap times stay those
  /// of the original's hardware (32 GB/s per GPU, OPT-13B of 25.7 GB) while the weights
  /// fit this machine.
  double factor = 64;
  uint64_t seed = 1;
  /// Experiment 2: seconds of arrivals per cell.
  double duration_s = 30;
  /// Experiment 2: the eviction policy of the server (lru is the original's).
  std::string policy = "lru";
  /// Experiment 2: how long the server waits to fill a batch (the original ticked every
  /// 10 ms).
  int batch_window_ms = 5;
  /// Experiment 2: an SLO in seconds (0: none) for the attainment figure, and whether
  /// each request carries it as its deadline with drop_late (loadgen --drop-late).
  double slo_s = 0;
  bool drop_late = false;
  /// The server leases loading models (scheduler.compute_while_loading); --no-overlap
  /// turns it off for the comparison.
  bool compute_while_loading = true;
  /// Experiment 2: only the cells whose label contains this (e.g. "(10,1,1)").
  std::string only;
  /// Keep each run's server config and loadgen report here (empty: a temporary folder).
  std::string out_dir;
  bool json = false;
};

/// Returns the process exit code (0 when every run completed, whatever its figures).
int run_experiment1(const experiment_options& opts);
int run_experiment2(const experiment_options& opts);

}  // namespace computron::bench
