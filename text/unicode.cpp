#include "text/unicode.hpp"

#include <algorithm>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

namespace computron::text::unicode {

namespace {

const char replacement_char[] = "\xEF\xBF\xBD";

/// The byte length a lead byte announces (0: not a lead byte), and whether `b` may follow
/// lead byte `c` as its second byte (ruling out overlong forms, surrogates and code points
/// past U+10FFFF).
size_t lead_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if ((c >> 4) == 0xE) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

bool second_ok(unsigned char c, unsigned char b) {
  if ((b & 0xC0) != 0x80) return false;
  if (c == 0xE0) return b >= 0xA0;
  if (c == 0xED) return b < 0xA0;
  if (c == 0xF0) return b >= 0x90;
  if (c == 0xF4) return b < 0x90;
  return true;
}

/// How many bytes from `i` form a valid prefix of the character `s[i]` starts (at most
/// its length), and that length.
size_t valid_prefix(std::string_view s, size_t i, size_t& len) {
  auto c = static_cast<unsigned char>(s[i]);
  len = lead_length(c);
  if (len <= 1) return len;
  size_t have = 1;
  while (have < len && i + have < s.size()) {
    auto b = static_cast<unsigned char>(s[i + have]);
    if (have == 1 ? !second_ok(c, b) : (b & 0xC0) != 0x80) break;
    ++have;
  }
  return have;
}

/// Per-thread scratch for ICU's UTF-16 calls: no allocation once warm.
struct icu_scratch {
  std::vector<UChar> a, b;
};
icu_scratch& scratch() {
  thread_local icu_scratch s;
  return s;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

/// `in` as UTF-16 in `dst` (invalid bytes become U+FFFD).
void to_utf16(std::string_view in, std::vector<UChar>& dst) {
  dst.resize(in.size() + 1);
  for (;;) {
    UErrorCode err = U_ZERO_ERROR;
    int32_t len = 0;
    u_strFromUTF8WithSub(dst.data(), static_cast<int32_t>(dst.size()), &len, in.data(),
                         static_cast<int32_t>(in.size()), 0xFFFD, nullptr, &err);
    if (err == U_BUFFER_OVERFLOW_ERROR) {
      dst.resize(static_cast<size_t>(len) + 1);
      continue;
    }
    dst.resize(U_SUCCESS(err) ? static_cast<size_t>(len) : 0);
    return;
  }
}

void append_utf16(const UChar* s, size_t n, std::string& out) {
  for (size_t i = 0; i < n;) {
    UChar32 c;
    U16_NEXT(s, i, n, c);
    append_utf8(out, static_cast<uint32_t>(c));
  }
}

const UNormalizer2* instance(unicode_form form) {
  UErrorCode err = U_ZERO_ERROR;
  switch (form) {
    case unicode_form::nfc:
      return unorm2_getNFCInstance(&err);
    case unicode_form::nfd:
      return unorm2_getNFDInstance(&err);
    case unicode_form::nfkc:
      return unorm2_getNFKCInstance(&err);
    case unicode_form::nfkd:
      return unorm2_getNFKDInstance(&err);
  }
  return nullptr;
}

/// PCRE2's per-match state: match data for one pair of offsets (all a split needs) and a
/// JIT stack larger than the default 32 KiB, one of each per thread.
struct pcre2_thread_state {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  pcre2_thread_state() {
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~pcre2_thread_state() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t char_length(std::string_view s, size_t i) {
  size_t len = 0;
  size_t have = valid_prefix(s, i, len);
  return len > 1 && have == len ? len : 1;
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t len = char_length(s, i);
  if (len == 1) {
    ++i;
    return c;
  }
  uint32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    if (valid_prefix(s, i, len) != len || len == 0) return false;
    i += len;
  }
  return true;
}

void drain_utf8(std::string& pending, bool final, std::string& out, utf8_repair mode) {
  size_t i = 0;
  const size_t n = pending.size();
  while (i < n) {
    if (static_cast<unsigned char>(pending[i]) < 0x80) {
      out += pending[i++];
      continue;
    }
    size_t len = 0;
    size_t have = valid_prefix(pending, i, len);
    if (len > 1 && have == len) {
      out.append(pending, i, len);
      i += len;
      continue;
    }
    if (len > 1 && i + have == n && !final) break;  // may complete with the next token
    out += replacement_char;
    i += mode == utf8_repair::maximal_subpart && len > 1 ? have : 1;
  }
  pending.erase(0, i);
}

bool is_white_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return u_isUWhiteSpace(static_cast<UChar32>(cp)) != 0;
}

bool is_numeric(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0;
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
           cp == '_';
  auto c = static_cast<UChar32>(cp);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

void normalize(std::string_view in, unicode_form form, std::string& out) {
  if (is_ascii(in)) {  // ASCII is stable under every form
    out.append(in);
    return;
  }
  auto* norm = instance(form);
  auto& s = scratch();
  to_utf16(in, s.a);
  UErrorCode err = U_ZERO_ERROR;
  auto n = static_cast<int32_t>(s.a.size());
  if (norm && is_valid_utf8(in) && unorm2_quickCheck(norm, s.a.data(), n, &err) == UNORM_YES &&
      U_SUCCESS(err)) {
    out.append(in);
    return;
  }
  s.b.resize(s.a.size() * 3 + 16);
  err = U_ZERO_ERROR;
  int32_t len = norm ? unorm2_normalize(norm, s.a.data(), n, s.b.data(),
                                        static_cast<int32_t>(s.b.size()), &err)
                     : 0;
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    s.b.resize(static_cast<size_t>(len) + 1);
    err = U_ZERO_ERROR;
    len = unorm2_normalize(norm, s.a.data(), n, s.b.data(), static_cast<int32_t>(s.b.size()), &err);
  }
  if (!norm || U_FAILURE(err)) {  // ICU without its data: leave the text as it is
    append_utf16(s.a.data(), s.a.size(), out);
    return;
  }
  append_utf16(s.b.data(), static_cast<size_t>(len), out);
}

void lowercase(std::string_view in, std::string& out) {
  if (is_ascii(in)) {
    for (char c : in) out += c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
    return;
  }
  auto& s = scratch();
  to_utf16(in, s.a);
  auto n = static_cast<int32_t>(s.a.size());
  s.b.resize(s.a.size() + 16);
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = u_strToLower(s.b.data(), static_cast<int32_t>(s.b.size()), s.a.data(), n, "", &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    s.b.resize(static_cast<size_t>(len) + 1);
    err = U_ZERO_ERROR;
    len = u_strToLower(s.b.data(), static_cast<int32_t>(s.b.size()), s.a.data(), n, "", &err);
  }
  if (U_FAILURE(err)) {
    append_utf16(s.a.data(), s.a.size(), out);
    return;
  }
  append_utf16(s.b.data(), static_cast<size_t>(len), out);
}

std::shared_ptr<const regex> regex::compile(std::string_view pattern, bool literal,
                                            std::string& why) {
  int code = 0;
  PCRE2_SIZE at = 0;
  // PCRE2_LITERAL takes no character-class options (a literal has no classes).
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;
  auto* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                          &code, &at, nullptr);
  if (!c) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(code, buffer, sizeof buffer);
    why = std::string(reinterpret_cast<const char*>(buffer)) + " at offset " + std::to_string(at);
    return nullptr;
  }
  std::shared_ptr<regex> r{new regex()};
  r->code_ = c;
  r->jit_ = pcre2_jit_compile(c, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

regex::~regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool regex::find(std::string_view subject, size_t from, size_t& start, size_t& end) const {
  thread_local pcre2_thread_state state;
  if (!state.data || from > subject.size()) return false;
  auto* code = static_cast<pcre2_code*>(code_);
  auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = jit_ ? pcre2_jit_match(code, s, subject.size(), from, 0, state.data, state.context)
                : pcre2_match(code, s, subject.size(), from, 0, state.data, state.context);
  if (rc < 0) return false;  // no match, or a resource limit (see the header)
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
  start = ov[0];
  end = ov[1];
  return end >= start && end <= subject.size();
}

}  // namespace computron::text::unicode
