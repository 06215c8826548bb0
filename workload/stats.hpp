#pragma once

#include <cstddef>
#include <vector>

/// Latency statistics of a run, as loadgen and the experiments report them.
namespace computron::workload {

/// The p-quantile (p in [0, 1]) with linear interpolation between order statistics
/// (numpy's default): rank p * (n - 1). 0 for an empty sample.
double percentile(std::vector<double> xs, double p);

struct latency_summary {
  size_t count = 0;
  double mean = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
  /// Share of the sample at or under the SLO (1 when no SLO was given).
  double slo_attainment = 1;
};

/// Summary of a sample; `slo_s` <= 0 means no SLO.
latency_summary summarize(const std::vector<double>& xs, double slo_s = 0);

}  // namespace computron::workload
