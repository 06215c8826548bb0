#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>

#include "net/client/llm_metrics.hpp"
#include "net/client/llm_prompts.hpp"
#include "net/client/loadgen.hpp"
#include "net/client/open_loop.hpp"
#include "workload/arrivals.hpp"

/// `computron loadgen`'s LLM mode: each arrival a streamed OpenAI completion
/// (`/v1/completions`) or chat completion (`/v1/chat/completions`), `"stream": true`, whose
/// prompt is token ids of the arrival's length or a text (a dataset's, or made for chat)
/// and whose output is exactly its max_tokens (`ignore_eos`), timed chunk by chunk.
namespace computron::net {

struct llm_options {
  server_address server;
  /// Non-zero: each request's deadline, and it asks to be dropped rather than served late.
  uint32_t deadline_ms = 0;
  /// Seeds the prompts' token ids.
  uint64_t seed = 1;
  llm_api api = llm_api::completions;
  /// Text prompts, one per arrival (make_text_prompts); empty: token-id prompts, which only
  /// the completions route takes.
  std::vector<text_prompt> texts;
  /// Requests in flight at most: a due request waits for one to finish (closed loop).
  size_t max_concurrency = 256;
  std::chrono::milliseconds request_timeout{300000};
  std::function<void(const open_loop_progress&)> on_progress;
  const std::atomic<bool>* cancel = nullptr;
};

struct llm_run {
  std::vector<stream_record> records;
  std::vector<workload::device_traffic> devices;
  std::vector<workload::swap_event> swaps;
  /// Requests shortened to fit their model's context.
  size_t clipped = 0;
};

/// The body of one streamed completion: the prompt as token ids, exactly `max_tokens`
/// out (ignore_eos), usage in the last chunk; with a deadline when `deadline_ms` > 0.
std::string completion_body(const std::string& model, const std::vector<int64_t>& prompt,
                            int64_t max_tokens, uint32_t deadline_ms);

/// The same with a text prompt.
std::string text_completion_body(const std::string& model, const std::string& prompt,
                                 int64_t max_tokens, uint32_t deadline_ms);

/// The body of one streamed chat completion: `content` as the one user message, the rest as
/// completion_body's.
std::string chat_body(const std::string& model, const std::string& content, int64_t max_tokens,
                      uint32_t deadline_ms);

/// What one event of a completions or chat completions stream says.
struct stream_event {
  /// "[DONE]": the stream's last event.
  bool done = false;
  /// A choice carried text: a completion's `text` or a chat chunk's `delta.content` (an
  /// empty one is a choice's role or finish, not a token).
  bool text = false;
  /// From the usage chunk.
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> completion_tokens;
  /// An error event: its message, and its code (e.g. "unavailable").
  std::string error;
  std::string error_code;
};

/// Reads one event's data. Data that is not JSON, or JSON of another shape, is an error
/// event ("bad_event"), so a broken server cannot pass for a fast one.
stream_event parse_stream_event(std::string_view data);

/// Times a chunk that carried text into its request's record (TTFT and ITL come from these
/// times; token counts and errors are settled when the stream ends).
void add_event(stream_record& r, double at_s, const stream_event& e);

/// What a request's stream said beyond its chunk times, gathered as its events come.
struct stream_outcome {
  bool done = false;
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> completion_tokens;
  /// The first error event's message and code.
  std::string error;
  std::string error_code;

  void add(const stream_event& e);
};

/// A record's outcome once its request is over: an answer other than 200 or no answer
/// (error_kind's kinds, with the server's message), a stream that failed after it began
/// ("stream_" + the error's code), one cut before [DONE] ("bad_response"), else a success
/// whose token counts are the usage chunk's (the chunks with text where it gave none).
void settle(stream_record& rec, const stream_outcome& st, const timed_result& r);

/// Runs a schedule against the server over /v1/completions or /v1/chat/completions. Every
/// model of the schedule must be among `models` (unknown_model otherwise) and have a
/// tokenizer (invalid_request otherwise), and chat needs a text per arrival, before
/// anything is sent. Lengths come from the texts, else the arrivals (0: 16 each).
caf::expected<llm_run> run_llm_loadgen(const workload::schedule& s,
                                       const std::vector<served_model>& models,
                                       const llm_options& opts);

/// The records as loadgen's plain requests (latency from the due time), for its timeline.
std::vector<workload::request_record> as_request_records(const std::vector<stream_record>& rs);

}  // namespace computron::net
