#pragma once

#include <string>

#include <caf/expected.hpp>

#include "actors/engine.hpp"
#include "apps/computron/loadgen.hpp"
#include "apps/computron/serve.hpp"
#include "sim/simulator.hpp"

/// `computron sim`: the serve config and loadgen's workload flags, run in the simulator
/// instead of against a server; the same report.
namespace computron::app {

struct sim_cli {
  /// A serve config (--config) and a model repository (--repository); neither: the
  /// built-in defaults of `computron serve`.
  std::string config;
  std::string repository;
  /// loadgen's workload and report flags (url and connection flags unused).
  loadgen_cli workload;
  /// "emulated" (this project's emulated devices) or "a100" (the original's 4 x A100
  /// PCIe 4); then --cost and --calibrate override parts of it.
  std::string profile = "emulated";
  /// A JSON object of cost_model fields.
  std::string cost_file;
  /// A running server's URL (its /metrics), or a JSON written by `computron bench exp1`.
  std::string calibrate;
  /// Compute of OPT models: effective TFLOP/s per device (0: the cost model's).
  double tflops = 0;
  /// Devices of a CUDA config (the simulator opens none): GB per device and link GB/s.
  double capacity_gb = 0;
  double link_gbps = 0;
  /// One request per model, in order, before the arrivals (as bench exp2 does).
  bool warm_up = false;
};

/// Exit codes as loadgen's: 0 every request answered, 2 bad input, 3 some failed.
int run_sim_cli(const sim_cli& cli);

}  // namespace computron::app
