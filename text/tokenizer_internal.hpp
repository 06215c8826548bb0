#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/bpe.hpp"
#include "text/tokenizer.hpp"
#include "text/tokenizer_pipeline.hpp"
#include "text/unicode.hpp"

/// What a tokenizer is made of, shared by the files that build it and the ones that run it
/// (internal to text/).
namespace computron::text::detail {

/// A token of tokenizer.json's added_tokens (or one tokenizer_config.json names).
struct added_token {
  std::string content;
  int64_t id = 0;
  bool special = false;
  bool lstrip = false, rstrip = false;  // swallow the whitespace on that side
  bool normalized = false;              // matched in the normalized text, not the raw one
  bool single_word = false;             // matched only between non-word characters
};

/// Finds added tokens in text as tokenizers' AddedVocabulary does: leftmost-longest
/// (aho-corasick), then single_word, lstrip and rstrip applied to each match.
class added_matcher {
 public:
  /// Matches the `patterns` (what to look for) of `tokens` (indices into `all`).
  void build(const std::vector<added_token>& all, const std::vector<size_t>& tokens,
             const std::vector<std::string>& patterns);
  bool empty() const { return nodes_.size() <= 1; }
  /// Cuts `s` into plain stretches and tokens, in order: `f(text, token, offset)` where
  /// `token` is null for plain text and `offset` is where the piece starts in `s`.
  template <class F>
  void split(std::string_view s, F&& f) const;

 private:
  /// The longest pattern starting at `i`: the token's index into all_, or -1.
  int64_t longest_at(std::string_view s, size_t i, size_t& len) const;

  struct node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int64_t token = -1;
  };
  std::vector<node> nodes_{1};
  bool first_byte_[256] = {};
  const std::vector<added_token>* all_ = nullptr;
};

/// Every part of a tokenizer. Built once, then only read.
struct tokenizer_data {
  bpe_model model;
  normalizer_chain normalizer;
  pre_tokenizer_chain pre;
  decoder_chain decoder;
  std::vector<added_token> added;
  std::unordered_map<int64_t, size_t> added_by_id;
  added_matcher raw_matcher;            // added tokens with normalized: false
  added_matcher normalized_matcher;     // the others, in their normalized form
  std::vector<int64_t> prefix, suffix;  // what the post-processor puts around a text
  bool split_special_tokens = false;    // special tokens in the text are not matched
  unicode::utf8_repair repair = unicode::utf8_repair::maximal_subpart;

  int64_t size = 0;
  /// Per id: what it decodes to in the middle of a text, and its flags.
  std::vector<std::string> piece;
  std::vector<uint8_t> flags;
  static constexpr uint8_t known = 1, special = 2, fallback_byte = 4;

  std::optional<int64_t> bos, eos, pad;
  std::vector<int64_t> eos_ids;
  std::optional<std::string> bos_token, eos_token;
  std::vector<std::pair<std::string, std::string>> chat_templates;  // name, template

  /// The token text of `id` (added tokens first, as tokenizers looks it up).
  std::string_view token_text(int64_t id) const;
  /// The id of a token text (added tokens first).
  std::optional<int64_t> id_of(std::string_view token) const;
  /// Fills `piece` and `flags` once the parts above are in place.
  void index_ids(bool legacy_specials);
};

/// A tokenizer as tokenizer.json and tokenizer_config.json would state it, from another
/// source (a GGUF file's metadata): views into strings the caller keeps.
struct tokenizer_parts {
  std::string source;  // named in errors
  /// tokenizer.json without model.vocab and model.merges.
  nlohmann::json rest = nlohmann::json::object();
  std::vector<std::pair<std::string_view, int64_t>> vocab;
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  /// What tokenizer_config.json would say: special tokens by name, whether BOS/EOS go
  /// around a text, the chat templates (name, source).
  std::optional<std::string> bos, eos, pad, unk;
  std::optional<bool> add_bos, add_eos;
  std::vector<std::pair<std::string, std::string>> templates;
  /// generation_config.json's eos_token_id.
  std::vector<int64_t> eos_ids;
};

/// The tokenizer `p` describes, built as tokenizer::open builds one from its files.
caf::expected<std::shared_ptr<const tokenizer>> from_parts(const tokenizer_parts& p);

/// Makes tokenizers from their parts (tokenizer.cpp, tokenizer_files.cpp).
struct tokenizer_builder {
  static std::shared_ptr<const tokenizer> wrap(std::unique_ptr<tokenizer_data> d);
};

/// GPT-2's byte-level pipeline over a vocabulary and "a b" merges (tokenizer::make, and
/// vocab.json + merges.txt): special tokens by name, OPT's `</s>` as BOS and EOS.
caf::expected<std::unique_ptr<tokenizer_data>> make_byte_level(
    std::unordered_map<std::string, int64_t> vocab, const std::vector<std::string>& merges,
    std::set<std::string> specials);

/// Completes `d` once its parts are set: size, added-token matchers, per-id tables,
/// eos_ids. `legacy_specials`: tokens outside GPT-2's alphabet are specials (its files).
void finish(tokenizer_data& d, bool legacy_specials);

template <class F>
void added_matcher::split(std::string_view s, F&& f) const {
  if (empty() || s.empty()) {
    if (!s.empty()) f(s, static_cast<const added_token*>(nullptr), size_t{0});
    return;
  }
  auto space_at = [&](size_t i, size_t& next) {
    next = i;
    return unicode::is_white_space(unicode::next_code_point(s, next));
  };
  size_t start_offset = 0;  // where the next plain stretch begins
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && !first_byte_[static_cast<unsigned char>(s[i])]) ++i;
    if (i >= s.size()) break;
    size_t len = 0;
    int64_t t = longest_at(s, i, len);
    if (t < 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;
    auto& tok = (*all_)[static_cast<size_t>(t)];
    if (tok.single_word) {
      bool word_before = false, word_after = false;
      if (start > 0) {
        size_t b = start - 1;
        while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
        size_t n = b;
        word_before = unicode::is_word_char(unicode::next_code_point(s, n));
      }
      if (stop < s.size()) {
        size_t n = stop;
        word_after = unicode::is_word_char(unicode::next_code_point(s, n));
      }
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      size_t a = start;
      while (a > start_offset) {
        size_t b = a - 1;
        while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
        size_t n = 0;
        if (!space_at(b, n) || n != a) break;
        a = b;
      }
      start = std::max(a, start_offset);
    }
    if (tok.rstrip) {
      size_t n = 0;
      while (stop < s.size() && space_at(stop, n)) stop = n;
      i = std::max(i, stop);
    }
    if (start_offset < start)
      f(s.substr(start_offset, start - start_offset), nullptr, start_offset);
    f(s.substr(start, stop - start), &tok, start);
    start_offset = stop;
  }
  if (start_offset < s.size()) f(s.substr(start_offset), nullptr, start_offset);
}

}  // namespace computron::text::detail
