#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "sched/step_plan.hpp"

/// What a shard runs for one step: the dispatch core's typed plan (sched/step_plan.hpp) with
/// the inputs its rows bring, as the step protocol carries it from the manager through every
/// stage (actors/step_messages.hpp) and the runner hands it to a backend (engine/runner.hpp).
/// Each struct has an inspect() so that it crosses processes unchanged.
namespace computron::sched {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, planned_row& x) {
  return f(caf::meta::type_name("planned_row"), x.key, x.prompt_tokens, x.computed, x.scheduled,
           x.blocks);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_plan& x) {
  return f(caf::meta::type_name("step_plan"), x.batch, x.into, x.rows, x.finished, x.kv_spare,
           x.chunk, x.left);
}

}  // namespace computron::sched

namespace computron::engine {

/// How one sequence picks its tokens (models::sampling_params on the wire; the meanings
/// are documented there). Every default is neutral.
struct row_sampling {
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  double min_p = 0;
  double repetition_penalty = 1.0;
  double presence_penalty = 0;
  double frequency_penalty = 0;
  /// OpenAI's logit_bias as two parallel lists (ids, values).
  std::vector<int64_t> bias_ids{};
  std::vector<double> bias_values{};
  /// Until this many tokens were drawn, the ids in `suppress` (EOS and stop ids) cannot be.
  int64_t min_tokens = 0;
  std::vector<int64_t> suppress{};
  /// -1: no log-probabilities; k >= 0: the chosen token's and the top k.
  int32_t logprobs = -1;
  /// -1: none; k >= 0: the log-probability of each prompt token after the first, with the
  /// top k (echo with logprobs; the last stage computes every position's logits).
  int32_t prompt_logprobs = -1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, row_sampling& x) {
  return f(caf::meta::type_name("row_sampling"), x.temperature, x.top_k, x.top_p, x.seed, x.min_p,
           x.repetition_penalty, x.presence_penalty, x.frequency_penalty, x.bias_ids, x.bias_values,
           x.min_tokens, x.suppress, x.logprobs, x.prompt_logprobs);
}

/// One generated (or prompt) token's log-probability under the model's raw distribution,
/// with the most likely alternatives (row_sampling::logprobs of them), most likely first.
struct token_logprobs {
  float logprob = 0;
  std::vector<int64_t> top_ids;
  std::vector<float> top_logprobs;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprobs& x) {
  return f(caf::meta::type_name("token_logprobs"), x.logprob, x.top_ids, x.top_logprobs);
}

/// One step of a batch on a shard: the plan, and per row what it brings. Rows are in the
/// plan's order; a row that prefills (or computes a chunk) brings its whole prompt, and its
/// sampling settings and adapter once, at its first step; a decoding row brings its last
/// token. Whether a step prefills, computes a chunk or decodes is the plan's mode.
struct step_input {
  /// The batch's step count: 0 for its first step and a join's steps, k for its k-th
  /// decode step (traces; the toy reads a window of its bytes by it).
  int32_t step = 0;
  sched::step_plan plan;
  /// The batch ends after this step (no row outlives it): its caches and samplers go.
  bool last = false;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int64_t> tokens;
  /// Prefill: one per row (the sampling rank keeps its samplers); later steps carry none.
  std::vector<row_sampling> sampling;
  /// Prefill: the adapter each row runs with, as registered ("": the base alone). The rows
  /// keep theirs for the batch's later steps. Empty: every row runs the base alone.
  std::vector<std::string> adapters;

  /// Rows prefill (a whole prompt or a chunk of it): the caches are filled, not read on.
  bool prefills() const {
    auto m = plan.mode();
    return m == sched::step_mode::prefill || m == sched::step_mode::chunk;
  }
  /// A chunk of a chunked prefill that leaves more for later: nothing to sample yet.
  bool partial_prefill() const { return plan.chunk > 0 && plan.left > 0; }
  /// Rows the step runs.
  size_t rows() const { return plan.rows.size(); }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_input& x) {
  return f(caf::meta::type_name("step_input"), x.step, x.plan, x.last, x.prompts, x.tokens,
           x.sampling, x.adapters);
}

/// A batch's first step, as the dispatch core plans one: every row's whole prompt, rows
/// keyed 0..n-1 (an empty prompt counts as one token), its KV blocks named in row order
/// from id 0. The reference loop's
/// (engine::generate) and the tests'.
step_input prefill_step(uint64_t batch, std::vector<std::vector<int64_t>> prompts,
                        std::vector<row_sampling> sampling);

/// Makes `in` its batch's next decode step after it gave `tokens` (one per row): each row's
/// caches then hold what it computed, and it computes its last token (with a block named
/// where it crosses into one; every row of the batch goes on).
void next_decode_step(step_input& in, std::vector<int64_t> tokens);

}  // namespace computron::engine
