#include "text/jinja/builtins.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace computron::text::jinja {

namespace {

/// Names known to the parser: every one of them is implemented below.
const std::string_view filter_names[] = {
    "abs",    "capitalize", "count",   "d",       "default", "first",  "float",      "indent",
    "int",    "items",      "join",    "last",    "length",  "list",   "lower",      "map",
    "reject", "rejectattr", "replace", "reverse", "safe",    "select", "selectattr", "sort",
    "string", "title",      "tojson",  "trim",    "unique",  "upper"};
const std::string_view test_names[] = {
    "boolean",  "callable", "defined",  "divisibleby", "eq",   "equalto", "==",
    "even",     "false",    "float",    "ge",          ">=",   "gt",      ">",
    "in",       "integer",  "iterable", "le",          "<=",   "lower",   "lt",
    "<",        "mapping",  "ne",       "!=",          "none", "number",  "odd",
    "sequence", "string",   "true",     "undefined",   "upper"};

template <size_t N>
bool known(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

[[noreturn]] void fail_undefined(const value& v) {
  fail(v.undefined_name());
}

int64_t int_arg(const value& v, std::string_view what) {
  if (!v.is_integral()) fail(std::string{what} + " must be an integer, not '" + type_name(v) + "'");
  return v.as_int();
}

bool bool_arg(const value& v) {
  return truthy(v);
}

/// `item`'s attribute path "a.b.0" as Jinja's map/selectattr/sort follow it.
value attribute_path(const value& item, const std::string& path) {
  value v = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return c >= '0' && c <= '9'; });
    if (v.is_undefined()) return v;
    v = digits && v.is(value::kind::list) ? get_item(v, static_cast<int64_t>(std::stoll(part)))
                                          : get_item(v, part);
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

int64_t length(const value& v) {
  switch (v.type()) {
    case value::kind::undefined:
      return 0;
    case value::kind::string:
      return static_cast<int64_t>(utf8_chars(v.as_string()).size());
    case value::kind::list:
      if (v.as_list().flavor == seq::generator) break;
      return static_cast<int64_t>(v.as_list().items.size());
    case value::kind::dict:
      return static_cast<int64_t>(v.as_dict().entries.size());
    default:
      break;
  }
  fail("object of type '" + type_name(v) + "' has no len()");
}

/// Python's float(str): surrounding whitespace allowed, nothing else after the number.
std::optional<double> parse_float(const std::string& s) {
  std::string t = strip(s, undefined_t{}, true, true);
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

std::optional<int64_t> parse_int(const std::string& s, int base) {
  std::string t = strip(s, undefined_t{}, true, true);
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  if (t.empty() || base < 2 || base > 36) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(t.c_str(), &end, base);
  if (errno == ERANGE || end != t.c_str() + t.size()) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<int64_t> float_to_int(double d) {
  if (!std::isfinite(d) || d >= 9.2233720368547758e18 || d < -9.2233720368547758e18)
    return std::nullopt;
  return static_cast<int64_t>(std::trunc(d));
}

value to_int(const value& v, const value& fallback, int base) {
  if (v.is_integral()) return v.as_int();
  if (v.is(value::kind::floating)) {
    if (auto i = float_to_int(v.as_double())) return *i;
    return fallback;
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), base)) return *i;
    if (auto d = parse_float(v.as_string()))
      if (auto i = float_to_int(*d)) return *i;
  }
  return fallback;
}

value to_float(const value& v, const value& fallback) {
  if (v.is_number()) return v.as_double();
  if (v.is_string())
    if (auto d = parse_float(v.as_string())) return *d;
  return fallback;
}

/// Jinja's title filter: a word starts after a space, '-', '(', '{', '[' or '<'.
std::string title_filter(const std::string& s) {
  std::string out;
  bool start = true;
  for (auto ch : utf8_chars(s)) {
    size_t k = 0;
    uint32_t cp = utf8_next(ch, k);
    out += start ? to_upper(ch) : to_lower(ch);
    start = is_python_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
  }
  return out;
}

std::string indent(const std::string& s, const value& width, bool first, bool blank) {
  std::string pad =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(width, "indent width"))),
                        ' ');
  // Python's splitlines() of s + "\n", as Jinja does it.
  std::vector<std::string> lines;
  std::string cur;
  std::string text = s + "\n";
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= '\x1c' && c <= '\x1e')) {
      lines.push_back(cur);
      cur.clear();
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      cur += c;
    }
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    bool skip = (i == 0 && !first) || (lines[i].empty() && !blank);
    if (!skip) out += pad;
    out += lines[i];
  }
  return out;
}

/// The key for sort and unique: the attribute, lower-cased when it is a string and case
/// does not count.
value sort_key(const value& item, const value& attribute, bool case_sensitive) {
  value k = attribute.is_undefined() || attribute.is_none()
                ? item
                : attribute_path(item, to_str(attribute));
  if (!case_sensitive && k.is_string()) return to_lower(k.as_string());
  return k;
}

value filter_by_test(const std::vector<value>& items, const call_args& args, size_t first_arg,
                     bool by_attribute, bool keep) {
  std::string attr = by_attribute ? to_str(args.get(0, "")) : "";
  std::string test;
  call_args rest;
  if (args.positional.size() > first_arg) {
    test = to_str(args.positional[first_arg]);
    rest.positional.assign(args.positional.begin() + static_cast<long>(first_arg) + 1,
                           args.positional.end());
    if (!is_test(test)) fail("test '" + test + "' is not supported");
  }
  std::vector<value> out;
  for (auto& item : items) {
    value v = by_attribute ? attribute_path(item, attr) : item;
    bool pass = test.empty() ? truthy(v) : apply_test(test, v, rest);
    if (pass == keep) out.push_back(item);
  }
  return value::make_list(std::move(out), seq::generator);
}

json_options json_args(const call_args& args) {
  args.check("tojson", 0, {"indent", "ensure_ascii", "sort_keys", "separators"});
  json_options o;
  value ind = args.get(SIZE_MAX, "indent");
  if (!ind.is_undefined() && !ind.is_none())
    o.indent = static_cast<int>(std::clamp<int64_t>(int_arg(ind, "tojson indent"), -1, 64));
  o.ensure_ascii = bool_arg(args.get(SIZE_MAX, "ensure_ascii", false));
  o.sort_keys = bool_arg(args.get(SIZE_MAX, "sort_keys", false));
  value sep = args.get(SIZE_MAX, "separators");
  if (sep.is(value::kind::list)) {
    auto& items = sep.as_list().items;
    if (items.size() != 2 || !items[0].is_string() || !items[1].is_string())
      fail("tojson separators must be two strings");
    o.separators = std::make_pair(items[0].as_string(), items[1].as_string());
  }
  return o;
}

}  // namespace

value call_args::get(size_t index, std::string_view name, value fallback) const {
  if (index < positional.size()) return positional[index];
  for (auto& [k, v] : keyword)
    if (k == name) return v;
  return fallback;
}

void call_args::check(std::string_view what, size_t max_positional,
                      std::initializer_list<std::string_view> names) const {
  if (positional.size() > max_positional)
    fail(std::string{what} + "() takes at most " + std::to_string(max_positional) +
         " positional argument(s), got " + std::to_string(positional.size()));
  for (auto& [k, v] : keyword)
    if (std::find(names.begin(), names.end(), k) == names.end())
      fail(std::string{what} + "() got an unexpected keyword argument '" + k + "'");
}

bool is_filter(std::string_view name) {
  return known(filter_names, name);
}
bool is_test(std::string_view name) {
  return known(test_names, name);
}

std::vector<value> iterate(const value& v) {
  switch (v.type()) {
    case value::kind::undefined:
      return {};
    case value::kind::list:
      return v.as_list().items;
    case value::kind::dict: {
      std::vector<value> keys;
      for (auto& [k, val] : v.as_dict().entries) keys.emplace_back(k);
      return keys;
    }
    case value::kind::string: {
      std::vector<value> chars;
      for (auto c : utf8_chars(v.as_string())) chars.emplace_back(std::string{c});
      return chars;
    }
    default:
      fail("'" + type_name(v) + "' object is not iterable");
  }
}

bool contains(const value& container, const value& item) {
  switch (container.type()) {
    case value::kind::undefined:
      return false;
    case value::kind::string:
      if (!item.is_string())
        fail("'in <string>' requires string as left operand, not " + type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case value::kind::list:
      for (auto& v : container.as_list().items)
        if (equals(v, item)) return true;
      return false;
    case value::kind::dict:
      if (item.is(value::kind::list) || item.is(value::kind::dict))
        fail("unhashable type: '" + type_name(item) + "'");
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      fail("argument of type '" + type_name(container) + "' is not iterable");
  }
}

value get_item(const value& obj, const value& key) {
  auto missing = [&] {
    return undefined_t{"'" + type_name(obj) + " object' has no attribute " + repr(key)};
  };
  switch (obj.type()) {
    case value::kind::undefined:
      fail_undefined(obj);
    case value::kind::dict:
      if (key.is_string())
        if (auto* v = obj.as_dict().find(key.as_string())) return *v;
      return missing();
    case value::kind::ns:
      if (key.is_string())
        if (auto* v = obj.as_namespace().attrs.find(key.as_string())) return *v;
      return missing();
    case value::kind::list:
    case value::kind::string: {
      if (!key.is_integral() || (obj.is(value::kind::list) && !obj.as_list().indexable()))
        return missing();
      auto no_element = [&] {
        return undefined_t{type_name(obj) + " object has no element " +
                           std::to_string(key.as_int())};
      };
      int64_t i = key.as_int();
      if (obj.is_string()) {
        auto chars = utf8_chars(obj.as_string());
        auto n = static_cast<int64_t>(chars.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return no_element();
        return std::string{chars[static_cast<size_t>(i)]};
      }
      auto& items = obj.as_list().items;
      auto n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return no_element();
      return items[static_cast<size_t>(i)];
    }
    default:
      return missing();
  }
}

value get_attr(const value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is(value::kind::dict) || obj.is(value::kind::ns)) {
    const value* v =
        obj.is(value::kind::dict) ? obj.as_dict().find(name) : obj.as_namespace().attrs.find(name);
    if (v) return *v;
  }
  return undefined_t{"'" + type_name(obj) + " object' has no attribute '" + name + "'"};
}

value apply_filter(std::string_view name, const value& v, const call_args& args) {
  auto items = [&] { return iterate(v); };
  if (name == "default" || name == "d") {
    args.check(name, 2, {"default_value", "boolean"});
    bool boolean = bool_arg(args.get(1, "boolean", false));
    if (v.is_undefined() || (boolean && !truthy(v))) return args.get(0, "default_value", "");
    return v;
  }
  if (name == "tojson") return to_json_text(v, json_args(args));
  if (name == "map") {
    std::vector<value> out;
    value attribute = args.get(SIZE_MAX, "attribute");
    if (!attribute.is_undefined()) {
      args.check("map", 0, {"attribute", "default"});
      value fallback = args.get(SIZE_MAX, "default");
      for (auto& item : items()) {
        value a = attribute_path(item, to_str(attribute));
        out.push_back(a.is_undefined() && !fallback.is_undefined() ? fallback : a);
      }
    } else {
      if (args.positional.empty()) fail("map() needs a filter name or attribute=");
      std::string filter = to_str(args.positional[0]);
      if (!is_filter(filter)) fail("filter '" + filter + "' is not supported");
      call_args rest{std::vector<value>(args.positional.begin() + 1, args.positional.end()),
                     args.keyword};
      for (auto& item : items()) out.push_back(apply_filter(filter, item, rest));
    }
    return value::make_list(std::move(out), seq::generator);
  }
  if (name == "select" || name == "reject")
    return filter_by_test(items(), args, 0, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return filter_by_test(items(), args, 1, true, name == "selectattr");
  if (name == "length" || name == "count") return length(v);
  if (name == "list") return value::make_list(items());
  if (name == "first" || name == "last") {
    if (name == "last" && v.is(value::kind::list) && v.as_list().flavor == seq::generator)
      fail("'generator' object is not reversible");
    auto all = items();
    if (all.empty()) return undefined_t{"No " + std::string{name} + " item, sequence was empty."};
    return name == "first" ? all.front() : all.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto chars = utf8_chars(v.as_string());
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
      return out;
    }
    auto all = items();
    std::reverse(all.begin(), all.end());
    return value::make_list(std::move(all), seq::generator);
  }
  if (name == "join") {
    args.check("join", 2, {"d", "attribute"});
    std::string sep = to_str(args.get(0, "d", "")), out;
    value attribute = args.get(1, "attribute");
    bool first = true;
    for (auto& item : items()) {
      if (!first) out += sep;
      first = false;
      out += to_str(attribute.is_undefined() ? item : attribute_path(item, to_str(attribute)));
    }
    return out;
  }
  if (name == "items") {
    if (v.is_undefined()) return value::make_list({}, seq::generator);
    if (!v.is(value::kind::dict)) fail("Can only get item pairs from a mapping.");
    std::vector<value> out;
    for (auto& [k, val] : v.as_dict().entries)
      out.push_back(value::make_list({k, val}, seq::tuple));
    return value::make_list(std::move(out), seq::generator);
  }
  if (name == "sort" || name == "unique") {
    bool sort = name == "sort";
    if (sort)
      args.check("sort", 3, {"reverse", "case_sensitive", "attribute"});
    else
      args.check("unique", 2, {"case_sensitive", "attribute"});
    bool reverse = sort && bool_arg(args.get(0, "reverse", false));
    bool case_sensitive = bool_arg(args.get(sort ? 1 : 0, "case_sensitive", false));
    value attribute = args.get(sort ? 2 : 1, "attribute");
    auto all = items();
    std::vector<value> out;
    if (sort) {
      out = all;
      std::stable_sort(out.begin(), out.end(), [&](const value& a, const value& b) {
        int c =
            compare(sort_key(a, attribute, case_sensitive), sort_key(b, attribute, case_sensitive));
        return reverse ? c > 0 : c < 0;
      });
    } else {
      std::vector<value> seen;
      for (auto& item : all) {
        value k = sort_key(item, attribute, case_sensitive);
        if (std::none_of(seen.begin(), seen.end(), [&](const value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
    }
    return value::make_list(std::move(out), sort ? seq::list : seq::generator);
  }
  if (name == "abs") {
    if (v.is(value::kind::floating)) return std::fabs(v.as_double());
    if (!v.is_integral()) fail("bad operand type for abs(): '" + type_name(v) + "'");
    if (v.as_int() == std::numeric_limits<int64_t>::min()) fail("integer overflow");
    return v.as_int() < 0 ? -v.as_int() : v.as_int();
  }
  if ((name == "int" || name == "float") && v.is_undefined()) fail_undefined(v);
  if (name == "int") {
    args.check("int", 2, {"default", "base"});
    return to_int(v, args.get(0, "default", 0),
                  static_cast<int>(int_arg(args.get(1, "base", 10), "base")));
  }
  if (name == "float") {
    args.check("float", 1, {"default"});
    return to_float(v, args.get(0, "default", 0.0));
  }
  // The rest work on the text of the value, as Jinja's soft_str gives it.
  std::string s = to_str(v);
  if (name == "string" || name == "safe") return s;
  if (name == "upper") return to_upper(s);
  if (name == "lower") return to_lower(s);
  if (name == "capitalize") return capitalize(s);
  if (name == "title") return title_filter(s);
  if (name == "trim") {
    args.check("trim", 1, {"chars"});
    return strip(s, args.get(0, "chars"), true, true);
  }
  if (name == "replace") {
    call_args a{args.positional, {}};
    if (auto c = args.get(2, "count"); !c.is_undefined() && a.positional.size() < 3)
      a.positional.push_back(c);
    return call_method(s, "replace", a);
  }
  if (name == "indent") {
    // Jinja's indent appends to its operand: anything but text fails there.
    if (!v.is_string())
      fail("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
    args.check("indent", 3, {"width", "first", "blank"});
    return indent(s, args.get(0, "width", 4), bool_arg(args.get(1, "first", false)),
                  bool_arg(args.get(2, "blank", false)));
  }
  fail("filter '" + std::string{name} + "' is not supported");
}

bool apply_test(std::string_view name, const value& v, const call_args& args) {
  using k = value::kind;
  auto arg = [&] {
    if (args.positional.empty()) fail("test '" + std::string{name} + "' needs an argument");
    return args.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is(k::boolean);
  if (name == "true") return v.is(k::boolean) && v.as_bool();
  if (name == "false") return v.is(k::boolean) && !v.as_bool();
  if (name == "integer") return v.is(k::integer);
  if (name == "float") return v.is(k::floating);
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is(k::dict);
  // Jinja's undefined has __call__ (which fails): callable() is true of it.
  if (name == "callable") return v.is(k::callable) || v.is_undefined();
  // Jinja's undefined iterates as empty and has a length: it counts as both.
  if (name == "iterable")
    return v.is(k::list) || v.is(k::dict) || v.is_string() || v.is_undefined();
  if (name == "sequence")  // has len() and [] (generators and dict views do not)
    return (v.is(k::list) && v.as_list().indexable()) || v.is(k::dict) || v.is_string() ||
           v.is_undefined();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.is_undefined()) fail_undefined(v);
    int64_t by = name == "divisibleby" ? int_arg(arg(), "divisibleby") : 2;
    if (by == 0) fail("integer division or modulo by zero");
    int64_t r = int_arg(v, "operand") % by;
    return name == "odd" ? r != 0 : r == 0;
  }
  if (name == "lower" || name == "upper") {
    std::string s = to_str(v);
    return name == "lower" ? to_lower(s) == s && to_upper(s) != s
                           : to_upper(s) == s && to_lower(s) != s;
  }
  if (name == "in") return contains(arg(), v);
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg());
  if (name == "ne" || name == "!=") return !equals(v, arg());
  if (v.is_undefined()) fail_undefined(v);
  int c = compare(v, arg());
  if (name == "lt" || name == "<") return c < 0;
  if (name == "le" || name == "<=") return c <= 0;
  if (name == "gt" || name == ">") return c > 0;
  if (name == "ge" || name == ">=") return c >= 0;
  fail("test '" + std::string{name} + "' is not supported");
}

}  // namespace computron::text::jinja
