#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "actors/messages.hpp"

/// The request bodies of the text APIs (OpenAI's /v1/completions, Triton's generate
/// extension) and of KServe's infer, read strictly: an unknown or misspelt field is a
/// 400 naming it, as unknown config keys are. No actors, no sockets: plain functions.
namespace computron::net {

/// The one range of max_tokens in every API.

/// A prompt as text or as token ids.
using prompt = std::variant<std::string, std::vector<int64_t>>;

/// What a text API asks for, in every API's terms.
struct generation_request {
  std::string model;
  std::vector<prompt> prompts;
  int64_t max_tokens = 16;
  actors::row_sampling sampling;
  std::vector<std::string> stop;
  bool stream = false;
  /// OpenAI's stream_options.include_usage: a last chunk with the counts.
  bool stream_usage = false;
  uint32_t deadline_ms = 0;
  /// Refused rather than answered late (infer_request::drop_late).
  bool drop_late = false;
};

/// A 400 (invalid_request) that names the offending field, OpenAI's `param`.
struct request_error {
  std::string message;
  std::string param;
};

/// POST /v1/completions. Accepts model, prompt (text, list of texts, token ids, list of
/// token-id lists), max_tokens (default 16), temperature (default 1), top_p, top_k, n (1),
/// stop (a string or up to 4), seed, stream, stream_options, echo (false), logprobs (null),
/// best_of (1), presence/frequency_penalty (0), user, suffix (null), deadline_ms, drop_late.
std::variant<generation_request, request_error> parse_completion(const nlohmann::json& body,
                                                                 uint32_t max_prompts,
                                                                 int64_t max_tokens);

/// POST /v2/models/{m}/generate[_stream]: text_input, and max_tokens, temperature,
/// top_p, top_k, seed, stop, deadline_ms, drop_late at the top level or under "parameters" (greedy
/// unless a temperature is given, as Triton's backends do).
std::variant<generation_request, request_error> parse_generate(const nlohmann::json& body,
                                                               const std::string& model,
                                                               bool stream, int64_t max_tokens);

/// KServe v2 infer: one INT64/INT32 input named `input_ids`, [batch, length] or [length];
/// parameters max_tokens (default 1), temperature, top_k, top_p, seed, deadline_ms,
/// drop_late.
struct infer_body {
  std::vector<std::vector<int64_t>> rows;
  int64_t max_tokens = 1;
  actors::row_sampling sampling;
  uint32_t deadline_ms = 0;
  bool drop_late = false;
  std::string request_id;
};

std::variant<infer_body, request_error> parse_infer_body(const nlohmann::json& body,
                                                         uint32_t max_rows, int64_t max_tokens);

/// OpenAI's error object: {"error": {"message", "type", "param", "code"}}; `code` is
/// Computron's error name ("model_not_found" for an unknown model, as OpenAI says it).
nlohmann::json openai_error(int http_status, const std::string& message, const std::string& code,
                            const std::string& param = {});

}  // namespace computron::net
