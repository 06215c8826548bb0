#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "actors/messages.hpp"

/// The request bodies of the text APIs (OpenAI's /v1/completions and /v1/chat/completions,
/// vLLM's /tokenize and /detokenize, Triton's generate extension) and of KServe's infer,
/// read strictly: an unknown or misspelt field is a 400 naming it, as unknown config keys
/// are; and OpenAI's error body. No actors, no sockets: plain functions (the chat,
/// tokenize and detokenize parsers in chat_api.cpp, the rest in llm_api.cpp).
namespace computron::net {

/// A prompt as text or as token ids.
using prompt = std::variant<std::string, std::vector<int64_t>>;

/// What a text API asks for, in every API's terms.
struct generation_request {
  std::string model;
  std::vector<prompt> prompts;
  int64_t max_tokens = 16;
  /// max_tokens was given (else chat answers up to the model's context, and a model's
  /// generation_config.json max_new_tokens applies).
  bool max_tokens_given = false;
  actors::row_sampling sampling;
  /// The sampling settings the request named ("temperature", "top_p", "top_k", "min_p",
  /// "repetition_penalty", "seed"): generation_config.json's defaults fill the others,
  /// and a request without a seed samples anew.
  std::set<std::string> given;
  std::vector<std::string> stop;
  /// Token ids that end a row besides the model's EOS ids (vLLM's stop_token_ids).
  std::vector<int64_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  /// The model's EOS ids do not end a row (stop_token_ids still do).
  bool ignore_eos = false;
  /// Samples per prompt (choices prompt * n + j).
  int64_t n = 1;
  /// Completions: the prompt's text comes before the completion's.
  bool echo = false;
  bool stream = false;
  /// OpenAI's stream_options.include_usage: a last chunk with the counts.
  bool stream_usage = false;
  /// vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk
  /// carries the counts so far, as guidellm asks to time tokens by.
  bool stream_usage_every_chunk = false;
  uint32_t deadline_ms = 0;
  /// Refused rather than answered late (infer_request::drop_late).
  bool drop_late = false;
  /// Chat: the messages as given (checked: roles, text content); null for completions.
  nlohmann::json messages;
  bool add_generation_prompt = true;
  /// More variables for the chat template (vLLM's chat_template_kwargs, e.g. Qwen3's
  /// enable_thinking).
  nlohmann::json template_kwargs = nlohmann::json::object();
  /// Chat: a Jinja template for this request instead of the model's (vLLM's chat_template).
  std::string chat_template;
  /// vLLM's request_id: the answer's id (else a fresh one).
  std::string request_id;
  /// vLLM's truncate_prompt_tokens: each prompt keeps only its last k tokens (-1: as many
  /// as the model's context holds; 0: all).
  int64_t truncate_prompt_tokens = 0;
  /// Whether text prompts get the tokenizer's special tokens (BOS); unset: completions
  /// add them, chat does not (its template writes its own), as vLLM does.
  std::optional<bool> add_special_tokens;
  /// vLLM's return_token_ids: each choice also lists its prompt's and its output's token
  /// ids (always, for a model without a tokenizer, whose text stays empty).
  bool return_token_ids = false;
  /// Fields the request sent that this server accepts and ignores (request_fields.hpp).
  std::vector<std::string> ignored;
  bool chat() const { return !messages.is_null(); }
};

/// A 400 (invalid_request) that names the offending field, OpenAI's `param`.
struct request_error {
  std::string message;
  std::string param;
};

/// A request body as JSON, or why not: bytes that are not UTF-8 are named as such, with
/// the offset of the first bad byte, rather than as "not valid JSON".
std::variant<nlohmann::json, request_error> parse_json_body(const std::string& body);

/// POST /v1/completions. Accepts model, prompt (text, list of texts, token ids, list of
/// token-id lists), max_tokens (default 16), n, echo, logprobs (0..20), the sampling and
/// stopping settings every text API shares (README), stream, stream_options, user,
/// deadline_ms, drop_late; best_of and suffix are refused as unsupported.
std::variant<generation_request, request_error> parse_completion(const nlohmann::json& body,
                                                                 uint32_t max_prompts,
                                                                 int64_t max_tokens);

/// POST /v1/chat/completions, as vLLM serves it: model, messages (system, user, assistant,
/// developer, tool; content a string or a list of text parts), max_tokens or
/// max_completion_tokens, logprobs (bool) with top_logprobs, add_generation_prompt,
/// chat_template_kwargs and the shared settings; tools, response_format and other
/// structured outputs are refused as unsupported.
std::variant<generation_request, request_error> parse_chat(const nlohmann::json& body,
                                                           uint32_t max_choices,
                                                           int64_t max_tokens);

/// POST /tokenize, as vLLM serves it: {model, prompt, add_special_tokens (true),
/// return_token_strs} or {model, messages, add_generation_prompt, chat_template_kwargs,
/// add_special_tokens (false: templates write their own)}. The result's `prompts` holds
/// the prompt (chat: rendered later); `echo` carries return_token_strs.
struct tokenize_body {
  generation_request g;
  bool add_special_tokens = true;
  bool token_strs = false;
};
std::variant<tokenize_body, request_error> parse_tokenize(const nlohmann::json& body);

/// POST /detokenize: {model, tokens}.
struct detokenize_body {
  std::string model;
  std::vector<int64_t> tokens;
};
std::variant<detokenize_body, request_error> parse_detokenize(const nlohmann::json& body);

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
