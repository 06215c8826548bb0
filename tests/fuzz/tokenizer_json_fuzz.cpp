// Fuzz target: a tokenizer.json as a model folder holds it (text/tokenizer_files.cpp, the
// normalizer, pre-tokenizer, model, post-processor and decoder it names), then encoding
// a few fixed texts and decoding the ids, at once and streamed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/memfile.hpp"
#include "text/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static computron::fuzz::memfile file;
  auto path = file.write(data, size);
  if (path.empty()) std::abort();
  auto tok = computron::text::tokenizer::open(path);
  if (!tok) return 0;
  static const std::vector<std::string> texts = {
      "Hello, world! It's 2026.",
      " \xC3\xBCn\xC3\xAF  c\xC3\xB6"
      "d\xC3\xA9\n\n\tx",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82",
      std::string("\xFF\xFE bad\0nul", 10),
      "<s></s><|endoftext|><unk>",
      ""};
  const int64_t vocab = (*tok)->size();
  for (auto& t : texts) {
    for (bool special : {true, false}) {
      auto ids = (*tok)->encode(t, special);
      for (auto id : ids)
        if (id < 0 || id >= vocab) std::abort();  // every id names a token
      for (bool skip : {true, false}) {
        auto whole = (*tok)->decode(ids, skip);
        // A stream gives the same text as decoding the ids at once (tokenizer.hpp).
        computron::text::stream_decoder s{*tok, skip};
        std::string streamed;
        for (auto id : ids) streamed += s.push(id);
        streamed += s.finish();
        if (streamed != whole) std::abort();
      }
    }
  }
  // Ids the vocabulary does not have are left out, never read.
  (void)(*tok)->decode({-1, vocab, vocab + 7, 0}, false);
  return 0;
}
