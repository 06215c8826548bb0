#include "text/jinja/interpreter.hpp"

#include <cmath>
#include <ctime>
#include <deque>
#include <limits>

#include "text/jinja/builtins.hpp"

namespace computron::text::jinja {

/// Variables of one level: the context, a loop, a macro call. Small, so a vector suffices.
struct scope {
  scope* parent = nullptr;
  std::vector<std::pair<std::string, value>> vars;

  const value* find(std::string_view name) const {
    for (auto& [k, v] : vars)
      if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

bool is_global(std::string_view name) {
  return name == "raise_exception" || name == "strftime_now" || name == "range" ||
         name == "namespace" || name == "dict";
}

namespace {

/// Bounds on one render, so that no template (or request) can exhaust the host.
constexpr size_t max_output_bytes = size_t{64} << 20;
constexpr size_t max_list_items = size_t{1} << 22;
/// Jinja's sandbox refuses larger ranges (MAX_RANGE) too.
constexpr size_t max_range = 100000;
constexpr size_t max_scopes = size_t{1} << 20;
constexpr int max_macro_depth = 64;
/// Statements and expressions being evaluated inside one another (macro calls multiply the
/// nesting the parser bounds): past this the stack could run out.
constexpr int max_nesting = 500;
/// Statements run, expressions evaluated and values walked in one render: real templates
/// need a few per message, a loop that never ends is stopped.
constexpr size_t max_work = size_t{2} << 20;

enum class flow { normal, brk, cont };

void check_size(size_t bytes) {
  if (bytes > max_output_bytes) fail("rendered text exceeds 64 MiB");
}

[[noreturn]] void fail_undefined(const value& v) {
  fail(v.undefined_name());
}

[[noreturn]] void unsupported(const std::string& op, const value& a, const value& b) {
  fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) +
       "'");
}

value int_arith(const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(x, y, &r);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(x, y, &r);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(x, y, &r);
  } else if (op == "//" || op == "%") {
    if (y == 0) fail("integer division or modulo by zero");
    if (x == std::numeric_limits<int64_t>::min() && y == -1) fail("integer overflow");
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {  // Python rounds toward negative infinity
      --q;
      m += y;
    }
    r = op == "//" ? q : m;
  } else if (op == "**") {
    if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
    r = 1;
    for (int64_t base = x; y > 0 && !overflow; y >>= 1) {
      if (y & 1) overflow = __builtin_mul_overflow(r, base, &r);
      if (y > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
    }
  }
  if (overflow) fail("integer overflow");
  return r;
}

value float_arith(const std::string& op, double x, double y) {
  if (op == "+") return x + y;
  if (op == "-") return x - y;
  if (op == "*") return x * y;
  if (op == "//" || op == "%") {
    if (y == 0) fail("float division or modulo by zero");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return op == "%" ? m : std::floor((x - m) / y + 0.5);
  }
  if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
  if (x < 0 && y != std::floor(y)) fail("negative number cannot be raised to a fractional power");
  return std::pow(x, y);
}

value repeat(const value& seq, int64_t n) {
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (n <= 0 || s.empty()) return std::string{};
    check_size(s.size() * static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 40)));
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += s;
    return out;
  }
  auto& l = seq.as_list();
  if (n <= 0 || l.items.empty()) return value::make_list({}, l.flavor);
  if (l.items.size() * static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 40)) > max_list_items)
    fail("list too long");
  std::vector<value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), l.items.begin(), l.items.end());
  return value::make_list(std::move(out), l.flavor);
}

value arith(const std::string& op, const value& a, const value& b) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    check_size(s.size());
    return s;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (op == "/") {
      if (b.as_double() == 0) fail("division by zero");
      return a.as_double() / b.as_double();
    }
    if (a.is_integral() && b.is_integral()) return int_arith(op, a.as_int(), b.as_int());
    return float_arith(op, a.as_double(), b.as_double());
  }
  using k = value::kind;
  if (op == "+" && a.is_string() && b.is_string()) {
    check_size(a.as_string().size() + b.as_string().size());
    return a.as_string() + b.as_string();
  }
  if (op == "+" && a.is(k::list) && b.is(k::list) && a.as_list().indexable() &&
      a.as_list().flavor == b.as_list().flavor) {
    if (a.as_list().items.size() + b.as_list().items.size() > max_list_items) fail("list too long");
    std::vector<value> items = a.as_list().items;
    items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
    return value::make_list(std::move(items), a.as_list().flavor);
  }
  auto repeatable = [](const value& v) {
    return v.is_string() || (v.is(value::kind::list) && v.as_list().indexable());
  };
  if (op == "*" && repeatable(a) && b.is_integral()) return repeat(a, b.as_int());
  if (op == "*" && repeatable(b) && a.is_integral()) return repeat(b, a.as_int());
  if (op == "%" && a.is_string()) fail("printf-style formatting ('...' % x) is not supported");
  unsupported(op, a, b);
}

bool compare_op(const std::string& op, const value& a, const value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  bool comparable = (a.is_number() && b.is_number()) || (a.is_string() && b.is_string()) ||
                    (a.is(value::kind::list) && b.is(value::kind::list));
  if (!comparable)
    fail("'" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
         type_name(b) + "'");
  int c = compare(a, b);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

/// Python's slice.indices() applied to a list or a string; other values give undefined,
/// as Jinja's getitem does.
value slice(const value& obj, const value& start_v, const value& stop_v, const value& step_v) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (!obj.is_string() && !(obj.is(value::kind::list) && obj.as_list().indexable()))
    return undefined_t{"'" + type_name(obj) + " object' is not subscriptable"};
  auto bound = [](const value& v, int64_t fallback) {
    if (v.is_undefined() || v.is_none()) return fallback;
    if (!v.is_integral()) fail("slice indices must be integers or None");
    return v.as_int();
  };
  int64_t step = bound(step_v, 1);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<std::string_view> chars;
  if (obj.is_string()) chars = utf8_chars(obj.as_string());
  auto n = static_cast<int64_t>(obj.is_string() ? chars.size() : obj.as_list().items.size());
  int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? n : n - 1;
  auto clamp = [&](const value& v, int64_t fallback) {
    if (v.is_undefined() || v.is_none()) return fallback;
    int64_t i = bound(v, 0);
    if (i < 0) i = std::max(i + n, lower);
    return std::min(i, upper);
  };
  int64_t start = clamp(start_v, step > 0 ? lower : upper);
  int64_t stop = clamp(stop_v, step > 0 ? upper : lower);
  std::string text;
  std::vector<value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.is_string())
      text += chars[static_cast<size_t>(i)];
    else
      items.push_back(obj.as_list().items[static_cast<size_t>(i)]);
  }
  if (obj.is_string()) return text;
  return value::make_list(std::move(items), obj.as_list().flavor);
}

class interpreter {
 public:
  std::string run(const program& p, const value& context) {
    scope& root = new_scope(nullptr);
    if (context.is(value::kind::dict))
      for (auto& [k, v] : context.as_dict().entries) root.set(k, v);
    std::string out;
    exec(p.body, root, out);
    return out;
  }

 private:
  scope& new_scope(scope* parent) {
    if (scopes_.size() >= max_scopes) fail("template does too much work (scopes)");
    scopes_.emplace_back();
    scopes_.back().parent = parent;
    return scopes_.back();
  }

  value lookup(const std::string& name, const scope& s) {
    for (const scope* p = &s; p; p = p->parent)
      if (auto* v = p->find(name)) return *v;
    if (is_global(name)) return std::make_shared<const callable>(callable{name});
    return undefined_t{"'" + name + "' is undefined"};
  }

  flow exec(const stmt_list& body, scope& s, std::string& out) {
    for (auto& st : body) {
      flow f = exec_one(*st, s, out);
      if (f != flow::normal) return f;
    }
    return flow::normal;
  }

  /// Counts one level of evaluation nesting while it lives.
  struct nested {
    explicit nested(int& depth) : depth_(depth) {
      if (++depth_ > max_nesting) {
        --depth_;
        fail("the template nests too deeply");
      }
    }
    ~nested() { --depth_; }
    int& depth_;
  };

  flow exec_one(const stmt& st, scope& s, std::string& out) {
    charge_work();
    nested level{nesting_};
    try {
      return exec_stmt(st, s, out);
    } catch (template_error& err) {
      if (err.line == 0) err.line = st.line;
      throw;
    }
  }

  void bind(scope& s, const std::vector<std::string>& targets, const value& item) {
    if (targets.size() == 1) {
      s.set(targets[0], item);
      return;
    }
    if (!item.is(value::kind::list) && !item.is_string())
      fail("cannot unpack non-iterable " + type_name(item) + " object");
    auto parts = iterate(item);
    if (parts.size() != targets.size())
      fail(std::string{parts.size() > targets.size() ? "too many" : "not enough"} +
           " values to unpack (expected " + std::to_string(targets.size()) + ", got " +
           std::to_string(parts.size()) + ")");
    for (size_t i = 0; i < targets.size(); ++i) s.set(targets[i], parts[i]);
  }

  flow exec_stmt(const stmt& st, scope& s, std::string& out) {
    switch (st.kind) {
      case stmt_kind::text:
        out += st.text;
        check_size(out.size());
        return flow::normal;
      case stmt_kind::output:
        out += to_str(eval(*st.value, s));
        check_size(out.size());
        return flow::normal;
      case stmt_kind::if_:
        return exec(truthy(eval(*st.value, s)) ? st.body : st.orelse, s, out);
      case stmt_kind::for_:
        return exec_for(st, s, out);
      case stmt_kind::set: {
        value v = eval(*st.value, s);
        if (st.attr.empty()) {
          bind(s, st.targets, v);
        } else {
          value target = lookup(st.targets[0], s);
          if (!target.is(value::kind::ns)) fail("cannot assign attribute on non-namespace object");
          target.as_namespace().attrs.set(st.attr, std::move(v));
        }
        return flow::normal;
      }
      case stmt_kind::set_block: {
        // The body has a scope of its own: what it sets stays inside.
        std::string captured;
        flow f = exec(st.body, new_scope(&s), captured);
        s.set(st.targets[0], std::move(captured));
        return f;
      }
      case stmt_kind::macro:
        s.set(st.text, std::make_shared<const callable>(callable{st.text, &st, &s}));
        return flow::normal;
      case stmt_kind::break_:
        return flow::brk;
      case stmt_kind::continue_:
        return flow::cont;
      case stmt_kind::block:
        return exec(st.body, s, out);
    }
    return flow::normal;
  }

  flow exec_for(const stmt& st, scope& s, std::string& out) {
    std::vector<value> items = iterate(eval(*st.value, s));
    charge_work(items.size());
    scope& ls = new_scope(&s);
    if (st.filter) {
      std::vector<value> kept;
      for (auto& item : items) {
        bind(ls, st.targets, item);
        if (truthy(eval(*st.filter, ls))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      charge_work();
      // As in Jinja, each iteration starts afresh: what the body set last time is gone.
      ls.vars.clear();
      dict_data loop;
      loop.entries = {{"index", i + 1},      {"index0", i},
                      {"revindex", n - i},   {"revindex0", n - i - 1},
                      {"first", i == 0},     {"last", i == n - 1},
                      {"length", n},         {"depth", int64_t{1}},
                      {"depth0", int64_t{0}}};
      if (i > 0) loop.entries.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.entries.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      ls.set("loop", value::make_dict(std::move(loop)));
      bind(ls, st.targets, items[static_cast<size_t>(i)]);
      if (exec(st.body, ls, out) == flow::brk) break;
    }
    if (n == 0) {
      ls.vars.clear();
      return exec(st.orelse, ls, out);
    }
    return flow::normal;
  }

  value eval(const expr& e, scope& s) {
    charge_work();
    nested level{nesting_};
    try {
      return eval_node(e, s);
    } catch (template_error& err) {
      if (err.line == 0) err.line = e.line;
      throw;
    }
  }

  call_args eval_args(const expr& e, scope& s) {
    call_args a;
    for (size_t i = 1; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], s));
    for (auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v, s));
    return a;
  }

  value eval_node(const expr& e, scope& s) {
    switch (e.kind) {
      case expr_kind::literal:
        return e.lit;
      case expr_kind::name:
        return lookup(e.name, s);
      case expr_kind::list:
      case expr_kind::tuple: {
        std::vector<value> items;
        for (auto& a : e.args) items.push_back(eval(*a, s));
        return value::make_list(std::move(items),
                                e.kind == expr_kind::tuple ? seq::tuple : seq::list);
      }
      case expr_kind::dict: {
        dict_data d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          value k = eval(*e.args[i], s);
          if (!k.is_string()) fail("dict keys must be strings here, not " + type_name(k));
          d.set(k.as_string(), eval(*e.args[i + 1], s));
        }
        return value::make_dict(std::move(d));
      }
      case expr_kind::attr:
        return get_attr(eval(*e.args[0], s), e.name);
      case expr_kind::item:
        return get_item(eval(*e.args[0], s), eval(*e.args[1], s));
      case expr_kind::slice: {
        value obj = eval(*e.args[0], s);
        auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i], s) : value{}; };
        return slice(obj, part(1), part(2), part(3));
      }
      case expr_kind::call:
        return eval_call(e, s);
      case expr_kind::filter:
        return apply_filter(e.name, eval(*e.args[0], s), eval_args(e, s));
      case expr_kind::test:
        return apply_test(e.name, eval(*e.args[0], s), eval_args(e, s)) != e.negated;
      case expr_kind::unary: {
        value v = eval(*e.args[0], s);
        if (e.name == "not") return !truthy(v);
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number())
          fail("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
        if (e.name == "+") return v.is(value::kind::floating) ? v : value{v.as_int()};
        if (v.is(value::kind::floating)) return -v.as_double();
        return int_arith("-", 0, v.as_int());
      }
      case expr_kind::binary: {
        value a = eval(*e.args[0], s);
        if (e.name == "and") return truthy(a) ? eval(*e.args[1], s) : a;
        if (e.name == "or") return truthy(a) ? a : eval(*e.args[1], s);
        return arith(e.name, a, eval(*e.args[1], s));
      }
      case expr_kind::compare: {
        value a = eval(*e.args[0], s);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          value b = eval(*e.args[i + 1], s);
          if (!compare_op(e.ops[i], a, b)) return false;
          a = std::move(b);
        }
        return true;
      }
      case expr_kind::conditional:
        if (truthy(eval(*e.args[1], s))) return eval(*e.args[0], s);
        return e.args[2] ? eval(*e.args[2], s) : value{undefined_t{"conditional without else"}};
    }
    return value{};
  }

  value eval_call(const expr& e, scope& s) {
    const expr& callee = *e.args[0];
    if (callee.kind == expr_kind::attr) {
      value receiver = eval(*callee.args[0], s);
      if (receiver.is_undefined()) fail_undefined(receiver);
      return call_method(receiver, callee.name, eval_args(e, s));
    }
    value f = eval(callee, s);
    if (f.is_undefined()) fail_undefined(f);
    if (!f.is(value::kind::callable)) fail("'" + type_name(f) + "' object is not callable");
    call_args args = eval_args(e, s);
    const callable& c = f.as_callable();
    if (c.macro) return call_macro(c, args);
    return call_global(c.name, args);
  }

  value call_macro(const callable& c, const call_args& args) {
    const stmt& m = *c.macro;
    if (args.positional.size() > m.params.size())
      fail("macro '" + c.name + "' takes not more than " + std::to_string(m.params.size()) +
           " argument(s)");
    for (auto& [k, v] : args.keyword) {
      bool known = false;
      for (auto& p : m.params) known = known || p.first == k;
      if (!known) fail("macro '" + c.name + "' takes no keyword argument '" + k + "'");
    }
    if (macro_depth_ >= max_macro_depth) fail("macro calls nested too deeply");
    scope& ms = new_scope(c.closure);
    for (size_t i = 0; i < m.params.size(); ++i) {
      auto& [name, fallback] = m.params[i];
      bool given = i < args.positional.size();
      for (auto& kw : args.keyword) given = given || kw.first == name;
      // An argument given as undefined stays undefined; only a missing one takes the default.
      value v = given ? args.get(i, name) : fallback ? eval(*fallback, ms) : value{};
      if (!given && !fallback) v = undefined_t{"'" + name + "' is undefined"};
      ms.set(name, std::move(v));
    }
    ++macro_depth_;
    std::string out;
    exec(m.body, ms, out);
    --macro_depth_;
    return out;
  }

  value call_global(const std::string& name, const call_args& args) {
    if (name == "raise_exception") {
      // The template's own refusal: its message goes to the client as it is.
      throw template_error{ec::invalid_request, to_str(args.get(0, "message")), -1};
    }
    if (name == "strftime_now") {
      std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      std::string format = to_str(args.get(0, "format"));
      char buf[512];
      size_t n = format.empty() ? 0 : std::strftime(buf, sizeof(buf), format.c_str(), &local);
      return std::string(buf, n);
    }
    if (name == "range") {
      args.check("range", 3, {});
      std::vector<int64_t> bounds;
      for (auto& v : args.positional) {
        if (!v.is_integral()) fail("range() integer argument expected, got " + type_name(v));
        bounds.push_back(v.as_int());
      }
      if (bounds.empty()) fail("range expected at least 1 argument, got 0");
      int64_t start = bounds.size() > 1 ? bounds[0] : 0;
      int64_t stop = bounds.size() > 1 ? bounds[1] : bounds[0];
      int64_t step = bounds.size() > 2 ? bounds[2] : 1;
      if (step == 0) fail("range() arg 3 must not be zero");
      std::vector<value> out;
      charge_work(1 + static_cast<size_t>(std::min<int64_t>(
                          max_range, (stop - start) / step > 0 ? (stop - start) / step : 0)));
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= max_range)
          fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        out.emplace_back(i);
        if ((step > 0 && i > std::numeric_limits<int64_t>::max() - step) ||
            (step < 0 && i < std::numeric_limits<int64_t>::min() - step))
          break;
      }
      return value::make_list(std::move(out));
    }
    // namespace(...) and dict(...): a mapping or pairs, then keyword arguments.
    if (args.positional.size() > 1)
      fail(name + "() takes at most 1 positional argument, got " +
           std::to_string(args.positional.size()));
    dict_data d;
    if (!args.positional.empty()) {
      const value& src = args.positional[0];
      if (src.is(value::kind::dict)) {
        d = src.as_dict();
      } else {
        for (auto& pair : iterate(src)) {
          if (!pair.is(value::kind::list) || pair.as_list().items.size() != 2 ||
              !pair.as_list().items[0].is_string())
            fail(name + "() needs a mapping or (key, value) pairs");
          d.set(pair.as_list().items[0].as_string(), pair.as_list().items[1]);
        }
      }
    }
    for (auto& [k, v] : args.keyword) d.set(k, v);
    if (name == "dict") return value::make_dict(std::move(d));
    namespaces_.emplace_back();
    namespaces_.back().attrs = std::move(d);
    return &namespaces_.back();
  }

  std::deque<scope> scopes_;
  std::deque<namespace_object> namespaces_;
  int macro_depth_ = 0;
  int nesting_ = 0;
};

}  // namespace

std::string render_program(const program& p, const value& context) {
  work_budget budget{max_work};
  return interpreter{}.run(p, context);
}

}  // namespace computron::text::jinja
