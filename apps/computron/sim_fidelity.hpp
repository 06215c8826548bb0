#pragma once

// `computron bench sim` (sim_fidelity.cpp): beside the CLI rather than in bench/experiments
// because it runs the simulator the way `computron sim` does (sim_cli.hpp).
#include "bench/experiments/experiments.hpp"

namespace computron::app {

using bench::experiment_options;

/// `computron bench sim`: experiment 1 and every experiment-2 cell on the runtime (through
/// bench exp1/exp2) and in the simulator with the same configs, arrivals and seeds, side
/// by side: the simulator's fidelity.
int run_sim_fidelity(const experiment_options& opts);

}  // namespace computron::app
