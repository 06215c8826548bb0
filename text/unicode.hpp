#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

/// Text primitives the tokenizer is built from (and the HTTP server's UTF-8 check of a
/// body): UTF-8 walking and repair, the Unicode character classes and normalization forms of ICU,
/// and regular expressions of PCRE2 with the semantics tokenizer.json's Oniguruma patterns expect.
namespace computron::text::unicode {

/// Appends the UTF-8 form of code point `cp`.
void append_utf8(std::string& out, uint32_t cp);

/// The code point at `i` (advancing `i`). A byte that starts no valid character reads as
/// itself (its value, below 0x100) and advances by one, so any bytes can be walked.
uint32_t next_code_point(std::string_view s, size_t& i);

/// The byte length of the character starting at `i` (1 for an invalid byte).
size_t char_length(std::string_view s, size_t i);

/// Whether `s` is entirely valid UTF-8.
bool is_valid_utf8(std::string_view s);

/// How bytes that are not UTF-8 become U+FFFD: one per byte (the original byte-level
/// decoder), or one per maximal invalid subpart (Unicode's recommendation; Rust's
/// from_utf8_lossy, JavaScript's TextDecoder, Python's "replace").
enum class utf8_repair { per_byte, maximal_subpart };

/// Moves the valid UTF-8 at the front of `pending` into `out`, invalid bytes repaired as
/// `mode` says. An incomplete character at the end stays in `pending` unless `final`.
/// The same bytes give the same text however they were split across calls.
void drain_utf8(std::string& pending, bool final, std::string& out, utf8_repair mode);

/// Unicode White_Space (Rust's char::is_whitespace, the regex crate's \s).
bool is_white_space(uint32_t cp);
/// General category N* (Rust's char::is_numeric).
bool is_numeric(uint32_t cp);
/// The regex crate's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation
/// and the joiners.
bool is_word_char(uint32_t cp);

/// The four Unicode normalization forms.
enum class unicode_form { nfc, nfd, nfkc, nfkd };

/// `in` in normalization form `form` (invalid UTF-8 becomes U+FFFD on the way).
void normalize(std::string_view in, unicode_form form, std::string& out);

/// `in` lower-cased with Unicode's full, context-sensitive mapping (final sigma included),
/// as Rust's str::to_lowercase.
void lowercase(std::string_view in, std::string& out);

/// A compiled PCRE2 pattern in UTF mode with Unicode classes (\s, \w, \d, \p{..}), JIT
/// compiled where PCRE2 has a JIT. Invalid UTF-8 in a subject never matches anything and is
/// otherwise passed over. Immutable; one instance serves every thread.
class regex {
 public:
  /// Compiles `pattern`; when `literal`, the pattern is a plain string. Empty pointer and
  /// `why` set when the pattern does not compile.
  static std::shared_ptr<const regex> compile(std::string_view pattern, bool literal,
                                              std::string& why);
  ~regex();

  /// The first match at or after byte `from`: its bounds in `start`, `end`. False when
  /// there is none. A pattern that exhausts PCRE2's limits on this subject reports no
  /// further match (the rest of the text stays one piece).
  bool find(std::string_view subject, size_t from, size_t& start, size_t& end) const;

  regex(const regex&) = delete;
  regex& operator=(const regex&) = delete;

 private:
  regex() = default;
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
};

}  // namespace computron::text::unicode
