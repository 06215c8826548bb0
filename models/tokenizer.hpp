#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <caf/expected.hpp>

/// Text to token ids and back: byte-level BPE as GPT-2 and OPT use it. Torch-free.
namespace computron::models {

/// A byte-level BPE vocabulary with its merges and special tokens. Immutable once made,
/// so one instance serves every thread.
class tokenizer {
 public:
  /// Reads a Hugging Face tokenizer from `path`: a folder holding `tokenizer.json`, or
  /// `vocab.json` + `merges.txt` (GPT-2's own names `encoder.json` + `vocab.bpe` too), or
  /// a `tokenizer.json` file itself. Errors name the file and what is wrong with it.
  static caf::expected<std::shared_ptr<const tokenizer>> open(const std::string& path);

  /// From a vocabulary (token string in GPT-2's byte-to-unicode alphabet -> id) and
  /// merges in rank order ("a b" pairs). Special tokens (never produced by BPE, left out
  /// when decoding) are `specials` plus `<s>`, `</s>`, `<pad>`, `<unk>`, `<mask>` and
  /// `<|endoftext|>`; BOS and EOS are `</s>` (OPT's, which also starts every prompt) or
  /// else `<|endoftext|>` (GPT-2's, which does not).
  static caf::expected<std::shared_ptr<const tokenizer>> make(
      std::unordered_map<std::string, int64_t> vocab, const std::vector<std::string>& merges,
      std::set<std::string> specials = {});

  /// The built-in tokenizer of seeded models without files: OPT's four special tokens
  /// (ids 0..3) and the 256 bytes (ids 4..259), no merges.
  static std::shared_ptr<const tokenizer> bytes();

  /// The ids of `text`, with the BOS token first where this vocabulary adds one (OPT's
  /// `</s>`; GPT-2 adds none). Any text encodes (byte-level: nothing is unknown).
  std::vector<int64_t> encode(std::string_view text) const;

  /// The text of `ids`, special tokens left out; bytes that do not form valid UTF-8 become
  /// U+FFFD (as a stream_decoder fed the same ids would give).
  std::string decode(const std::vector<int64_t>& ids) const;

  /// The raw bytes of one token; empty for special tokens and ids outside the vocabulary.
  std::string_view token_bytes(int64_t id) const;

  /// One past the largest id.
  int64_t size() const { return static_cast<int64_t>(bytes_of_.size()); }
  std::optional<int64_t> bos() const { return bos_; }
  std::optional<int64_t> eos() const { return eos_; }
  std::optional<int64_t> pad() const { return pad_; }
  bool adds_bos() const { return add_bos_; }
  bool is_special(int64_t id) const;

 private:
  tokenizer() = default;
  void bpe(const std::string& word, std::vector<int64_t>& out) const;

  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<std::string, int32_t> ranks_;
  std::vector<std::string> bytes_of_;
  std::vector<bool> special_;
  std::optional<int64_t> bos_, eos_, pad_;
  bool add_bos_ = false;
};

/// Turns a stream of ids into text as it grows: a character whose UTF-8 bytes are split
/// across tokens comes out whole, once its last byte arrived. Feeding every id and then
/// calling finish() gives exactly tokenizer::decode of the ids.
class stream_decoder {
 public:
  explicit stream_decoder(std::shared_ptr<const tokenizer> tok) : tok_(std::move(tok)) {}
  /// The text that `id` completes (possibly empty).
  std::string push(int64_t id);
  /// Whatever bytes are left (an unfinished character becomes U+FFFD).
  std::string finish();

 private:
  std::shared_ptr<const tokenizer> tok_;
  std::string pending_;
};

/// Text with stop strings: finds the first stop string in the growing text and says how
/// much of the text is safe to show (not the start of a stop string that may complete).
struct stop_matcher {
  std::vector<std::string> stops;
  /// Where the earliest stop string starts in `text`, if one is there. `grown_from`: the
  /// text's length when it was last searched (no stop string in it then), so that a
  /// growing text is searched only where a new match can start.
  std::optional<size_t> find(std::string_view text, size_t grown_from = 0) const;
  /// How many leading bytes of `text` can be sent now: all but the longest tail that is
  /// a proper prefix of a stop string, cut back to a whole UTF-8 character.
  size_t safe_prefix(std::string_view text) const;
};

}  // namespace computron::models
