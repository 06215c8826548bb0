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

#include <caf/expected.hpp>

/// Text to token ids and back, as Hugging Face `tokenizers` does it for the files today's
/// models ship (tokenizer.json, tokenizer_config.json, generation_config.json), and GPT-2's
/// vocab.json + merges.txt. Torch-free.
namespace computron::text {

namespace detail {
struct tokenizer_data;
struct tokenizer_builder;

/// Where a stream_decoder stands in the decoder chain: bytes and text held until a later
/// token settles them. Plain data, so that a decoder is cheap to make and to move.
struct decode_state {
  bool seen_token = false;        // a token entered the chain (Metaspace treats the first apart)
  bool seen_piece = false;        // a piece left ByteFallback (the same, for the steps after it)
  bool seen_text = false;         // text reached the join (no decoder: spaces between tokens)
  std::string run;                // ByteFallback bytes whose run has not ended
  std::string pending;            // bytes waiting for the rest of a UTF-8 character
  std::vector<std::string> held;  // per rewrite after the join: text a later token may change
  std::vector<size_t> counted;    // per Strip after the join: leading characters seen
};
}  // namespace detail

/// A tokenizer as a GGUF file's metadata carries it (tokenizer.ggml.*).
struct vocabulary {
  /// The file, for errors.
  std::string source;
  /// "gpt2": byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM); "llama": SentencePiece BPE
  /// with byte fallback (Llama 2, Mistral).
  std::string model;
  /// tokenizer.ggml.pre, the pre-tokenizer llama.cpp's converter recognised (empty when the
  /// file names none). "qwen2" (Qwen2, Qwen2.5, Qwen3) selects Qwen's; every other keeps
  /// GPT-2's, as transformers' GGUF converters do for the other architectures.
  std::string pre;
  std::vector<std::string> tokens;
  /// Per token: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte (empty:
  /// all normal).
  std::vector<int32_t> token_types;
  /// "a b" pairs in rank order (empty: a SentencePiece vocabulary builds them from
  /// `scores`, merges_from_scores).
  std::vector<std::string> merges;
  /// tokenizer.ggml.scores: per token, SentencePiece's score (higher merges first).
  std::vector<float> scores;
  std::optional<int64_t> bos, eos, pad, unk;
  std::optional<bool> add_bos, add_eos;
  std::optional<std::string> chat_template;
};

/// The merges of a SentencePiece BPE vocabulary that has scores and no merges (llama.cpp
/// writes Llama 2's, Mistral's and TinyLlama's files so), in rank order, as transformers'
/// GGUF loader derives them (GGUFTokenizerSkeleton): every split of a piece into two
/// pieces of the vocabulary is a merge; merges go by the merged piece's score, highest
/// first, then by the piece's place in the vocabulary, then by the parts' scores (left,
/// then right), highest first, then by where the split falls. Pieces split at UTF-8
/// character boundaries. Views into `v.tokens`; none unless `v.scores` holds one score
/// per token.
std::vector<std::pair<std::string_view, std::string_view>> merges_from_scores(const vocabulary& v);

/// The tokenizer a GGUF file's metadata holds (tokenizer.ggml.*, tokenizer.chat_template).
/// Errors name the file and the key.
caf::expected<vocabulary> read_gguf_vocabulary(const std::string& path);

/// A tokenizer: normalizer, pre-tokenizer, BPE model, post-processor and decoder, each as
/// its file says. Immutable once made, so one instance serves every thread.
class tokenizer {
 public:
  /// Reads a tokenizer from `path`: a folder holding `tokenizer.json` (with
  /// `tokenizer_config.json` and `generation_config.json` beside it when present), or
  /// `vocab.json` + `merges.txt` (GPT-2's own names `encoder.json` + `vocab.bpe` too), a
  /// `tokenizer.json` file itself, or a GGUF file (its metadata's vocabulary). A component the file
  /// names that is not implemented is refused, naming it and the file; so is malformed JSON.
  static caf::expected<std::shared_ptr<const tokenizer>> open(const std::string& path);

  /// From a vocabulary (token string in GPT-2's byte-to-unicode alphabet -> id) and
  /// merges in rank order ("a b" pairs), with GPT-2's byte-level pipeline. Special tokens
  /// (never produced by BPE, left out when decoding) are `specials` plus `<s>`, `</s>`,
  /// `<pad>`, `<unk>`, `<mask>` and `<|endoftext|>`; BOS and EOS are `</s>` (OPT's, which
  /// also starts every prompt) or else `<|endoftext|>` (GPT-2's, which does not).
  static caf::expected<std::shared_ptr<const tokenizer>> make(
      std::unordered_map<std::string, int64_t> vocab, const std::vector<std::string>& merges,
      std::set<std::string> specials = {});

  /// The built-in tokenizer of seeded models without files: OPT's four special tokens
  /// (ids 0..3) and the 256 bytes (ids 4..259), no merges.
  static std::shared_ptr<const tokenizer> bytes();

  /// From a vocabulary as a GGUF file's metadata states it (tokenizer_vocabulary.cpp),
  /// with the pipeline its model names, as transformers builds it from the same file.
  /// A llama vocabulary without merges takes merges_from_scores. Errors name the source:
  /// another model than gpt2 or llama, ids out of range, no merges (and, for llama, no
  /// scores either).
  static caf::expected<std::shared_ptr<const tokenizer>> from_vocabulary(const vocabulary& v);

  /// The ids of `text`. Added and special tokens written in the text are matched as
  /// tokens (Hugging Face's default). `add_special_tokens`: the post-processor's tokens
  /// (BOS where the files add one) go around the text.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;

  /// The text of `ids` through the decoder the files name; special tokens left out unless
  /// `skip_special_tokens` is false; ids outside the vocabulary left out. Bytes that do not
  /// form valid UTF-8 become U+FFFD (as a stream_decoder fed the same ids would give). As
  /// the `tokenizers` library decodes: transformers' clean_up_tokenization_spaces (a Python
  /// step after it, " ." to ".") is not applied.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const;

  /// The bytes one token contributes when decoded in the middle of a text; empty for
  /// special tokens and ids outside the vocabulary.
  std::string_view token_bytes(int64_t id) const;

  /// One past the largest id.
  int64_t size() const;
  /// The beginning-of-sequence token (tokenizer_config.json's bos_token).
  std::optional<int64_t> bos() const;
  /// The primary end-of-sequence token (tokenizer_config.json's eos_token, else the first
  /// of generation_config.json's eos_token_id).
  std::optional<int64_t> eos() const;
  /// Every id generation stops at: eos() first, then generation_config.json's others
  /// (Llama 3 instruct models also stop at <|eot_id|>).
  std::vector<int64_t> eos_ids() const;
  /// The padding token (tokenizer_config.json's pad_token).
  std::optional<int64_t> pad() const;
  /// Whether encode() starts with bos() (the post-processor, or tokenizer_config.json's
  /// add_bos_token, says so).
  bool adds_bos() const;
  /// Whether `id` is a special token (left out when decoding by default).
  bool is_special(int64_t id) const;
  /// The id of a token given as written in the vocabulary (added tokens included).
  std::optional<int64_t> token_id(std::string_view token) const;

  /// tokenizer_config.json's bos_token as text (chat templates use it).
  const std::optional<std::string>& bos_token() const;
  /// tokenizer_config.json's eos_token as text.
  const std::optional<std::string>& eos_token() const;
  /// The chat template of that name: tokenizer_config.json's chat_template (a string is
  /// "default"; a list of {name, template} gives each its name), else chat_template.jinja.
  std::optional<std::string> chat_template(std::string_view name = "default") const;
  /// The names chat_template() knows.
  std::vector<std::string> chat_template_names() const;

  ~tokenizer();
  /// One instance is shared (shared_ptr), never copied.
  tokenizer(const tokenizer&) = delete;
  tokenizer& operator=(const tokenizer&) = delete;

 private:
  friend class stream_decoder;
  friend struct detail::tokenizer_builder;
  tokenizer();
  /// Feeds one id through the decoder chain, appending the text it settles to `out`.
  void decode_step(detail::decode_state& st, int64_t id, bool skip_special, std::string& out) const;
  /// Appends what the chain still holds (an unfinished character becomes U+FFFD).
  void decode_finish(detail::decode_state& st, std::string& out) const;

  std::unique_ptr<detail::tokenizer_data> d_;
};

/// Turns a stream of ids into text as it grows: a character whose UTF-8 bytes are split
/// across tokens comes out whole, once its last byte arrived, and text a later token may
/// still change (a leading space a decoder strips, a byte-fallback run) is held until it
/// is settled. Feeding every id and then calling finish() gives exactly tokenizer::decode
/// of the ids.
class stream_decoder {
 public:
  /// A decoder of `tok`'s ids; special tokens left out unless `skip_special_tokens` is false.
  explicit stream_decoder(std::shared_ptr<const tokenizer> tok, bool skip_special_tokens = true)
      : tok_(std::move(tok)), skip_special_(skip_special_tokens) {}
  /// The text that `id` completes (possibly empty).
  std::string push(int64_t id);
  /// Whatever is held (an unfinished character becomes U+FFFD).
  std::string finish();

 private:
  std::shared_ptr<const tokenizer> tok_;
  bool skip_special_;
  detail::decode_state state_;
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

}  // namespace computron::text
