#pragma once

// What the experiment commands share (experiments.cpp: exp1 and exp2;
// apps/computron/sim_fidelity.cpp: `bench sim`, which needs the simulator's CLI).
#include <filesystem>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "bench/experiments/experiments.hpp"

namespace computron::bench::detail {

/// An experiment-2 cell's rates as its label: "(1,10,10)", or "(1x8)" for more than three
/// equal ones.
std::string rates_label(const std::vector<double>& r);

/// This binary's path, to run `computron bench ...` as a child.
std::string self_exe();

/// Checks the options and makes the output folder: the one asked for, or a fresh
/// temporary one.
caf::expected<std::filesystem::path> output_dir(const experiment_options& o,
                                                const std::string& name);

/// The mean of `xs` (0 for none).
double mean(const std::vector<double>& xs);

}  // namespace computron::bench::detail
