// text/tokenizer against Hugging Face's tokenizer itself, the Rust `tokenizers` library
// through its Python binding (tests/text/tokenizer_oracle.py in the venv scripts/setup
// makes), over the real tokenizer files of Llama 3.1, Qwen3 and Llama 2 / Mistral. The
// JavaScript port (hf_tokenizer_test.cpp, [tokenizer_oracle]) stays; where the two differ,
// this one is the reference. Hidden ([.]): ctest runs it where the venv exists.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "tests/support/python.hpp"
#include "tests/support/real_tokenizers.hpp"
#include "tests/support/source_tree.hpp"
#include "text/tokenizer.hpp"

using namespace computron;
using namespace computron::text;
using json = nlohmann::json;

namespace {

/// Byte runs that are not UTF-8, through Llama 2's ByteFallback decoder: the Rust library
/// gives one U+FFFD per byte of a run that fails as a whole (a valid character in the same
/// run included), tokenizers.js one per invalid stretch, which is why the JavaScript
/// fixture leaves them out. Leading <0x20> meets the decoder's Strip of one space.
std::vector<std::vector<int64_t>> fallback_runs(const tokenizer& t) {
  auto b = [&](int x) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", x);
    auto id = t.token_id(name);
    REQUIRE(id);
    return *id;
  };
  auto w = [&](const char* s) { return t.encode(s, false); };
  auto join = [](std::initializer_list<std::vector<int64_t>> parts) {
    std::vector<int64_t> out;
    for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  return {{b(0xE4), b(0xB8)},
          join({w("a"), {b(0xE4), b(0xB8)}, w(" b")}),
          {b(0xE4), b(0xB8), b(0xAD), b(0xE4)},
          {b(0xF0), b(0x9F), b(0x98), b(0x80), b(0xFF), b(0x41)},
          {b(0x41), b(0x42)},
          {b(0x20), b(0x20)},
          join({{b(0x20)}, w("x")}),
          join({{b(0xE4)}, w("x"), {b(0xB8), b(0xAD)}})};
}

}  // namespace

// ctest runs it ("tokenizers against the Python tokenizers oracle"), skipped where the venv
// is missing.
TEST_CASE("Hugging Face's Rust tokenizers agree on the corpus, random strings and byte runs",
          "[.][tokenizer_py_oracle][npm]") {
  auto python = test::venv_python();
  INFO("no venv python under " << test::venv_dir() << ": run scripts/setup");
  REQUIRE(!python.empty());
  auto script = test::source_file("tests/text/tokenizer_oracle.py");
  auto fixture_path = test::source_file("tests/text/data/tokenizer_oracle.json");
  REQUIRE(!script.empty());
  REQUIRE(!fixture_path.empty());
  auto fixture = json::parse(std::ifstream{fixture_path});

  // The JavaScript live case's texts, the same seed and pieces: the corpus and random
  // strings of its characters.
  auto [texts, pool, inserts] = test::corpus_and_random_texts(fixture["corpus"]);
  // What the JavaScript corpus leaves out, lest JavaScript's \s and case folding differ
  // from the Rust library's (Oniguruma's): U+FEFF and U+0085 beside spaces, other Unicode
  // white space, and characters whose case folding is not ASCII after an apostrophe
  // ((?i:'s|...) meets long s, Kelvin sign, dotted capital I). Python is the reference.
  std::vector<std::string> unicode{"\xEF\xBB\xBF", "\xC2\x85",     "\xC5\xBF", "\xE2\x84\xAA",
                                   "\xC4\xB0",     "\xE2\x80\xA8", "\x0B",     "\x1C"};
  for (auto* t : {"\xEF\xBB\xBF", "a\xEF\xBB\xBF b", " \xEF\xBB\xBF x", "a\xC2\x85z",
                  "a \xC2\x85 z", "\xC2\x85\n", "I'\xC5\xBF it", "IT'\xE2\x84\xAA", "'\xC4\xB0",
                  "line\xE2\x80\xA8sep", "v\x0B\x0Ctab", "a\x1C\x1D\x1E\x1F z"})
    texts.push_back(t);
  pool.insert(pool.end(), unicode.begin(), unicode.end());
  inserts.insert(inserts.end(),
                 {"'\xC5\xBF", "'\xE2\x84\xAA", "'\xC4\xB0", " \xC2\x85", "\xEF\xBB\xBF ", "\r\n"});
  test::random_texts(texts, pool, inserts, 20260101, 300);

  // Byte ids to decode: the fixture's (which both oracles agree on) and Llama 2's
  // ByteFallback runs.
  json extra_ids = json::object();
  for (auto* name : test::real_tokenizer_names) {
    extra_ids[name] = json::array();
    for (auto& e : fixture["tokenizers"][name]["extra"]) extra_ids[name].push_back(e["ids"]);
  }
  for (auto& ids : fallback_runs(*test::real_tokenizer("llama2")))
    extra_ids["llama2"].push_back(ids);

  auto o = test::ask_tokenizer_oracle({python, script, "live"},
                                      json{{"texts", texts}, {"ids", extra_ids}}, "py-oracle");
  for (auto* name : test::real_tokenizer_names) {
    auto t = test::real_tokenizer(name);
    auto& r = o[name];
    REQUIRE(r["encode"].size() == texts.size());
    test::tally ids, decoded, bytes;
    for (size_t i = 0; i < texts.size(); ++i) {
      auto what = std::string{name} + " " + json(texts[i]).dump();
      auto got = t->encode(texts[i]);
      ids.add(got == r["encode"][i].get<std::vector<int64_t>>(),
              what + " -> " + json(got).dump() + ", Python " + r["encode"][i].dump());
      auto plain = t->encode(texts[i], false);
      ids.add(plain == r["plain"][i].get<std::vector<int64_t>>(),
              what + " (plain) -> " + json(plain).dump() + ", Python " + r["plain"][i].dump());
      // Decoded from Python's ids, so that a decode is judged on its own.
      auto py_ids = r["encode"][i].get<std::vector<int64_t>>();
      auto text = t->decode(py_ids), all = t->decode(py_ids, false);
      decoded.add(text == r["decode"][i].get<std::string>(),
                  what + " decoded " + json(text).dump() + ", Python " + r["decode"][i].dump());
      decoded.add(all == r["decode_all"][i].get<std::string>(),
                  what + " decoded with special tokens " + json(all).dump() + ", Python " +
                      r["decode_all"][i].dump());
    }
    for (auto& e : r["extra"]) {
      auto got = t->decode(e["ids"].get<std::vector<int64_t>>());
      bytes.add(got == e["text"].get<std::string>(),
                std::string{name} + " bytes " + e["ids"].dump() + " -> " + json(got).dump() +
                    ", Python " + e["text"].dump());
    }
    WARN(name << ": ids " << ids.report() << "; texts " << decoded.report() << "; byte runs "
              << bytes.report());
    CHECK(ids.agreed == ids.total);
    CHECK(decoded.agreed == decoded.total);
    CHECK(bytes.agreed == bytes.total);
  }
}
