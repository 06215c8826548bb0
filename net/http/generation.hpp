#pragma once

// One text request while it generates (internal to net/): the actor that sends a
// request per prompt with itself as the token sink, turns tokens into text, cuts at stop
// strings and answers, streamed as Server-Sent Events or whole.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/interfaces.hpp"
#include "net/http/http_transport.hpp"
#include "net/http/llm_api.hpp"
#include "net/http/replies.hpp"
#include "text/tokenizer.hpp"

namespace computron::net {

using replies::responder;

/// Which text API a generation answers in.
enum class text_api { openai, chat, triton };

/// One choice of a text request while it generates (a prompt, or one of its n samples).
struct gen_row {
  /// Its prompt (choice i samples prompt i / n).
  std::vector<int64_t> prompt;
  std::unique_ptr<text::stream_decoder> decoder;
  /// echo: the prompt's text, which comes before the completion's (in the first chunk).
  std::string echo;
  bool echo_sent = false;
  /// The generated text, cut before a stop string once one appeared.
  std::string text;
  /// Bytes of `text` already streamed.
  size_t emitted = 0;
  size_t tokens = 0;
  size_t completion_tokens = 0;
  bool stopped = false;
  bool done = false;
  std::string finish;
  /// The frontend's request id, known from the first token.
  std::optional<uint64_t> id;
  /// Generated ids and their log-probabilities (when the request asked), and how many of
  /// them a streamed chunk carried already.
  std::vector<int64_t> ids;
  /// One per id, then the stop id's (`stop_id`) when one ended the row.
  std::vector<actors::token_logprobs> logprobs;
  /// The stop id that ended the row; -1: none.
  int64_t stop_id = -1;
  size_t logprobs_sent = 0;
  /// echo with logprobs: the prompt's, from its second token on.
  std::vector<actors::token_logprobs> prompt_logprobs;
  /// Generated ids a streamed chunk carried already (return_token_ids).
  size_t ids_sent = 0;
  /// Whether the chat stream's first chunk (the role) went out.
  bool role_sent = false;
};

struct gen_state {
  generation_request g;
  text_api api = text_api::openai;
  /// Null for a model without a tokenizer: its rows answer token ids and no text.
  std::shared_ptr<const text::tokenizer> tok;
  /// The model's vocabulary: the tokenizer's EOS stops generation only inside it.
  int64_t vocab = 0;
  /// What ends a row besides max_tokens: the model's EOS ids (unless ignore_eos) and the
  /// request's stop_token_ids.
  std::vector<int64_t> stop_ids;
  text::stop_matcher stops;
  std::vector<gen_row> rows;
  size_t left = 0;
  std::string completion_id;
  int64_t created = 0;
  responder reply;
  sse_opener open_sse;
  std::shared_ptr<sse_channel> sse;
  /// Takes cancels of rows cut at a stop string.
  actors::frontend_actor frontend;
  bool failed = false;
};

/// Makes an actor that serves one request exit; the frontend then cancels its requests.
std::function<void()> exit_on_gone(caf::actor a);

/// The actor behind one text request: sends one infer request per prompt with itself as
/// the token sink, turns tokens into text as they come, cuts at stop strings (and
/// cancels the row there, so no step is spent past it), streams or answers at the end.
/// When the client goes away the session makes it exit, and the frontend, which watches
/// its requesters, cancels every row still queued or running.
caf::behavior generation(caf::event_based_actor* self, std::shared_ptr<gen_state> sp,
                         actors::frontend_actor fe, caf::timespan timeout);

}  // namespace computron::net
