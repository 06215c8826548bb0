#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <caf/expected.hpp>

/// The BPE model of Hugging Face `tokenizers` (internal to models/): one pre-tokenized word
/// to ids, merges applied lowest rank first, leftmost first among equals, exactly as
/// tokenizers' Word::merge_all does.
namespace computron::text {

/// Options of tokenizer.json's "model" that change what BPE produces.
struct bpe_options {
  /// A character missing from the vocabulary becomes the `<0xNN>` tokens of its bytes.
  bool byte_fallback = false;
  /// Consecutive unknown characters become one unknown token.
  bool fuse_unk = false;
  /// A word that is itself in the vocabulary is one token, merges or not.
  bool ignore_merges = false;
  /// The unknown token; without one, a character that cannot be encoded is dropped (as
  /// `tokenizers` does).
  std::optional<std::string> unk_token;
};

/// Token text -> id, open addressing over the model's arena of token bytes: built once,
/// looked up without allocating.
class token_table {
 public:
  void build(const std::string* arena, const std::vector<std::pair<uint32_t, uint32_t>>& spans,
             const std::vector<int32_t>& ids);
  /// The id of `token`, or -1.
  int32_t find(std::string_view token) const;

 private:
  struct slot {
    uint32_t off = 0, len = 0;
    int32_t id = -1;  // -1: empty
    uint32_t hash = 0;
  };
  const std::string* arena_ = nullptr;
  std::vector<slot> slots_;
  size_t mask_ = 0;
};

/// Pair of ids -> (rank, merged id), open addressing.
class merge_table {
 public:
  void reserve(size_t n);
  /// Sets the rule for (a, b); a pair given twice keeps the last.
  void set(int32_t a, int32_t b, int32_t rank, int32_t merged);
  /// The rule for (a, b): rank and merged id, or nullptr.
  const std::pair<int32_t, int32_t>* find(int32_t a, int32_t b) const;

 private:
  struct slot {
    uint64_t key = ~uint64_t{0};  // empty
    std::pair<int32_t, int32_t> rule;
  };
  std::vector<slot> slots_;
  size_t mask_ = 0, used_ = 0;
};

/// A vocabulary and its merges. Immutable once made, so one instance serves every thread;
/// results are cached per word in a bounded per-thread cache.
class bpe_model {
 public:
  /// From token -> id and merges in rank order. Errors name the merge (1-based) whose
  /// parts or result are not in the vocabulary, and an unknown token that is not in it.
  static caf::expected<bpe_model> make(
      const std::vector<std::pair<std::string_view, int64_t>>& vocab,
      const std::vector<std::pair<std::string_view, std::string_view>>& merges,
      bpe_options options);

  /// Appends the ids of `word` (a pre-token in the vocabulary's alphabet) to `out`.
  void encode_word(std::string_view word, std::vector<int64_t>& out) const;

  /// The id of a token of the vocabulary.
  std::optional<int64_t> id_of(std::string_view token) const;

  /// The token of an id; empty when no token has it.
  std::string_view token_of(int64_t id) const;

  /// One past the largest id of the vocabulary.
  int64_t size() const { return static_cast<int64_t>(token_at_.size()); }

  const bpe_options& options() const { return options_; }

 private:
  void merge(std::string_view word, std::vector<int32_t>& ids) const;
  void merge_cached(std::string_view word, std::vector<int64_t>& out) const;

  uint64_t uid_ = 0;  // names this model's per-thread cache
  /// Options from the start (assigned later, gcc 12 under -fsanitize=thread warns that the
  /// moved optional<string> may be uninitialized: a false positive that -Werror fails on).
  explicit bpe_model(bpe_options options) : options_(std::move(options)) {}

 public:
  bpe_model() = default;

 private:
  bpe_options options_;
  std::shared_ptr<const std::string> arena_;             // every token's bytes; views point into it
  std::vector<std::pair<uint32_t, uint32_t>> token_at_;  // id -> offset, length in arena_
  token_table ids_;
  merge_table merges_;
  int32_t ascii_[128];     // single-byte tokens
  int32_t byte_ids_[256];  // <0xNN> tokens (-1: none)
  int32_t unk_ = -1;
  /// Code points no token holds right after a different character (SentencePiece's "▁"):
  /// no merge joins across such a place, so a long word is encoded (and cached) one stretch
  /// at a time, cut there, with the same result. Empty when there are none.
  std::vector<bool> boundary_;
};

}  // namespace computron::text
