// The chat-template parser's expressions: literals, names, operators by precedence,
// calls, subscripts, filters and tests, into the tree the interpreter evaluates.
#include "text/jinja/expression_parser.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "text/jinja/builtins.hpp"
#include "text/jinja/interpreter.hpp"

namespace computron::text::jinja {

void expression_parser::syntax_error(int line, std::string message) {
  throw template_error{ec::invalid_configuration, std::move(message), line};
}

expr_ptr expression_parser::node(expr_kind kind, int line) {
  auto e = std::make_unique<expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

expr_ptr expression_parser::done(expr_ptr e) {
  int h = 0;
  for (auto& a : e->args)
    if (a) h = std::max(h, a->height);
  for (auto& kv : e->kwargs) h = std::max(h, kv.second->height);
  e->height = h + 1;
  if (e->height > max_height) syntax_error(e->line, "expression nested too deeply");
  return e;
}

std::string expression_parser::describe(const token& t) {
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

void expression_parser::unexpected(const char* wanted) const {
  syntax_error(peek().line, std::string{"expected "} + wanted + ", got " + describe(peek()));
}

void expression_parser::expect_op(const char* op) {
  if (!is_op(op)) unexpected((std::string{"'"} + op + "'").c_str());
  next();
}

void expression_parser::expect_block_end() {
  if (peek().kind != tok::block_end) unexpected("'%}'");
  next();
}

std::string expression_parser::expect_name() {
  if (peek().kind != tok::name) unexpected("a name");
  return next().text;
}

expr_ptr expression_parser::parse_tuple() {
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

expr_ptr expression_parser::parse_expression() {
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

expr_ptr expression_parser::parse_or() {
  auto e = parse_and();
  while (is_name("or")) {
    int line = next().line;
    e = binary("or", std::move(e), parse_and(), line);
  }
  return e;
}

expr_ptr expression_parser::binary(const char* op, expr_ptr l, expr_ptr r, int line) {
  auto b = node(expr_kind::binary, line);
  b->name = op;
  b->args.push_back(std::move(l));
  b->args.push_back(std::move(r));
  return done(std::move(b));
}

expr_ptr expression_parser::parse_and() {
  auto e = parse_not();
  while (is_name("and")) {
    int line = next().line;
    e = binary("and", std::move(e), parse_not(), line);
  }
  return e;
}

expr_ptr expression_parser::parse_not() {
  if (!is_name("not")) return parse_compare();
  auto u = node(expr_kind::unary, next().line);
  u->name = "not";
  if (++depth_ > max_depth) syntax_error(u->line, "expression nested too deeply");
  u->args.push_back(parse_not());
  --depth_;
  return done(std::move(u));
}

expr_ptr expression_parser::parse_compare() {
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

expr_ptr expression_parser::parse_arith(size_t level) {
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

expr_ptr expression_parser::parse_unary(bool with_filter) {
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

expr_ptr expression_parser::parse_primary() {
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

expr_ptr expression_parser::parse_paren() {
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

expr_ptr expression_parser::parse_display(bool dict) {
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

expr_ptr expression_parser::parse_postfix(expr_ptr e) {
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

expr_ptr expression_parser::parse_subscript(expr_ptr object) {
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

void expression_parser::parse_args(expr& e) {
  expect_op("(");
  while (!is_op(")")) {
    if (is_op("*") || is_op("**")) syntax_error(peek().line, "argument unpacking is not supported");
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

expr_ptr expression_parser::parse_call(expr_ptr callee) {
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

void expression_parser::check_named(const expr& e, size_t index, bool test) {
  if (e.args.size() <= index || e.args[index]->kind != expr_kind::literal ||
      !e.args[index]->lit.is_string())
    return;
  const std::string& n = e.args[index]->lit.as_string();
  if (test ? !is_test(n) : !is_filter(n))
    syntax_error(e.line, std::string{test ? "test '" : "filter '"} + n + "' is not supported");
}

expr_ptr expression_parser::parse_filters(expr_ptr e) {
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

}  // namespace computron::text::jinja
