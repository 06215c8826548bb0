#include "text/jinja/text.hpp"

#include <cwctype>

#include <locale.h>

namespace computron::text::jinja {

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    utf8_next(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

std::string map_case(std::string_view s, bool upper) {
  // C.UTF-8 knows the case of every script; without it, ASCII is all we can map.
  static locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t cp = utf8_next(s, i);
    if (cp < 0x80) {
      char c = static_cast<char>(cp);
      out += upper ? (c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c)
                   : (c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c);
    } else if (utf8 && i - start > 1) {
      auto w = static_cast<wint_t>(cp);
      append_utf8(out, static_cast<uint32_t>(upper ? towupper_l(w, utf8) : towlower_l(w, utf8)));
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  return out;
}

}  // namespace

std::string to_upper(std::string_view s) {
  return map_case(s, true);
}
std::string to_lower(std::string_view s) {
  return map_case(s, false);
}

}  // namespace computron::text::jinja
