#pragma once

#include <cstdint>
#include <vector>

#include <caf/expected.hpp>

#include "engine/step.hpp"
#include "models/host_tensor.hpp"
#include "models/sampling.hpp"

/// Sampling a step's tokens from the last stage's logits on the host, one sampler per row
/// (models/sampling.hpp), as the runner does on a shard's sampling rank.
namespace computron::engine {

/// A row's sampling settings as the sampler takes them.
models::sampling_params to_sampling_params(const row_sampling& s);

/// Whether a row's tokens depend on its logits, temperature, top_k, top_p and min_p only
/// (no bias, penalties, min_tokens suppression or log-probabilities): such a row can be
/// drawn where the logits lie (models::sampler::next_device_draw), whatever its settings
/// for the four.
bool device_drawable(const row_sampling& s);

/// How many of its row's most likely ids a row's token is drawn from, when they are all it
/// needs: 1 when greedy, k for top_k k (up to max_candidates), with no processor (bias,
/// penalties, min_tokens suppression) and no log-probabilities; 0 when it needs the whole
/// row. A batch whose every row needs candidates takes only the largest number of them
/// from the last stage (models::head_output).
int64_t candidates_of(const row_sampling& s);
inline constexpr int64_t max_candidates = 256;

/// Picks one token per row from last-stage logits [rows, vocab] f32 with one sampler
/// per row (created from `sampling` and the rows' `prompts` at the first step, the prompt
/// being what the repetition penalty counts as seen; kept across steps, when `sampling`
/// may be empty). Where a row asks
/// for log-probabilities, `logprobs` (when given) gets one entry per row. Logits with more
/// rows than the batch (a prefill where rows asked for their prompt's log-probabilities:
/// each such row's positions before its last follow the batch, decoder_stage::prefill) also
/// fill `prompt_logprobs`, one list per row; a model kind that gives only the batch's rows
/// leaves them empty. Non-finite log-probabilities become -9999. Candidates [rows, k, 2]
/// (logit, id) instead of logits (a batch whose rows need no more, candidates_of) are what
/// each row's sampler draws from, exactly as from the whole row.
caf::expected<std::vector<int64_t>> sample_rows(
    const models::host_tensor& logits, std::vector<models::sampler>& samplers,
    const std::vector<row_sampling>& sampling, const std::vector<std::vector<int64_t>>& prompts,
    std::vector<token_logprobs>* logprobs = nullptr,
    std::vector<std::vector<token_logprobs>>* prompt_logprobs = nullptr);

}  // namespace computron::engine
