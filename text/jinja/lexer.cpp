#include "text/jinja/lexer.hpp"

#include <cstring>

#include "text/jinja/value.hpp"

namespace computron::text::jinja {

namespace {

[[noreturn]] void syntax_error(int line, std::string message) {
  throw template_error{ec::invalid_configuration, std::move(message), line};
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

/// Length of the whitespace character (Python's isspace) at `s[i]`, 0 when there is none.
size_t space_at(const std::string& s, size_t i) {
  size_t j = i;
  return is_python_space(utf8_next(s, j)) ? j - i : 0;
}

void strip_trailing_space(std::string& text) {
  // Walk forward, remembering where the last run of whitespace began.
  size_t end = 0;
  for (size_t i = 0; i < text.size();) {
    size_t n = space_at(text, i);
    if (n == 0) {
      utf8_next(text, i);
      end = i;
    } else {
      i += n;
    }
  }
  text.resize(end);
}

class lexer {
 public:
  explicit lexer(const std::string& source) {
    // Jinja turns \r\n and \r into \n before anything else (text and string literals alike).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] != '\r') {
        src_ += source[i];
      } else {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      }
    }
    // Jinja's default keep_trailing_newline=False: one final newline is not output.
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<token> run() {
    while (pos_ < src_.size()) {
      size_t start = find_tag(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      bool line_start = pos_ == 0 || src_[pos_ - 1] == '\n';
      // Effects of the tag before: `-` strips all leading whitespace, trim_blocks one newline.
      if (strip_next_) {
        size_t k = 0;
        while (k < text.size()) {
          size_t n = space_at(text, k);
          if (n == 0) break;
          if (text[k] == '\n') line_start = true;
          k += n;
        }
        text.erase(0, k);
      } else if (trim_next_ && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
        line_start = true;
      }
      strip_next_ = trim_next_ = false;
      if (start < src_.size()) {
        char kind = src_[start + 1];
        char marker = start + 2 < src_.size() ? src_[start + 2] : '\0';
        if (marker == '-') {
          strip_trailing_space(text);
        } else if (kind != '{' && marker != '+') {
          lstrip_block(text, line_start);
        }
      }
      if (!text.empty()) out_.push_back({tok::text, std::move(text), line_});
      advance_to(start);
      if (start >= src_.size()) break;
      lex_tag();
    }
    out_.push_back({tok::eof, "", line_});
    return std::move(out_);
  }

 private:
  /// lstrip_blocks: spaces and tabs between a line's start and a block or comment tag go.
  static void lstrip_block(std::string& text, bool text_starts_line) {
    size_t k = text.size();
    while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
    if (k == 0 ? text_starts_line : text[k - 1] == '\n') text.resize(k);
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && std::strchr("{%#", src_[i + 1]) && src_[i + 1] != '\0') return i;
    }
    return src_.size();
  }

  void advance_to(size_t to) {
    for (; pos_ < to; ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }

  bool at(const char* s) const { return src_.compare(pos_, std::strlen(s), s) == 0; }

  void lex_tag() {
    char kind = src_[pos_ + 1];
    int tag_line = line_;
    advance_to(pos_ + 2);
    // `-` strips; `+` (blocks only: `{{+1}}` is an expression) keeps the line's indent.
    if (pos_ < src_.size() && (src_[pos_] == '-' || (src_[pos_] == '+' && kind != '{')))
      advance_to(pos_ + 1);
    if (kind == '#') {
      size_t end = src_.find("#}", pos_);
      if (end == std::string::npos) syntax_error(tag_line, "comment '{#' is never closed");
      strip_next_ = end > pos_ && src_[end - 1] == '-';
      trim_next_ = !(end > pos_ && src_[end - 1] == '+');
      advance_to(end + 2);
      return;
    }
    const bool block = kind == '%';
    out_.push_back({block ? tok::block_begin : tok::var_begin, "", tag_line});
    int depth = 0;  // open '{' inside an expression: their '}}' does not end the tag
    while (true) {
      while (pos_ < src_.size() && space_at(src_, pos_)) advance_to(pos_ + space_at(src_, pos_));
      if (pos_ >= src_.size())
        syntax_error(tag_line, std::string{"tag '"} + (block ? "{%" : "{{") + "' is never closed");
      const char* close = block ? "%}" : "}}";
      if ((at("-") || (block && at("+"))) && src_.compare(pos_ + 1, 2, close) == 0 &&
          (block || depth == 0)) {
        strip_next_ = src_[pos_] == '-';
        trim_next_ = block && src_[pos_] != '+';
        advance_to(pos_ + 3);
        break;
      }
      if (at(close) && (block || depth == 0)) {
        trim_next_ = block;
        advance_to(pos_ + 2);
        break;
      }
      char c = src_[pos_];
      if (c == '\'' || c == '"') {
        lex_string();
      } else if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t b = pos_;
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        out_.push_back({tok::name, src_.substr(b, pos_ - b), line_});
      } else {
        static const char* const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                          "/",  "%",  "~",  "|",  ".",  ",",  ":", "(", ")",
                                          "[",  "]",  "{",  "}",  "<",  ">",  "="};
        const char* found = nullptr;
        for (const char* op : ops) {
          if (at(op)) {
            found = op;
            break;
          }
        }
        if (!found) {
          size_t j = pos_;
          utf8_next(src_, j);
          syntax_error(line_, "unexpected character '" + src_.substr(pos_, j - pos_) + "'");
        }
        if (*found == '{') ++depth;
        if (*found == '}' && depth > 0) --depth;
        out_.push_back({tok::op, found, line_});
        pos_ += std::strlen(found);
      }
    }
    out_.push_back({block ? tok::block_end : tok::var_end, "", line_});
  }

  void lex_number() {
    size_t b = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (is_digit(src_[pos_]) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t k = pos_ + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && is_digit(src_[k])) {
        is_float = true;
        pos_ = k;
        digits();
      }
    }
    std::string text;
    for (size_t i = b; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    out_.push_back({is_float ? tok::floating : tok::integer, text, line_});
  }

  /// A string literal with Python's escapes; an unknown escape keeps its backslash.
  void lex_string() {
    char quote = src_[pos_];
    int start_line = line_;
    advance_to(pos_ + 1);
    std::string value;
    auto hex = [&](size_t n) -> uint32_t {
      uint32_t cp = 0;
      for (size_t k = 0; k < n; ++k) {
        char h = pos_ + k < src_.size() ? src_[pos_ + k] : '\0';
        int d = is_digit(h)              ? h - '0'
                : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                         : -1;
        if (d < 0) syntax_error(line_, "malformed \\x, \\u or \\U escape in a string");
        cp = cp * 16 + static_cast<uint32_t>(d);
      }
      pos_ += n;
      return cp;
    };
    while (true) {
      if (pos_ >= src_.size()) syntax_error(start_line, "string literal is never closed");
      char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        value += c;
        advance_to(pos_ + 1);
        continue;
      }
      if (pos_ + 1 >= src_.size()) syntax_error(start_line, "string literal is never closed");
      char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case 'a':
          value += '\a';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case '\n':
          ++line_;
          break;  // a line continuation
        case 'x':
          append_utf8(value, hex(2));
          break;
        case 'u':
          append_utf8(value, hex(4));
          break;
        case 'U': {
          uint32_t cp = hex(8);
          if (cp > 0x10FFFF) syntax_error(line_, "\\U escape beyond U+10FFFF");
          append_utf8(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
                 ++k)
              cp = cp * 8 + static_cast<uint32_t>(src_[pos_++] - '0');
            append_utf8(value, cp);
          } else {
            value += '\\';
            --pos_;  // the character after the backslash is ordinary text
          }
      }
    }
    out_.push_back({tok::string, std::move(value), start_line});
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool strip_next_ = false;
  bool trim_next_ = false;
  std::vector<token> out_;
};

}  // namespace

std::vector<token> tokenize(const std::string& source) {
  return lexer{source}.run();
}

}  // namespace computron::text::jinja
