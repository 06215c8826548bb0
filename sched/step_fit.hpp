#pragma once

// A model's forward step cost as a line in the tokens the step computes, fitted to the
// steps it ran: what `computron sim --calibrate` gives the simulator's cost model.
#include <algorithm>

namespace computron::sched {

/// Least squares over measured steps of (tokens: prompt tokens at a prefill or chunk, one
/// per row at a decode step; seconds of compute over all stages). A step's fixed cost
/// (launches, the all-reduces, the head) and its cost per token differ by orders of
/// magnitude between a decode step of a few rows and a long prefill, which one mean per
/// step cannot follow on a workload of mixed lengths.
struct step_fit {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;

  void add(double tokens, double seconds) {
    n += 1;
    sx += tokens;
    sy += seconds;
    sxx += tokens * tokens;
    sxy += tokens * seconds;
  }

  struct line {
    double fixed_s = 0;
    double per_token_s = 0;
  };
  /// The fitted line, never negative: with one token count only (or none), the mean as
  /// the fixed cost; a negative intercept becomes 0 with the slope through the origin.
  line fitted() const {
    if (n < 1) return {};
    const double den = n * sxx - sx * sx;
    if (den <= 1e-9 * std::max(1.0, n * sxx)) return {sy / n, 0};
    double slope = (n * sxy - sx * sy) / den;
    double icpt = (sy - slope * sx) / n;
    if (slope < 0) return {sy / n, 0};
    if (icpt < 0) return {0, sxx > 0 ? sxy / sxx : 0};
    return {icpt, slope};
  }
};

}  // namespace computron::sched
