#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/error.hpp>

/// Choosing the next token from logits: greedy, or seeded temperature / min-p / top-k / top-p,
/// after logit bias, penalties and min_tokens suppression (vLLM's semantics, OpenAI's
/// parameters). Every new field defaults to "off", and then the tokens are the same as before
/// they existed.
namespace computron::models {

struct sampling_params {
  /// 0 means greedy (argmax); otherwise logits are divided by it before sampling.
  double temperature = 0;
  /// Keep only the k most likely tokens (0 or -1: all).
  int64_t top_k = 0;
  /// Keep the smallest set of most likely tokens whose probability reaches p (1: all).
  double top_p = 1.0;
  /// Seed of the request's random stream: the same seed gives the same tokens.
  uint64_t seed = 0;
  /// Keep only tokens whose probability (after temperature) is >= min_p * the largest one.
  double min_p = 0;
  /// Every id seen in the prompt or generated: logit > 0 ? logit / penalty : logit * penalty.
  double repetition_penalty = 1.0;
  /// Subtracted once from the logit of every id generated so far (OpenAI's formula).
  double presence_penalty = 0;
  /// Subtracted from the logit of every generated id, times how often it was generated.
  double frequency_penalty = 0;
  /// (id, value) added to that id's logit before anything else; ids outside the vocabulary
  /// are ignored when sampling (validate cannot know the vocabulary). The `{}` keeps the
  /// four-field aggregate initialisations free of -Wmissing-field-initializers.
  std::vector<std::pair<int64_t, double>> logit_bias{};
  /// While fewer than min_tokens tokens have been drawn, the ids in `suppress` cannot be.
  int64_t min_tokens = 0;
  /// The ids min_tokens holds back: the caller passes EOS and the stop-token ids.
  std::vector<int64_t> suppress{};
  /// -1: no log-probabilities; k >= 0: the chosen token's and the k most likely ones.
  int32_t logprobs = -1;
};

/// Errors, naming the parameter as OpenAI does: a negative or non-finite temperature,
/// top_k < -1, top_p outside (0, 1], min_p outside [0, 1], a repetition_penalty that is not
/// finite and > 0, presence/frequency penalties outside [-2, 2], logprobs outside -1..20, a
/// logit_bias value outside [-100, 100], negative min_tokens.
caf::error validate(const sampling_params& p);

/// One drawn token, with its log-probabilities when the params ask for them. They are of the
/// raw model distribution (log_softmax of the logits as given, before bias, penalties and
/// temperature), as vLLM reports by default.
struct token_choice {
  int64_t token = 0;
  /// Of `token` (only when logprobs >= 0).
  float logprob = 0;
  /// The `logprobs` most likely ids, most likely first (ties: lower id first).
  std::vector<int64_t> top_ids;
  std::vector<float> top_logprobs;
};

/// What a draw on the device (engine/torch/device_sampling.hpp) needs of one row whose next
/// token depends on its logits and these four parameters only: no processor is active and
/// no log-probabilities are asked (sampler::device_draw). `uniform` is the row's next
/// number in [0, 1) from its own seeded stream, the one the host sampler would use: the
/// device draws the token the host would draw, and only its id comes back.
struct device_draw {
  double temperature = 0;  // 0: greedy (no number is drawn)
  int64_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0;
  double uniform = 0;
};

/// Draws tokens for one sequence; holds its own seeded generator and what it has drawn (for
/// the penalties and min_tokens). Copyable: batches keep and drop rows by copying samplers.
class sampler {
 public:
  /// `prompt`: the row's prompt ids (the repetition penalty counts them as seen).
  explicit sampler(const sampling_params& p, const std::vector<int64_t>& prompt = {});
  /// The next token from `vocab` logits; records it for the penalties and min_tokens.
  int64_t next(const float* logits, int64_t vocab);
  /// next(), with the log-probabilities filled when the params ask for them.
  token_choice choose(const float* logits, int64_t vocab);
  /// True when the params ask for log-probabilities (logprobs >= 0).
  bool wants_logprobs() const { return params_.logprobs >= 0; }
  /// Applies suppression, logit_bias and the penalties to `logits` in place, as next() does
  /// before the temperature: what the penalties did can be seen (tests, debugging).
  void apply_processors(float* logits, int64_t vocab) const;
  /// How many tokens this sampler has drawn.
  int64_t drawn() const { return drawn_; }
  /// The next draw as a device can make it, when the next token depends on nothing but the
  /// logits, the temperature, top_k, top_p and min_p (no processor active, no
  /// log-probabilities asked); nullopt otherwise. Its `uniform` is the number the next draw
  /// will use, taken from the stream now and kept: asking again gives the same one, and
  /// next() over the one candidate the device returns ([that logit], 1) draws that same
  /// candidate with it, so the stream stays where the host path leaves it.
  std::optional<device_draw> next_device_draw();

 private:
  /// True when apply_processors would change something for the next draw.
  bool processing_active() const;
  /// Picks from already processed logits and records the token.
  int64_t pick(const float* logits, int64_t vocab);

  sampling_params params_;
  std::mt19937_64 rng_;
  /// The next draw's number, once next_device_draw took it from rng_.
  std::optional<double> pending_;
  /// Prompt ids, sorted and unique; kept only when the repetition penalty is on.
  std::vector<int64_t> prompt_;
  /// How often each id was generated; kept only when some penalty is on.
  std::unordered_map<int64_t, int64_t> counts_;
  int64_t drawn_ = 0;
};

/// Log-probabilities of `ids[i]` under row i of `logits` ([rows, vocab] row-major), each with
/// the top k of that row (k may be 0): for the prompt logprobs of echo. Same conventions as
/// token_choice; an id outside the vocabulary gets -inf. Rows beyond ids.size() are skipped.
std::vector<token_choice> score_tokens(const float* logits, int64_t rows, int64_t vocab,
                                       const std::vector<int64_t>& ids, int32_t k);

}  // namespace computron::models
