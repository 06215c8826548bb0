#pragma once

// What a model's files say about text (internal to net/): its tokenizer, chat template and
// generation_config.json defaults, read once per tokenizer path; and how a text request
// becomes the rows a generation actor sends (chat rendered, prompts encoded, n choices,
// defaults, seed, stop ids, max_tokens). No actors, no sockets.
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "models/chat_template.hpp"
#include "models/generation_config.hpp"
#include "models/tokenizer.hpp"
#include "net/generation.hpp"

namespace computron::net {

struct model_text {
  std::shared_ptr<const models::tokenizer> tok;
  /// Null where the files hold none, or where it could not be parsed (`chat_error` says
  /// why: an unsupported construct, with its line).
  std::shared_ptr<const models::chat_template> chat;
  caf::error chat_error;
  models::generation_defaults defaults;
};

/// model_text by tokenizer path, read once (a large vocabulary takes a moment to parse).
/// Thread-safe.
class text_models {
 public:
  /// The model's text files. Errors: the model has no tokenizer (it takes ids only), or
  /// its files are unreadable (the reader's error, with the model named).
  caf::expected<std::shared_ptr<const model_text>> of(const actors::model_info& i);

 private:
  std::mutex mtx_;
  std::map<std::string, std::shared_ptr<const model_text>> by_path_;
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

/// A completion id no restart repeats: `prefix` and 32 random hex digits.
std::string fresh_completion_id(const std::string& prefix);

}  // namespace computron::net
