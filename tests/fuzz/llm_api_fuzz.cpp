// Fuzz target: the text and tensor API bodies (net/http/llm_api.cpp). The first byte picks
// the parser (KServe infer, OpenAI completions, Triton generate, generate_stream, OpenAI
// chat, tokenize, detokenize); the rest is the body as the server receives it. Any exception or
// sanitizer report is a bug: the server turns every body into a reply or a 400, never a throw.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "net/http/llm_api.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  auto body = nlohmann::json::parse(data + 1, data + size, nullptr, false);
  if (body.is_discarded()) return 0;
  // The server's defaults: 64 rows per batch, max_tokens up to 1024.
  constexpr uint32_t max_rows = 64;
  constexpr int64_t max_tokens = 1024;
  switch (data[0] % 8) {
    case 0:
      (void)computron::net::parse_infer_body(body, max_rows, max_tokens);
      break;
    case 1:
      (void)computron::net::parse_completion(body, max_rows, max_tokens);
      break;
    case 2:
    case 3:
      (void)computron::net::parse_generate(body, "m", data[0] % 8 == 3, max_tokens);
      break;
    case 5:
      (void)computron::net::parse_tokenize(body);
      break;
    case 6:
      (void)computron::net::parse_detokenize(body);
      break;
    default:
      (void)computron::net::parse_chat(body, max_rows, max_tokens);
      break;
  }
  return 0;
}
