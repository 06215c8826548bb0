#include "engine/sampling.hpp"

#include <cmath>
#include <string>

#include "common/error.hpp"

namespace computron::engine {

models::sampling_params to_sampling_params(const row_sampling& s) {
  models::sampling_params p;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.seed = s.seed;
  p.min_p = s.min_p;
  p.repetition_penalty = s.repetition_penalty;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  for (size_t i = 0; i < s.bias_ids.size() && i < s.bias_values.size(); ++i)
    p.logit_bias.emplace_back(s.bias_ids[i], s.bias_values[i]);
  p.min_tokens = s.min_tokens;
  p.suppress = s.suppress;
  p.logprobs = s.logprobs;
  return p;
}

bool device_drawable(const row_sampling& s) {
  return s.logprobs < 0 && s.prompt_logprobs < 0 && s.bias_ids.empty() &&
         s.repetition_penalty == 1.0 && s.presence_penalty == 0 && s.frequency_penalty == 0 &&
         (s.min_tokens == 0 || s.suppress.empty());
}

int64_t candidates_of(const row_sampling& s) {
  if (!device_drawable(s)) return 0;
  if (s.temperature == 0) return 1;
  // The sampler keeps the top_k most likely first (min_p and top_p cut within them).
  return s.top_k >= 1 && s.top_k <= max_candidates ? s.top_k : 0;
}

namespace {

/// At a batch's first step (no samplers yet), one sampler per row from its settings and its
/// prompt (what the repetition penalty counts as seen); then, at every step, one per row of
/// `what` the last stage returned.
caf::error ensure_samplers(std::vector<models::sampler>& samplers,
                           const std::vector<row_sampling>& sampling,
                           const std::vector<std::vector<int64_t>>& prompts, size_t rows,
                           const char* what) {
  if (samplers.empty()) {
    if (sampling.size() != rows)
      return make_error(ec::invalid_request, "sampling parameters for " +
                                                 std::to_string(sampling.size()) + " rows, " +
                                                 what + " for " + std::to_string(rows));
    static const std::vector<int64_t> none;
    for (size_t r = 0; r < sampling.size(); ++r)
      samplers.emplace_back(to_sampling_params(sampling[r]),
                            r < prompts.size() ? prompts[r] : none);
  }
  if (samplers.size() != rows)
    return make_error(ec::invalid_state, "the batch has " + std::to_string(samplers.size()) +
                                             " samplers for " + std::to_string(rows) + " rows");
  return {};
}

token_logprobs to_wire(models::token_choice c) {
  // -inf (a token the model rules out, an f16 overflow) and NaN are not numbers a message
  // or JSON can carry: -9999, as vLLM clamps them.
  auto finite = [](float x) { return std::isfinite(x) ? x : -9999.0f; };
  for (auto& x : c.top_logprobs) x = finite(x);
  return token_logprobs{finite(c.logprob), std::move(c.top_ids), std::move(c.top_logprobs)};
}

}  // namespace

caf::expected<std::vector<int64_t>> sample_rows(
    const models::host_tensor& logits, std::vector<models::sampler>& samplers,
    const std::vector<row_sampling>& sampling, const std::vector<std::vector<int64_t>>& prompts,
    std::vector<token_logprobs>* logprobs,
    std::vector<std::vector<token_logprobs>>* prompt_logprobs) {
  if (samplers.empty() && logits.type == gpu::dtype::f32 && logits.shape.size() == 2 &&
      logits.shape[0] > static_cast<int64_t>(sampling.size())) {
    // A prefill (no samplers yet) where rows asked for their prompt's log-probabilities:
    // after the batch's rows come each such row's positions before its last
    // (decoder_stage::prefill).
    const auto rows = static_cast<int64_t>(sampling.size()), vocab = logits.shape[1];
    auto* all = reinterpret_cast<const float*>(logits.bytes.data());
    auto scored_positions = [&](int64_t r) -> int64_t {
      auto n = static_cast<size_t>(r) < prompts.size()
                   ? static_cast<int64_t>(prompts[static_cast<size_t>(r)].size())
                   : 0;
      return sampling[static_cast<size_t>(r)].prompt_logprobs >= 0 && n >= 2 ? n - 1 : 0;
    };
    int64_t need = rows;
    for (int64_t r = 0; r < rows; ++r) need += scored_positions(r);
    if (need != logits.shape[0])
      return make_error(ec::invalid_state,
                        "last stage returned " + std::to_string(logits.shape[0]) +
                            " rows of logits; the batch and its scored prompts need " +
                            std::to_string(need));
    if (prompt_logprobs) prompt_logprobs->assign(sampling.size(), {});
    int64_t cursor = rows;
    for (int64_t r = 0; r < rows; ++r) {
      auto k = sampling[static_cast<size_t>(r)].prompt_logprobs;
      auto n = scored_positions(r) + 1;
      if (n < 2) continue;
      auto& p = prompts[static_cast<size_t>(r)];
      std::vector<int64_t> next(p.begin() + 1, p.end());
      if (prompt_logprobs) {
        auto& out = (*prompt_logprobs)[static_cast<size_t>(r)];
        for (auto& c : models::score_tokens(all + cursor * vocab, n - 1, vocab, next, k))
          out.push_back(to_wire(std::move(c)));
      }
      cursor += n - 1;
    }
    models::host_tensor last;
    last.type = gpu::dtype::f32;
    last.shape = {rows, vocab};
    last.bytes.assign(logits.bytes.begin(),
                      logits.bytes.begin() + static_cast<ptrdiff_t>(rows * vocab * 4));
    return sample_rows(last, samplers, sampling, prompts, logprobs, nullptr);
  }
  if (logits.type == gpu::dtype::f32 && logits.shape.size() == 3 && logits.shape[2] == 2) {
    // Candidates: each row's k most likely (logit, id), most likely first.
    const auto rows = static_cast<size_t>(logits.shape[0]);
    const auto k = logits.shape[1];
    if (auto err = ensure_samplers(samplers, sampling, prompts, rows, "candidates")) return err;
    auto* pairs = reinterpret_cast<const float*>(logits.bytes.data());
    std::vector<float> values(static_cast<size_t>(k));
    std::vector<int64_t> out(rows);
    for (size_t r = 0; r < rows; ++r) {
      const float* row = pairs + static_cast<int64_t>(r) * k * 2;
      for (int64_t c = 0; c < k; ++c) values[static_cast<size_t>(c)] = row[2 * c];
      auto pick = samplers[r].next(values.data(), k);
      out[r] = static_cast<int64_t>(row[2 * pick + 1]);
    }
    return out;
  }
  if (logits.type != gpu::dtype::f32 || logits.shape.size() != 2)
    return make_error(ec::invalid_state,
                      "last stage returned logits that are not [rows, vocab] f32");
  auto rows = static_cast<size_t>(logits.shape[0]);
  auto vocab = logits.shape[1];
  if (auto err = ensure_samplers(samplers, sampling, prompts, rows, "logits")) return err;
  std::vector<int64_t> out(rows);
  auto* data = reinterpret_cast<const float*>(logits.bytes.data());
  bool any = false;
  for (auto& s : samplers) any = any || s.wants_logprobs();
  if (!any || logprobs == nullptr) {
    for (size_t r = 0; r < rows; ++r) out[r] = samplers[r].next(data + r * vocab, vocab);
    return out;
  }
  logprobs->assign(rows, {});
  for (size_t r = 0; r < rows; ++r) {
    if (!samplers[r].wants_logprobs()) {
      out[r] = samplers[r].next(data + r * vocab, vocab);
      continue;
    }
    auto c = samplers[r].choose(data + r * vocab, vocab);
    out[r] = c.token;
    (*logprobs)[r] = to_wire(std::move(c));
  }
  return out;
}

}  // namespace computron::engine
