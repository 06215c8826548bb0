#include "models/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "common/error.hpp"

namespace computron::models {

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

bool in_vocab(int64_t id, int64_t vocab) {
  return id >= 0 && id < vocab;
}

/// Temperature -> min_p -> top_k -> top_p -> draw, over logits already processed. With min_p
/// at 0 this is operation for operation the sampler that came before the new parameters, so
/// a seed still gives the same tokens.
int64_t draw(const float* logits, int64_t vocab, const sampling_params& p,
             const std::function<double()>& uniform) {
  std::vector<int64_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  // Most likely first; a stable order keeps equal logits deterministic.
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  double top = logits[ids[0]] / p.temperature;
  // Everything suppressed (or a model that gave only -inf): no distribution to draw from.
  if (top == -std::numeric_limits<double>::infinity()) return ids[0];
  auto keep = static_cast<size_t>(p.top_k > 0 ? std::min(p.top_k, vocab) : vocab);
  if (p.min_p > 0) {
    // Sorted, so min_p cuts a prefix like top_k does; the ratio to the most likely token
    // needs no normalisation, and cutting before top_k or after gives the same set.
    size_t cut = 0;
    while (cut < keep && std::exp(logits[ids[cut]] / p.temperature - top) >= p.min_p) ++cut;
    keep = std::max<size_t>(cut, 1);
  }
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(logits[ids[i]] / p.temperature - top);
    sum += probs[i];
  }
  // Nucleus: the shortest prefix whose mass reaches top_p.
  double mass = 0;
  size_t nucleus = keep;
  for (size_t i = 0; i < keep; ++i) {
    mass += probs[i] / sum;
    if (mass >= p.top_p) {
      nucleus = i + 1;
      break;
    }
  }
  double total =
      std::accumulate(probs.begin(), probs.begin() + static_cast<ptrdiff_t>(nucleus), 0.0);
  // uniform_real_distribution(0, total) is total times one generate_canonical draw (as
  // libstdc++ computes it), so a number taken ahead (next_device_draw) gives the same r.
  double r = total * uniform();
  for (size_t i = 0; i < nucleus; ++i) {
    r -= probs[i];
    if (r < 0) return ids[i];
  }
  // Rounding left r >= 0: the last candidate that can be drawn at all, never a suppressed
  // (probability 0) one at the tail.
  for (size_t i = nucleus; i-- > 0;)
    if (probs[i] > 0) return ids[i];
  return ids[0];
}

/// The `k` best ids of a row, most likely first, lower id first on ties: a heap of k whose
/// front is the worst kept, so a row costs O(vocab log k) and no vocab-sized allocation.
std::vector<int64_t> top_ids(const float* logits, int64_t vocab, int64_t k) {
  k = std::min<int64_t>(std::max<int64_t>(k, 0), vocab);
  auto better = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int64_t> heap;
  if (k == 0) return heap;
  heap.reserve(static_cast<size_t>(k));
  for (int64_t id = 0; id < vocab; ++id) {
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back(id);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(id, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = id;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort_heap(heap.begin(), heap.end(), better);
  return heap;
}

/// One number in [0, 1) from the stream, as uniform_real_distribution<double> takes it.
double canonical(std::mt19937_64& rng) {
  return std::generate_canonical<double, std::numeric_limits<double>::digits>(rng);
}

/// log(sum(exp(logits))) in double, shifted by the max so large logits do not overflow.
double log_sum_exp(const float* logits, int64_t vocab) {
  double m = *std::max_element(logits, logits + vocab);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(logits[i]) - m);
  return m + std::log(s);
}

/// Fills `c`'s log-probabilities for `c.token` and the top `k` from raw logits.
void fill_logprobs(const float* logits, int64_t vocab, int64_t k, token_choice& c) {
  double lse = log_sum_exp(logits, vocab);
  auto logprob = [&](int64_t id) {
    return static_cast<float>(static_cast<double>(logits[id]) - lse);
  };
  c.logprob = in_vocab(c.token, vocab) ? logprob(c.token) : neg_inf;
  c.top_ids = top_ids(logits, vocab, k);
  c.top_logprobs.clear();
  c.top_logprobs.reserve(c.top_ids.size());
  for (auto id : c.top_ids) c.top_logprobs.push_back(logprob(id));
}

}  // namespace

caf::error validate(const sampling_params& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    return make_error(ec::invalid_request,
                      fmt::format("temperature must be >= 0 and finite, got {}", p.temperature));
  if (p.top_k < -1)
    return make_error(ec::invalid_request,
                      fmt::format("top_k must be -1 (off), 0 (off) or positive, got {}", p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1))
    return make_error(ec::invalid_request, fmt::format("top_p must be in (0, 1], got {}", p.top_p));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    return make_error(ec::invalid_request, fmt::format("min_p must be in [0, 1], got {}", p.min_p));
  if (!(p.repetition_penalty > 0))
    return make_error(ec::invalid_request,
                      fmt::format("repetition_penalty must be > 0, got {}", p.repetition_penalty));
  if (!std::isfinite(p.repetition_penalty))
    return make_error(ec::invalid_request, fmt::format("repetition_penalty must be finite, got {}",
                                                       p.repetition_penalty));
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    return make_error(
        ec::invalid_request,
        fmt::format("presence_penalty must be in [-2, 2], got {}", p.presence_penalty));
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    return make_error(
        ec::invalid_request,
        fmt::format("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty));
  if (p.logprobs < -1 || p.logprobs > 20)
    return make_error(
        ec::invalid_request,
        fmt::format("logprobs must be in 0..20 (or -1 for none), got {}", p.logprobs));
  for (const auto& [id, bias] : p.logit_bias)
    if (!(bias >= -100 && bias <= 100))
      return make_error(
          ec::invalid_request,
          fmt::format("logit_bias for token {} must be in [-100, 100], got {}", id, bias));
  if (p.min_tokens < 0)
    return make_error(ec::invalid_request,
                      fmt::format("min_tokens must be >= 0, got {}", p.min_tokens));
  return {};
}

sampler::sampler(const sampling_params& p, const std::vector<int64_t>& prompt)
    : params_(p), rng_(p.seed) {
  // The prompt matters only to the repetition penalty; a long prompt is not kept otherwise.
  if (params_.repetition_penalty != 1.0) {
    prompt_ = prompt;
    std::sort(prompt_.begin(), prompt_.end());
    prompt_.erase(std::unique(prompt_.begin(), prompt_.end()), prompt_.end());
  }
}

bool sampler::processing_active() const {
  if (!params_.logit_bias.empty()) return true;
  if (drawn_ < params_.min_tokens && !params_.suppress.empty()) return true;
  if (params_.repetition_penalty != 1.0 && (!prompt_.empty() || !counts_.empty())) return true;
  return (params_.presence_penalty != 0 || params_.frequency_penalty != 0) && !counts_.empty();
}

void sampler::apply_processors(float* logits, int64_t vocab) const {
  if (drawn_ < params_.min_tokens)
    for (auto id : params_.suppress)
      if (in_vocab(id, vocab)) logits[id] = neg_inf;
  for (const auto& [id, bias] : params_.logit_bias)
    if (in_vocab(id, vocab)) logits[id] = static_cast<float>(logits[id] + bias);
  const double rep = params_.repetition_penalty;
  auto repeat = [&](float x) { return static_cast<float>(x > 0 ? x / rep : x * rep); };
  if (rep != 1.0)
    for (auto id : prompt_)
      if (in_vocab(id, vocab)) logits[id] = repeat(logits[id]);
  // Each id once: the repetition penalty does not grow with the count (HF, vLLM); the
  // OpenAI penalties see generated ids only.
  for (const auto& [id, count] : counts_) {
    if (!in_vocab(id, vocab)) continue;
    float x = logits[id];
    if (rep != 1.0 && !std::binary_search(prompt_.begin(), prompt_.end(), id)) x = repeat(x);
    logits[id] = static_cast<float>(x - params_.frequency_penalty * static_cast<double>(count) -
                                    params_.presence_penalty);
  }
}

int64_t sampler::pick(const float* logits, int64_t vocab) {
  int64_t token = params_.temperature == 0  // greedy; ties go to the lowest id
                      ? std::max_element(logits, logits + vocab) - logits
                      : draw(logits, vocab, params_, [this] {
                          if (!pending_) return canonical(rng_);
                          double u = *pending_;
                          pending_.reset();
                          return u;
                        });
  ++drawn_;
  if (params_.repetition_penalty != 1.0 || params_.presence_penalty != 0 ||
      params_.frequency_penalty != 0)
    ++counts_[token];
  return token;
}

int64_t sampler::next(const float* logits, int64_t vocab) {
  if (vocab <= 0) return 0;
  // The plain case stays a scan of the caller's logits: no copy, no allocation when greedy.
  if (!processing_active()) return pick(logits, vocab);
  std::vector<float> work(logits, logits + vocab);
  apply_processors(work.data(), vocab);
  return pick(work.data(), vocab);
}

std::optional<device_draw> sampler::next_device_draw() {
  if (processing_active() || wants_logprobs()) return std::nullopt;
  device_draw d{params_.temperature, params_.top_k, params_.top_p, params_.min_p, 0};
  if (d.temperature > 0) {
    if (!pending_) pending_ = canonical(rng_);
    d.uniform = *pending_;
  }
  return d;
}

token_choice sampler::choose(const float* logits, int64_t vocab) {
  token_choice c;
  c.token = next(logits, vocab);
  if (wants_logprobs() && vocab > 0) fill_logprobs(logits, vocab, params_.logprobs, c);
  return c;
}

std::vector<token_choice> score_tokens(const float* logits, int64_t rows, int64_t vocab,
                                       const std::vector<int64_t>& ids, int32_t k) {
  std::vector<token_choice> out;
  if (vocab <= 0 || rows <= 0) return out;
  auto n = std::min(static_cast<size_t>(rows), ids.size());
  out.resize(n);
  for (size_t r = 0; r < n; ++r) {
    out[r].token = ids[r];
    fill_logprobs(logits + static_cast<int64_t>(r) * vocab, vocab, k, out[r]);
  }
  return out;
}

}  // namespace computron::models
