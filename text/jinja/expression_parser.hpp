#pragma once

// The chat-template parser's lower half: the token cursor and the expression grammar
// (expression_parser.cpp). The statement parser (parser.cpp) derives from it. Internal to
// text/jinja.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/lexer.hpp"

namespace computron::text::jinja {

/// Tokens to expressions: what `{{ }}` holds and every expression inside a tag, checked
/// against what the interpreter implements (filters, tests, methods) as it goes.
class expression_parser {
 public:
  explicit expression_parser(std::vector<token> tokens) : toks_(std::move(tokens)) {}

 protected:
  /// Deeper nesting than any real template has; the limits keep recursion (parsing here,
  /// evaluating and freeing the tree later) off the stack's end. Height counts the operator
  /// chains the parser builds in loops (`a + b + c ...`, `x.a.b ...`, `x | f | g ...`) too.
  static constexpr int max_depth = 200;
  static constexpr int max_height = 256;

  /// Throws template_error (ec::invalid_configuration) naming `line`.
  [[noreturn]] static void syntax_error(int line, std::string message);

  const token& peek(size_t ahead = 0) const {
    return toks_[std::min(i_ + ahead, toks_.size() - 1)];
  }
  const token& next() {
    const token& t = peek();
    if (i_ < toks_.size() - 1) ++i_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == tok::op && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == tok::name && peek(ahead).text == name;
  }
  static std::string describe(const token& t);
  [[noreturn]] void unexpected(const char* wanted) const;
  void expect_op(const char* op);
  void expect_block_end();
  std::string expect_name();

  /// An expression, or a tuple of them without parentheses (`set a = 1, 2`).
  expr_ptr parse_tuple();
  expr_ptr parse_expression();
  expr_ptr parse_or();

  std::vector<token> toks_;
  size_t i_ = 0;
  /// Tags and expressions open around the current token, against max_depth.
  int depth_ = 0;
  /// Functions called by name and the lines of the calls: checked once the whole template is
  /// parsed (a macro may be defined below its first use in a loop).
  std::vector<std::pair<std::string, int>> calls_;

 private:
  /// A fresh node of `kind` at `line`.
  static expr_ptr node(expr_kind kind, int line);
  /// `e` with its children in place: its height, refused past the limit.
  static expr_ptr done(expr_ptr e);

  expr_ptr binary(const char* op, expr_ptr l, expr_ptr r, int line);
  expr_ptr parse_and();
  expr_ptr parse_not();
  expr_ptr parse_compare();
  /// The arithmetic operators by precedence, loosest first, as Jinja ranks them: + and -,
  /// then ~, then * / // %, then **; all left-associative.
  expr_ptr parse_arith(size_t level = 0);
  expr_ptr parse_unary(bool with_filter);
  expr_ptr parse_primary();
  expr_ptr parse_paren();
  /// `[a, b]` or `{k: v}`; a trailing comma is allowed.
  expr_ptr parse_display(bool dict);
  expr_ptr parse_postfix(expr_ptr e);
  expr_ptr parse_subscript(expr_ptr object);
  /// `(args)` into `e`'s args after its first, keywords into its kwargs.
  void parse_args(expr& e);
  expr_ptr parse_call(expr_ptr callee);
  /// A test or filter named by a string argument (`selectattr('x', 'equalto', 1)`).
  void check_named(const expr& e, size_t index, bool test);
  expr_ptr parse_filters(expr_ptr e);
};

}  // namespace computron::text::jinja
