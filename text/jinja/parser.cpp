// The chat-template parser's statements: text, `{{ }}` output and the tags (if, for, set,
// macro, generation, break, continue) into the program the interpreter runs; expressions
// come from expression_parser.
#include "text/jinja/parser.hpp"

#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "text/jinja/expression_parser.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/lexer.hpp"

namespace computron::text::jinja {

namespace {

/// Tokens to a program: the statements, over expression_parser's cursor and expressions.
class parser : public expression_parser {
 public:
  using expression_parser::expression_parser;

  program run() {
    program p;
    p.body = parse_body({}, "", 0);
    // Calls are checked last: a macro may be defined below its first use in a loop.
    for (auto& [name, line] : calls_)
      if (!is_global(name) && !macros_.count(name))
        syntax_error(line, "function '" + name + "' is not supported");
    return p;
  }

 private:
  /// Statements up to one of `enders` (left unconsumed: the `{%` is current), or the end of
  /// the template when `enders` is empty. `opener` and `line` name the tag for errors.
  stmt_list parse_body(std::initializer_list<const char*> enders, const char* opener, int line) {
    stmt_list body;
    while (true) {
      const token& t = peek();
      if (t.kind == tok::eof) {
        if (enders.size() == 0) return body;
        syntax_error(line, std::string{"'"} + opener + "' tag is never closed (expected '" +
                               *(enders.end() - 1) + "')");
      }
      if (t.kind == tok::text) {
        auto s = std::make_unique<stmt>();
        s->kind = stmt_kind::text;
        s->line = t.line;
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (t.kind == tok::var_begin) {
        auto s = std::make_unique<stmt>();
        s->kind = stmt_kind::output;
        s->line = next().line;
        s->value = parse_tuple();
        if (peek().kind != tok::var_end) unexpected("'}}'");
        next();
        body.push_back(std::move(s));
      } else {
        const token& name = peek(1);
        for (const char* e : enders)
          if (name.kind == tok::name && name.text == e) return body;
        body.push_back(parse_statement());
      }
    }
  }

  /// Consumes `{% name %}`, whose name parse_body has checked.
  void expect_end_tag() {
    next();
    next();
    expect_block_end();
  }

  /// The statement whose `{%` is current; `as_elif`: the `elif` of an enclosing `if`.
  stmt_ptr parse_statement(bool as_elif = false) {
    int line = next().line;  // {%
    if (peek().kind != tok::name) unexpected("a tag name");
    std::string tag = next().text;
    auto s = std::make_unique<stmt>();
    s->line = line;
    if (++depth_ > max_depth) syntax_error(line, "tags nested too deeply");
    if (tag == "if" || (tag == "elif" && as_elif)) {
      s->kind = stmt_kind::if_;
      s->value = parse_expression();
      expect_block_end();
      s->body = parse_body({"elif", "else", "endif"}, "if", line);
      if (is_name("elif", 1)) {
        // An elif is an if in the else branch; that nested if consumes the endif.
        s->orelse.push_back(parse_statement(true));
      } else {
        if (is_name("else", 1)) {
          expect_end_tag();
          s->orelse = parse_body({"endif"}, "if", line);
        }
        expect_end_tag();
      }
    } else if (tag == "for") {
      s->kind = stmt_kind::for_;
      bool paren = is_op("(");
      if (paren) next();
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        next();
        s->targets.push_back(expect_name());
      }
      if (paren) expect_op(")");
      if (!is_name("in")) unexpected("'in'");
      next();
      s->value = parse_or();
      if (is_name("if")) {
        next();
        s->filter = parse_expression();
      }
      if (is_name("recursive")) syntax_error(peek().line, "recursive loops are not supported");
      expect_block_end();
      ++loops_;
      s->body = parse_body({"else", "endfor"}, "for", line);
      --loops_;
      if (is_name("else", 1)) {
        expect_end_tag();
        s->orelse = parse_body({"endfor"}, "for", line);
      }
      expect_end_tag();
    } else if (tag == "set") {
      s->kind = stmt_kind::set;
      s->targets.push_back(expect_name());
      if (is_op(".")) {
        next();
        s->attr = expect_name();
      } else {
        while (is_op(",")) {
          next();
          s->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        next();
        s->value = parse_tuple();
        expect_block_end();
      } else {
        if (!s->attr.empty() || s->targets.size() != 1) unexpected("'='");
        expect_block_end();
        s->kind = stmt_kind::set_block;
        s->body = parse_body({"endset"}, "set", line);
        expect_end_tag();
      }
    } else if (tag == "macro") {
      s->kind = stmt_kind::macro;
      s->text = expect_name();
      macros_.insert(s->text);
      expect_op("(");
      while (!is_op(")")) {
        std::string param = expect_name();
        expr_ptr fallback;
        if (is_op("=")) {
          next();
          fallback = parse_expression();
        }
        s->params.emplace_back(std::move(param), std::move(fallback));
        if (!is_op(")")) expect_op(",");
      }
      next();
      expect_block_end();
      int loops = loops_;
      loops_ = 0;  // break and continue do not reach through a macro into a loop
      s->body = parse_body({"endmacro"}, "macro", line);
      loops_ = loops;
      expect_end_tag();
    } else if (tag == "generation") {
      // transformers' marker of assistant text: rendered as its body.
      s->kind = stmt_kind::block;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, "generation", line);
      expect_end_tag();
    } else if (tag == "break" || tag == "continue") {
      if (loops_ == 0) syntax_error(line, "'" + tag + "' outside a loop");
      s->kind = tag == "break" ? stmt_kind::break_ : stmt_kind::continue_;
      expect_block_end();
    } else if (tag == "else" || tag == "elif" || tag.rfind("end", 0) == 0) {
      syntax_error(line, "unexpected '" + tag + "' tag");
    } else {
      syntax_error(line, "tag '" + tag + "' is not supported");
    }
    --depth_;
    return s;
  }

  int loops_ = 0;
  std::set<std::string> macros_;
};

}  // namespace

program parse_program(const std::string& source) {
  return parser{tokenize(source)}.run();
}

}  // namespace computron::text::jinja
