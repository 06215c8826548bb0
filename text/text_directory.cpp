#include "text/text_directory.hpp"

#include <filesystem>

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::text {

caf::expected<std::shared_ptr<const model_text>> text_directory::open(const std::string& path) {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (auto t = by_path_.find(path); t != by_path_.end()) return t->second;
  }
  // Read without the lock: a large vocabulary takes a moment, and other models' lookups
  // must not wait for it. Two first calls for one path may both read; the first stored wins.
  auto text = std::make_shared<model_text>();
  if (path == "bytes") {
    text->tok = tokenizer::bytes();
  } else {
    auto t = tokenizer::open(path);
    if (!t) return t.error();
    text->tok = *t;
    // A file (tokenizer.json, a GGUF file) takes generation_config.json from beside it.
    std::error_code ec;
    auto folder = std::filesystem::is_regular_file(path, ec)
                      ? std::filesystem::path{path}.parent_path().string()
                      : path;
    auto d = read_generation_defaults(folder.empty() ? std::string{"."} : folder);
    if (!d) return d.error();
    text->defaults = *d;
    if (auto source = text->tok->chat_template()) {
      auto c = chat_template::parse(*source);
      if (c) {
        text->chat = *c;
      } else {
        text->chat_error = c.error();
        log::warn("{}: the chat template cannot be served ({}); completions still are", path,
                  render(c.error()));
      }
    }
  }
  std::lock_guard<std::mutex> guard{mtx_};
  auto [at, fresh] = by_path_.emplace(path, std::move(text));
  (void)fresh;
  return at->second;
}

}  // namespace computron::text
