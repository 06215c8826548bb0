#include "workload/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace computron::workload {

namespace {

double sorted_percentile(const std::vector<double>& xs, double p) {
  if (xs.empty()) return 0;
  p = std::clamp(p, 0.0, 1.0);
  const double rank = p * static_cast<double>(xs.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const auto hi = std::min(lo + 1, xs.size() - 1);
  return xs[lo] + (xs[hi] - xs[lo]) * (rank - static_cast<double>(lo));
}

}  // namespace

double percentile(std::vector<double> xs, double p) {
  std::sort(xs.begin(), xs.end());
  return sorted_percentile(xs, p);
}

latency_summary summarize(const std::vector<double>& xs, double slo_s) {
  latency_summary s;
  s.count = xs.size();
  if (xs.empty()) return s;
  auto sorted = xs;
  std::sort(sorted.begin(), sorted.end());
  s.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(s.count);
  s.p50 = sorted_percentile(sorted, 0.50);
  s.p90 = sorted_percentile(sorted, 0.90);
  s.p99 = sorted_percentile(sorted, 0.99);
  s.max = sorted.back();
  if (slo_s > 0) {
    auto within = std::upper_bound(sorted.begin(), sorted.end(), slo_s) - sorted.begin();
    s.slo_attainment = static_cast<double>(within) / static_cast<double>(s.count);
  }
  return s;
}

}  // namespace computron::workload
