#pragma once

#include <cstdint>
#include <random>

#include <caf/error.hpp>

/// Choosing the next token from logits: greedy, or seeded temperature / top-k / top-p.
namespace computron::models {

struct sampling_params {
  /// 0 means greedy (argmax); otherwise logits are divided by it before sampling.
  double temperature = 0;
  /// Keep only the k most likely tokens (0: all).
  int64_t top_k = 0;
  /// Keep the smallest set of most likely tokens whose probability reaches p (1: all).
  double top_p = 1.0;
  /// Seed of the request's random stream: the same seed gives the same tokens.
  uint64_t seed = 0;
};

/// Errors for a negative or non-finite temperature, negative top_k, top_p outside (0, 1].
caf::error validate(const sampling_params& p);

/// Draws tokens for one sequence; holds its own seeded generator.
class sampler {
 public:
  explicit sampler(const sampling_params& p);
  /// The next token from `vocab` logits.
  int64_t next(const float* logits, int64_t vocab);

 private:
  sampling_params params_;
  std::mt19937_64 rng_;
};

}  // namespace computron::models
