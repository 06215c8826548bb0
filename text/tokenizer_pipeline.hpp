#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "text/unicode.hpp"

/// The text stages of a Hugging Face tokenizer around its model (internal to models/):
/// normalizers, pre-tokenizers and decoders, read from tokenizer.json. Each reproduces the
/// Rust `tokenizers` component of the same name; a component or option that is not
/// reproduced is refused when the file is read, never approximated. Reproduced:
/// - normalizers NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence;
/// - pre-tokenizers Split (every behavior, invert), ByteLevel, Metaspace, Digits, Sequence;
/// - decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence, and none
///   (tokens joined with spaces), in chains a stream can decode exactly (decoder_chain).
namespace computron::text {

/// A regex or a literal string, as tokenizer.json's {"Regex": ...} / {"String": ...}.
struct text_pattern {
  std::shared_ptr<const unicode::regex> re;
  std::string literal;  // the string when `re` came from {"String": ...}
  bool is_literal = false;
};

/// A normalizer chain (Sequence flattened). Applied to each stretch of text between added
/// tokens.
class normalizer_chain {
 public:
  /// Reads tokenizer.json's "normalizer" (null: none). Errors name the component.
  static caf::expected<normalizer_chain> parse(const nlohmann::json& j);
  bool empty() const { return steps_.empty(); }
  /// `in` normalized.
  std::string apply(std::string_view in) const;

 private:
  enum class kind { unicode, lowercase, prepend, replace, strip };
  struct step {
    kind k;
    unicode::unicode_form form = unicode::unicode_form::nfc;
    std::string text;  // prepend: the prefix; replace: the content
    text_pattern pattern;
    bool left = false, right = false;  // strip
  };
  static caf::error add(const nlohmann::json& j, std::vector<step>& out);
  std::vector<step> steps_;
};

/// A pre-tokenizer chain (Sequence flattened): text to words, each word handed on as soon
/// as it is cut.
class pre_tokenizer_chain {
 public:
  /// Reads tokenizer.json's "pre_tokenizer" (null: none).
  static caf::expected<pre_tokenizer_chain> parse(const nlohmann::json& j);
  /// GPT-2's own: byte-level with its regex, no prefix space.
  static pre_tokenizer_chain byte_level_gpt2();
  /// Cuts `piece` into words, calling `word` on each. `at_start`: the piece begins the
  /// original text (Metaspace's "first" scheme prepends only there).
  void apply(std::string_view piece, bool at_start,
             const std::function<void(std::string_view)>& word) const;
  /// Whether a ByteLevel step maps the words into GPT-2's byte alphabet.
  bool byte_level() const;

  /// How a Split treats the pieces its pattern matches.
  enum class behavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

 private:
  enum class kind { split, byte_level, metaspace, digits };
  struct step {
    kind k;
    text_pattern pattern;  // split
    behavior how = behavior::isolated;
    bool invert = false;
    bool add_prefix_space = false, use_regex = true;  // byte_level
    std::string replacement;                          // metaspace
    uint32_t replacement_cp = 0;
    enum class prepend { always, first, never } scheme = prepend::always;
    bool split = true;               // metaspace
    bool individual_digits = false;  // digits
  };
  static caf::error add(const nlohmann::json& j, std::vector<step>& out);
  void run(size_t k, std::string_view piece, bool at_start,
           const std::function<void(std::string_view)>& word) const;
  std::vector<step> steps_;
};

/// One per-token rewrite of a decoder chain (Replace, Strip, Metaspace).
struct decode_rewrite {
  enum class kind { replace, strip, metaspace } k;
  text_pattern pattern;  // replace
  std::string content;   // replace: the new text
  uint32_t strip_cp = 0;
  size_t start = 0, stop = 0;  // strip
  std::string replacement;     // metaspace: the marker
  uint32_t replacement_cp = 0;
  bool drop_first = true;  // metaspace: the first token's markers vanish (scheme not never)

  /// `s` rewritten; `first`: the token is the first of the sequence at this step.
  std::string apply(std::string_view s, bool first) const;
};

/// A decoder chain as the stream decoder runs it: per-token rewrites, ByteFallback at most
/// once among them, then the step that joins the tokens into one text (ByteLevel, Fuse, or
/// the end of the chain), then rewrites of that one text. Chains of other shapes cannot be
/// decoded a token at a time exactly and are refused.
struct decoder_chain {
  /// How the tokens become one text.
  enum class join_kind {
    concat,      // Fuse, or the end of the chain
    byte_level,  // GPT-2's byte alphabet back to bytes, then UTF-8 with U+FFFD
    spaces,      // no decoder at all: tokens joined with spaces
  };
  std::vector<decode_rewrite> before_bytes;  // before ByteFallback (all, without it)
  bool byte_fallback = false;
  std::vector<decode_rewrite> after_bytes;  // after ByteFallback
  join_kind join = join_kind::concat;
  std::vector<decode_rewrite> on_text;  // after the join (Strip, literal Replace, Metaspace)

  /// Reads tokenizer.json's "decoder" (null: tokens joined with spaces).
  static caf::expected<decoder_chain> parse(const nlohmann::json& j);
  /// GPT-2's: byte-level.
  static decoder_chain byte_level_gpt2();
  /// Whether a token's rewrite depends on it being first (Metaspace before the join).
  bool first_sensitive() const;
};

/// Reading tokenizer.json's component objects: errors that name what is wrong.
namespace tokenizer_json {
caf::error refuse(const std::string& why);
/// "<what> type '<type>' is not supported".
caf::error unsupported(const char* what, const nlohmann::json& j);
std::string str_or(const nlohmann::json& j, const char* key, std::string fallback);
bool bool_or(const nlohmann::json& j, const char* key, bool fallback);
/// The one code point `s` holds.
caf::expected<uint32_t> one_char(const std::string& s, const std::string& what);
/// The "pattern" of `j`: {"String": ...} or {"Regex": ...}, compiled.
caf::expected<text_pattern> pattern_of(const nlohmann::json& j, const std::string& what);
/// Metaspace's prepend_scheme (or the older add_prefix_space): always, first or never.
caf::expected<std::string> metaspace_scheme(const nlohmann::json& j, const std::string& what);
/// `s` with every match of `p` replaced by `content` (tokenizers' find_matches rules).
std::string replace_all(const text_pattern& p, std::string_view s, std::string_view content);
}  // namespace tokenizer_json

/// GPT-2's map of the 256 bytes to printable code points, as UTF-8 strings.
const std::array<std::string, 256>& byte_alphabet();
/// The byte a code point of that alphabet stands for; -1 for other code points.
int byte_of_alphabet(uint32_t cp);

/// The ByteFallback value of a token spelled `<0xNN>`; -1 for other tokens.
int byte_fallback_value(std::string_view token);

}  // namespace computron::text
