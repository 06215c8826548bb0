// Fuzz target: a chat template as a model folder's tokenizer_config.json holds it
// (text/chat_template.cpp and text/jinja/), parsed and rendered with fuzzed messages.
// Bytes 0-1 give the template's length (big-endian); of the rest, byte 0 holds flags
// (bit 0: add_generation_prompt, bit 1: a tools list, bit 2: contents as lists of text
// parts) and the remainder, split at NUL bytes, gives up to 8 messages' contents, whose
// roles go system, user, assistant, user, assistant, ...
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "text/chat_template.hpp"

namespace {

using json = nlohmann::json;

/// Bytes as a JSON string: invalid UTF-8 would make nlohmann's dump throw, and a client's
/// JSON body never holds it (the HTTP layer refuses it first).
std::string as_text(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += c < 0x80 ? static_cast<char>(c) : '?';
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  size_t n = (static_cast<size_t>(data[0]) << 8) | data[1];
  if (n > size - 2) n = size - 2;
  std::string source(reinterpret_cast<const char*>(data + 2), n);
  auto tmpl = computron::text::chat_template::parse(source);
  if (!tmpl) return 0;
  const uint8_t* rest = data + 2 + n;
  size_t left = size - 2 - n;
  uint8_t flags = left > 0 ? rest[0] : 0;
  std::string body =
      left > 1 ? std::string(reinterpret_cast<const char*>(rest + 1), left - 1) : std::string{};
  json messages = json::array();
  static const char* roles[] = {"system",    "user", "assistant", "user",
                                "assistant", "user", "assistant", "user"};
  size_t start = 0;
  for (size_t k = 0; k < 8 && start <= body.size(); ++k) {
    auto end = body.find('\0', start);
    if (end == std::string::npos) end = body.size();
    auto content = as_text(body.substr(start, end - start));
    json m{{"role", roles[k]}};
    if (flags & 4)
      m["content"] = json::array({{{"type", "text"}, {"text", content}}});
    else
      m["content"] = content;
    messages.push_back(std::move(m));
    start = end + 1;
  }
  json ctx{{"messages", messages},
           {"add_generation_prompt", (flags & 1) != 0},
           {"bos_token", "<s>"},
           {"eos_token", "</s>"}};
  if (flags & 2) {
    json city{{"type", "string"}};
    json parameters{{"type", "object"}, {"properties", {{"city", city}}}};
    json function{
        {"name", "get_weather"}, {"description", "the weather"}, {"parameters", parameters}};
    ctx["tools"] = json::array({json{{"type", "function"}, {"function", function}}});
  }
  auto out = (*tmpl)->render(ctx);
  // Rendering twice gives the same text: a template is immutable and render pure.
  auto again = (*tmpl)->render(ctx);
  if (static_cast<bool>(out) != static_cast<bool>(again)) std::abort();
  if (out && *out != *again) std::abort();
  return 0;
}
