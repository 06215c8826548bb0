#include "models/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"

namespace computron::models {

caf::error validate(const sampling_params& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return make_error(ec::invalid_request,
                      fmt::format("temperature must be >= 0 and finite, got {}", p.temperature));
  if (p.top_k < 0)
    return make_error(ec::invalid_request, fmt::format("top_k must be >= 0, got {}", p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1))
    return make_error(ec::invalid_request, fmt::format("top_p must be in (0, 1], got {}", p.top_p));
  return {};
}

sampler::sampler(const sampling_params& p) : params_(p), rng_(p.seed) {}

int64_t sampler::next(const float* logits, int64_t vocab) {
  if (vocab <= 0) return 0;
  if (params_.temperature == 0)  // greedy; ties go to the lowest id
    return std::max_element(logits, logits + vocab) - logits;
  std::vector<int64_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  // Most likely first; a stable order keeps equal logits deterministic.
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  auto keep = static_cast<size_t>(params_.top_k > 0 ? std::min(params_.top_k, vocab) : vocab);
  std::vector<double> probs(keep);
  double top = logits[ids[0]] / params_.temperature;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(logits[ids[i]] / params_.temperature - top);
    sum += probs[i];
  }
  // Nucleus: the shortest prefix whose mass reaches top_p.
  double mass = 0;
  size_t nucleus = keep;
  for (size_t i = 0; i < keep; ++i) {
    mass += probs[i] / sum;
    if (mass >= params_.top_p) {
      nucleus = i + 1;
      break;
    }
  }
  double total =
      std::accumulate(probs.begin(), probs.begin() + static_cast<ptrdiff_t>(nucleus), 0.0);
  double r = std::uniform_real_distribution<double>(0, total)(rng_);
  for (size_t i = 0; i < nucleus; ++i) {
    r -= probs[i];
    if (r < 0) return ids[i];
  }
  return ids[nucleus - 1];
}

}  // namespace computron::models
