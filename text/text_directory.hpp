#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <caf/expected.hpp>

#include "text/chat_template.hpp"
#include "text/generation_config.hpp"
#include "text/tokenizer.hpp"

/// What a model's files say about text, read once per tokenizer path: the tokenizer, the
/// chat template and generation_config.json's defaults. Serve fills the directory where
/// models are registered (at start and when the repository reads a folder), off CAF's
/// scheduler threads, and hands it to the HTTP server, which then only looks entries up.
/// Torch-free.
namespace computron::text {

struct model_text {
  std::shared_ptr<const tokenizer> tok;
  /// Null where the files hold none, or where it could not be parsed (`chat_error` says
  /// why: an unsupported construct, with its line).
  std::shared_ptr<const chat_template> chat;
  caf::error chat_error;
  generation_defaults defaults;
};

/// model_text by tokenizer path. Thread-safe; entries are immutable once made.
class text_directory {
 public:
  /// The text files at `path` (a tokenizer folder or file, or "bytes"), read on the first
  /// call for that path. Errors: unreadable or malformed files (the reader's error). A
  /// chat template that cannot be parsed is not an error here (completions still work):
  /// it is logged once, and chat requests get its message.
  caf::expected<std::shared_ptr<const model_text>> open(const std::string& path);

 private:
  std::mutex mtx_;
  std::map<std::string, std::shared_ptr<const model_text>> by_path_;
};

}  // namespace computron::text
