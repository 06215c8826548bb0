#pragma once

// What a model's files say about text (internal to net/), looked up in serve's
// text::text_directory; and how a text request
// becomes the rows a generation actor sends (chat rendered, prompts encoded, n choices,
// defaults, seed, stop ids, max_tokens). No actors, no sockets.
#include <memory>
#include <string>

#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "net/http/generation.hpp"
#include "net/http/llm_api.hpp"
#include "net/http/replies.hpp"
#include "text/text_directory.hpp"

namespace computron::net {

using text::model_text;

/// The text files of the models a server answers for: a text::text_directory (serve's,
/// filled where models are registered; or the server's own), looked up by model.
class text_models {
 public:
  explicit text_models(std::shared_ptr<text::text_directory> directory)
      : directory_(directory ? std::move(directory) : std::make_shared<text::text_directory>()) {}

  /// The model's text files. Errors: the model has no tokenizer (it takes ids only), or
  /// its files are unreadable (the reader's error, with the model named).
  caf::expected<std::shared_ptr<const model_text>> of(const actors::model_info& i);

  /// The text files a text request of `api` needs. A model without a tokenizer still
  /// serves a completion of token-id prompts: its text files then hold no tokenizer, and
  /// `g` asks for token ids back (return_token_ids). What needs text (a chat, a text
  /// prompt, echo, stop strings, logprobs) is a 400 naming it.
  caf::expected<std::shared_ptr<const model_text>> for_request(const actors::model_info& i,
                                                               text_api api, generation_request& g);

 private:
  std::shared_ptr<text::text_directory> directory_;
};

/// The prompt a chat request's messages render to with the model's template (400 for a
/// model without one, naming it; the template's own raise_exception message as is).
caf::expected<std::string> render_chat(const model_text& text, const generation_request& g,
                                       const std::string& model);

/// Settles `st.g` against its model and fills `st.rows` and `st.stop_ids`: the chat
/// rendered and encoded (no BOS added: templates write their own), text prompts encoded,
/// n choices per prompt, the echo text, generation_config.json's defaults where an OpenAI
/// request left a setting out, a fresh seed where it gave none, chat's max_tokens (the rest
/// of the context, at most `max_tokens_limit`). Errors: invalid_request.
caf::error prepare_rows(gen_state& st, const model_text& text, const actors::model_info& info,
                        int64_t max_tokens_limit);

/// The answers of POST /tokenize and /detokenize (vLLM's) for a model and its text files:
/// the ids and their count (with token_strs where asked), or the text; a 400 for an id
/// outside the vocabulary or a chat the template refuses.
replies::response tokenize_reply(const tokenize_body& req, const actors::model_info& info,
                                 const model_text& text);
replies::response detokenize_reply(const detokenize_body& req, const actors::model_info& info,
                                   const model_text& text);

/// A completion id no restart repeats: `prefix` and 32 random hex digits.
std::string fresh_completion_id(const std::string& prefix);

}  // namespace computron::net
