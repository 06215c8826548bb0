#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/unicode.hpp"

/// UTF-8 text as Python's str sees it: code points, whitespace and case. Chat templates
/// count, slice, strip and upper-case message text, which is any language.
namespace computron::text::jinja {

/// The code points of UTF-8 text, each as its bytes; a stray byte counts as one.
std::vector<std::string_view> utf8_chars(std::string_view s);
/// Decodes one code point at `s[i]`, advancing `i`; a stray byte gives its own value (the
/// tokenizer's UTF-8 walk, shared).
inline uint32_t utf8_next(std::string_view s, size_t& i) {
  return unicode::next_code_point(s, i);
}
using unicode::append_utf8;
/// Python's str.isspace() for one code point.
bool is_python_space(uint32_t cp);
/// Python's upper() of text (C.UTF-8's single-character mappings; ASCII without it).
std::string to_upper(std::string_view s);
/// Python's lower(), likewise.
std::string to_lower(std::string_view s);

}  // namespace computron::text::jinja
