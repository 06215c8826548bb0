#pragma once

#include <cstdint>
#include <string>
#include <vector>

/// Splits a chat template into text and the tokens inside its tags, applying the whitespace
/// rules Hugging Face renders with: trim_blocks and lstrip_blocks on, `-` strips, `+`
/// keeps, and one trailing newline of the template dropped.
namespace computron::text::jinja {

/// The kinds of tokens.
enum class tok : uint8_t {
  text,
  block_begin,  ///< {%
  block_end,    ///< %}
  var_begin,    ///< {{
  var_end,      ///< }}
  name,
  string,  ///< text: the literal's value, escapes resolved
  integer,
  floating,
  op,  ///< text: the operator or punctuation
  eof,
};

/// One token and the line it starts on.
struct token {
  tok kind;
  std::string text;
  int line = 0;
};

/// The tokens of `source`, ending with eof. Throws template_error
/// (ec::invalid_configuration, with the line) for an unclosed tag or comment, an
/// unterminated string or a character that starts no token.
std::vector<token> tokenize(const std::string& source);

}  // namespace computron::text::jinja
