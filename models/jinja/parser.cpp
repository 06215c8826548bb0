#include "models/jinja/parser.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <set>
#include <vector>

#include "models/jinja/builtins.hpp"
#include "models/jinja/interpreter.hpp"
#include "models/jinja/lexer.hpp"

namespace computron::models::jinja {

namespace {

/// Deeper nesting than any real template has; the limits keep recursion (parsing here,
/// evaluating and freeing the tree later) off the stack's end. Height counts the operator
/// chains the parser builds in loops (`a + b + c ...`, `x.a.b ...`, `x | f | g ...`) too.
constexpr int max_depth = 200;
constexpr int max_height = 256;

[[noreturn]] void syntax_error(int line, std::string message) {
  throw template_error{ec::invalid_configuration, std::move(message), line};
}

expr_ptr node(expr_kind kind, int line) {
  auto e = std::make_unique<expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

/// `e` with its children in place: its height, refused past the limit.
expr_ptr done(expr_ptr e) {
  int h = 0;
  for (auto& a : e->args)
    if (a) h = std::max(h, a->height);
  for (auto& kv : e->kwargs) h = std::max(h, kv.second->height);
  e->height = h + 1;
  if (e->height > max_height) syntax_error(e->line, "expression nested too deeply");
  return e;
}

class parser {
 public:
  explicit parser(std::vector<token> tokens) : toks_(std::move(tokens)) {}

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
  static std::string describe(const token& t) {
    switch (t.kind) {
      case tok::eof:
        return "end of template";
      case tok::block_end:
        return "'%}'";
      case tok::var_end:
        return "'}}'";
      case tok::text:
        return "text";
      case tok::string:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const char* wanted) const {
    syntax_error(peek().line, std::string{"expected "} + wanted + ", got " + describe(peek()));
  }
  void expect_op(const char* op) {
    if (!is_op(op)) unexpected((std::string{"'"} + op + "'").c_str());
    next();
  }
  void expect_block_end() {
    if (peek().kind != tok::block_end) unexpected("'%}'");
    next();
  }
  std::string expect_name() {
    if (peek().kind != tok::name) unexpected("a name");
    return next().text;
  }

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

  /// An expression, or a tuple of them without parentheses (`set a = 1, 2`).
  expr_ptr parse_tuple() {
    int line = peek().line;
    auto first = parse_expression();
    if (!is_op(",")) return first;
    auto t = node(expr_kind::tuple, line);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (peek().kind == tok::block_end || peek().kind == tok::var_end) break;
      t->args.push_back(parse_expression());
    }
    return done(std::move(t));
  }

  expr_ptr parse_expression() {
    if (++depth_ > max_depth) syntax_error(peek().line, "expression nested too deeply");
    auto e = parse_or();
    while (is_name("if")) {
      auto c = node(expr_kind::conditional, next().line);
      c->args.push_back(std::move(e));
      c->args.push_back(parse_or());
      if (is_name("else")) {
        next();
        c->args.push_back(parse_expression());
      } else {
        c->args.push_back(nullptr);
      }
      e = done(std::move(c));
    }
    --depth_;
    return e;
  }

  expr_ptr binary(const char* op, expr_ptr l, expr_ptr r, int line) {
    auto b = node(expr_kind::binary, line);
    b->name = op;
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return done(std::move(b));
  }

  expr_ptr parse_or() {
    auto e = parse_and();
    while (is_name("or")) {
      int line = next().line;
      e = binary("or", std::move(e), parse_and(), line);
    }
    return e;
  }

  expr_ptr parse_and() {
    auto e = parse_not();
    while (is_name("and")) {
      int line = next().line;
      e = binary("and", std::move(e), parse_not(), line);
    }
    return e;
  }

  expr_ptr parse_not() {
    if (!is_name("not")) return parse_compare();
    auto u = node(expr_kind::unary, next().line);
    u->name = "not";
    if (++depth_ > max_depth) syntax_error(u->line, "expression nested too deeply");
    u->args.push_back(parse_not());
    --depth_;
    return done(std::move(u));
  }

  expr_ptr parse_compare() {
    int line = peek().line;
    auto first = parse_arith();
    expr_ptr chain;
    while (true) {
      std::string op;
      if (peek().kind == tok::op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!chain) {
        chain = node(expr_kind::compare, line);
        chain->args.push_back(std::move(first));
      }
      chain->ops.push_back(op);
      chain->args.push_back(parse_arith());
    }
    return chain ? done(std::move(chain)) : std::move(first);
  }

  /// The arithmetic operators by precedence, loosest first, as Jinja ranks them: + and -,
  /// then ~, then * / // %, then **; all left-associative.
  expr_ptr parse_arith(size_t level = 0) {
    static const std::vector<std::vector<const char*>> levels = {
        {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    if (level == levels.size()) return parse_unary(true);
    auto e = parse_arith(level + 1);
    while (true) {
      const char* op = nullptr;
      for (const char* o : levels[level])
        if (is_op(o)) op = o;
      if (!op) return e;
      int line = next().line;
      if (*op == '%' && e->kind == expr_kind::literal && e->lit.is_string())
        syntax_error(line, "printf-style formatting ('...' % x) is not supported");
      e = binary(op, std::move(e), parse_arith(level + 1), line);
    }
  }

  expr_ptr parse_unary(bool with_filter) {
    if (++depth_ > max_depth) syntax_error(peek().line, "expression nested too deeply");
    expr_ptr e;
    if (is_op("-") || is_op("+")) {
      const token& t = next();
      e = node(expr_kind::unary, t.line);
      e->name = t.text == "-" ? "-" : "+";
      e->args.push_back(parse_unary(false));
      e = done(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    --depth_;
    return e;
  }

  expr_ptr parse_primary() {
    const token& t = peek();
    switch (t.kind) {
      case tok::name: {
        next();
        auto e = node(expr_kind::literal, t.line);
        if (t.text == "true" || t.text == "True") {
          e->lit = true;
        } else if (t.text == "false" || t.text == "False") {
          e->lit = false;
        } else if (t.text == "none" || t.text == "None") {
          e->lit = none_t{};
        } else {
          if (t.text == "varargs" || t.text == "kwargs" || t.text == "caller")
            syntax_error(t.line, "'" + t.text + "' is not supported");
          e->kind = expr_kind::name;
          e->name = t.text;
        }
        return e;
      }
      case tok::string: {
        auto e = node(expr_kind::literal, t.line);
        std::string s;
        while (peek().kind == tok::string) s += next().text;  // adjacent literals join
        e->lit = std::move(s);
        return e;
      }
      case tok::integer: {
        next();
        auto e = node(expr_kind::literal, t.line);
        errno = 0;
        long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) syntax_error(t.line, "integer literal " + t.text + " is too large");
        e->lit = static_cast<int64_t>(v);
        return e;
      }
      case tok::floating: {
        next();
        auto e = node(expr_kind::literal, t.line);
        e->lit = std::strtod(t.text.c_str(), nullptr);
        return e;
      }
      case tok::op:
        if (t.text == "(") return parse_paren();
        if (t.text == "[" || t.text == "{") return parse_display(t.text == "{");
        [[fallthrough]];
      default:
        unexpected("an expression");
    }
  }

  expr_ptr parse_paren() {
    int line = next().line;
    if (is_op(")")) {
      next();
      return node(expr_kind::tuple, line);
    }
    auto e = parse_expression();
    if (is_op(",")) {
      auto t = node(expr_kind::tuple, line);
      t->args.push_back(std::move(e));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        t->args.push_back(parse_expression());
      }
      e = done(std::move(t));
    }
    expect_op(")");
    return e;
  }

  /// `[a, b]` or `{k: v}`; a trailing comma is allowed.
  expr_ptr parse_display(bool dict) {
    auto e = node(dict ? expr_kind::dict : expr_kind::list, next().line);
    const char* close = dict ? "}" : "]";
    while (!is_op(close)) {
      e->args.push_back(parse_expression());
      if (dict) {
        expect_op(":");
        e->args.push_back(parse_expression());
      }
      if (!is_op(close)) expect_op(",");
    }
    next();
    return done(std::move(e));
  }

  expr_ptr parse_postfix(expr_ptr e) {
    while (true) {
      if (is_op(".")) {
        int line = next().line;
        if (peek().kind == tok::integer) {  // `x.0` is `x[0]`
          auto index = node(expr_kind::literal, line);
          index->lit = static_cast<int64_t>(std::strtoll(next().text.c_str(), nullptr, 10));
          auto item = node(expr_kind::item, line);
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(index));
          e = done(std::move(item));
          continue;
        }
        auto a = node(expr_kind::attr, line);
        a->name = expect_name();
        a->args.push_back(std::move(e));
        e = done(std::move(a));
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  expr_ptr parse_subscript(expr_ptr object) {
    int line = next().line;
    expr_ptr parts[3];
    bool is_slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = parse_expression();
      if (k < 2 && is_op(":")) {
        next();
        is_slice = true;
      } else {
        break;
      }
    }
    expect_op("]");
    if (!is_slice && !parts[0]) syntax_error(line, "empty subscript '[]'");
    auto e = node(is_slice ? expr_kind::slice : expr_kind::item, line);
    e->args.push_back(std::move(object));
    for (int k = 0; k < (is_slice ? 3 : 1); ++k) e->args.push_back(std::move(parts[k]));
    return done(std::move(e));
  }

  /// `(args)` into `e`'s args after its first, keywords into its kwargs.
  void parse_args(expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**"))
        syntax_error(peek().line, "argument unpacking is not supported");
      if (peek().kind == tok::name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty())
          syntax_error(peek().line, "positional argument follows keyword argument");
        e.args.push_back(parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  expr_ptr parse_call(expr_ptr callee) {
    auto c = node(expr_kind::call, peek().line);
    if (callee->kind == expr_kind::name) {
      calls_.emplace_back(callee->name, callee->line);
    } else if (callee->kind == expr_kind::attr) {
      if (!is_method(callee->name))
        syntax_error(callee->line, "method '" + callee->name + "' is not supported");
    } else {
      syntax_error(c->line, "only functions, macros and methods can be called");
    }
    c->args.push_back(std::move(callee));
    parse_args(*c);
    return done(std::move(c));
  }

  /// A test or filter named by a string argument (`selectattr('x', 'equalto', 1)`).
  void check_named(const expr& e, size_t index, bool test) {
    if (e.args.size() <= index || e.args[index]->kind != expr_kind::literal ||
        !e.args[index]->lit.is_string())
      return;
    const std::string& n = e.args[index]->lit.as_string();
    if (test ? !is_test(n) : !is_filter(n))
      syntax_error(e.line, std::string{test ? "test '" : "filter '"} + n + "' is not supported");
  }

  expr_ptr parse_filters(expr_ptr e) {
    while (true) {
      if (is_op("|")) {
        auto f = node(expr_kind::filter, next().line);
        f->name = expect_name();
        if (!is_filter(f->name)) syntax_error(f->line, "filter '" + f->name + "' is not supported");
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        if (f->name == "tojson" && f->args.size() > 1)
          syntax_error(f->line, "filter 'tojson' takes keyword arguments only");
        if (f->name == "selectattr" || f->name == "rejectattr") check_named(*f, 2, true);
        if (f->name == "select" || f->name == "reject") check_named(*f, 1, true);
        if (f->name == "map") check_named(*f, 1, false);
        e = done(std::move(f));
      } else if (is_name("is")) {
        auto t = node(expr_kind::test, next().line);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        if (peek().kind != tok::name) unexpected("a test name");
        t->name = next().text;
        if (!is_test(t->name)) syntax_error(t->line, "test '" + t->name + "' is not supported");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((peek().kind == tok::name || peek().kind == tok::string ||
                    peek().kind == tok::integer || peek().kind == tok::floating || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("in") && !is_name("not") && !is_name("is")) {
          t->args.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
        }
        if (!t->kwargs.empty()) syntax_error(t->line, "tests take no keyword arguments");
        e = done(std::move(t));
      } else {
        return e;
      }
    }
  }

  std::vector<token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;
  std::set<std::string> macros_;
  std::vector<std::pair<std::string, int>> calls_;
};

}  // namespace

program parse_program(const std::string& source) {
  return parser{tokenize(source)}.run();
}

}  // namespace computron::models::jinja
