#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "net/client/llm_dataset.hpp"
#include "net/client/loadgen.hpp"
#include "workload/arrivals.hpp"

/// The text prompts of `computron loadgen`'s LLM mode, made before the run: a dataset's
/// prompts in their seeded order, or (chat without a dataset) random token ids the server
/// turns into text. The server's own tokenizer counts each one (POST /tokenize), so the
/// report's input tokens are the server's and a prompt is fitted to its model's context.
namespace computron::net {

/// The OpenAI route an LLM run streams from.
enum class llm_api { completions, chat };

/// "completions", "chat" (the value of the report's "api" key).
std::string to_string(llm_api a);

/// One request's prompt as text, and what the server counted.
struct text_prompt {
  std::string text;
  /// The prompt's tokens as the request's route reads it (chat: the template's rendering of
  /// one user message).
  int64_t prompt_tokens = 0;
  /// Tokens to generate, fitted to the context.
  int64_t output_tokens = 0;
};

struct text_prompts {
  /// One per arrival, in the schedule's order.
  std::vector<text_prompt> prompts;
  /// Requests whose output was shortened to fit their model's context.
  size_t clipped = 0;
};

struct text_prompt_options {
  server_address server;
  llm_api api = llm_api::chat;
  /// Seeds the dataset's order and the random prompts' token ids.
  uint64_t seed = 1;
  /// Bounds each call to the server.
  std::chrono::milliseconds timeout{30000};
};

/// Each arrival's prompt as text. With a dataset, arrival i takes the prompt at position
/// i (cycling) of dataset_order, and its output length is the prompt's output_tokens, its
/// reply's token count (ShareGPT), else the arrival's max_tokens. Without one, a prompt is
/// random token ids of the arrival's prompt_len detokenized by the server (POST
/// /detokenize), so it is text the model's tokenizer reads back to about that length.
/// Every distinct prompt is counted once per model. Errors: invalid_request when the
/// server refuses to count a prompt (e.g. a model without a chat template, for chat) or
/// a prompt leaves no room in its model's context for one output token, naming the prompt;
/// io_error when the server cannot be reached.
caf::expected<text_prompts> make_text_prompts(const workload::schedule& s,
                                              const std::vector<served_model>& models,
                                              const std::vector<dataset_prompt>& dataset,
                                              const text_prompt_options& opts);

/// `n` random token ids below `vocab`: the token-id prompts of the completions route, and
/// what a chat prompt without a dataset is made from.
std::vector<int64_t> random_token_ids(std::mt19937_64& rng, int64_t vocab, int64_t n);

}  // namespace computron::net
