#pragma once

// The serve config as the simulator sees it, and the simulator's cost model from a file
// or calibrated against what a running server (or `computron bench exp1`) measured: what
// `computron sim` and the simulator's fidelity check run on.
#include <map>
#include <string>

#include <caf/expected.hpp>

#include "actors/engine.hpp"
#include "serve/serve_config.hpp"
#include "sim/simulator.hpp"

namespace computron::serve {

/// The simulator's view of a serve config: devices, options, and each model's shards
/// (their bytes from the engines' layouts; nothing is allocated) and compute cost. A CUDA
/// config's devices need `capacity_gb` and `link_gbps` (the simulator opens none).
caf::expected<sim::sim_config> sim_config_from(const serve_config& cfg,
                                               const actors::engine_registry& engines,
                                               const sim::cost_model& cost, double capacity_gb = 0,
                                               double link_gbps = 0);

/// Reads cost-model fields from a JSON object over `base`; errors name the field.
caf::expected<sim::cost_model> read_cost(const std::string& json_text, sim::cost_model base);
/// The same from a file; errors name the file.
caf::expected<sim::cost_model> read_cost_file(const std::string& path, sim::cost_model base);

/// What a running server measured: the cost model's link efficiency and eviction time,
/// and each model's compute per forward step (seconds; 0: none measured yet): a step's
/// fixed cost and its cost per token where the server fitted them, else one mean.
struct calibration {
  sim::cost_model cost;
  std::map<std::string, double> step_s;
  std::map<std::string, double> step_per_token_s{};
};

/// From a running server (`source` an http URL: its /metrics and /v2/status), or from a
/// file: `computron bench exp1 --json` output, or an object with a "cost" field.
caf::expected<calibration> calibrate(const std::string& source, const sim::sim_config& cfg,
                                     sim::cost_model base);

}  // namespace computron::serve
