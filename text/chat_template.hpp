#pragma once

#include <memory>
#include <string>

#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

/// Hugging Face chat templates (tokenizer_config.json's `chat_template`) rendered without
/// Python: a Jinja interpreter for the subset real templates use, with transformers'
/// settings (trim_blocks, lstrip_blocks, loop controls, `tojson` as json.dumps). Torch-free.
namespace computron::text {

namespace jinja {
struct program;
}

/// A parsed chat template. Immutable after parse; render is thread-safe.
class chat_template {
 public:
  /// Parses `source` (a Jinja template as tokenizer_config.json's `chat_template` holds
  /// it). A template using any construct this interpreter does not implement is refused
  /// here with ec::invalid_configuration, the message naming the construct and its line
  /// ("chat template line 12: filter 'wordcount' is not supported"), never rendered wrong
  /// later; malformed templates are refused the same way.
  static caf::expected<std::shared_ptr<const chat_template>> parse(const std::string& source);

  /// Renders with `context`, a JSON object whose members become the template's variables
  /// (messages, add_generation_prompt, bos_token, eos_token, tools, ...). Errors:
  /// raise_exception(msg) in the template -> ec::invalid_request with exactly that message;
  /// type errors and undefined values misused -> ec::invalid_request naming the line.
  /// nlohmann::json sorts object keys, which `tojson` then prints sorted: pass ordered_json
  /// (the overload below) where the sender's key order must survive (tool schemas).
  caf::expected<std::string> render(const nlohmann::json& context) const;

  /// As above, keeping every object's key order as given, as Python's dicts do.
  caf::expected<std::string> render(const nlohmann::ordered_json& context) const;

 private:
  explicit chat_template(std::shared_ptr<const jinja::program> program);
  template <class Json>
  caf::expected<std::string> render_json(const Json& context) const;

  std::shared_ptr<const jinja::program> program_;
};

}  // namespace computron::text
