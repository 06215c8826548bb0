#include "text/jinja/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "text/jinja/interpreter.hpp"

namespace computron::text::jinja {

void fail(std::string message) {
  throw template_error{ec::invalid_request, std::move(message), 0};
}

namespace {
thread_local size_t work_left = std::numeric_limits<size_t>::max();
}

void charge_work(size_t units) {
  if (work_left < units) fail("the template does too much work");
  work_left -= units;
}

work_budget::work_budget(size_t units) : saved_(work_left) {
  work_left = units;
}
work_budget::~work_budget() {
  work_left = saved_;
}

const value* dict_data::find(std::string_view key) const {
  for (auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void dict_data::set(std::string key, value v) {
  for (auto& [k, old] : entries) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(v));
}

int64_t value::as_int() const {
  if (is(kind::boolean)) return as_bool() ? 1 : 0;
  return std::get<int64_t>(v_);
}

double value::as_double() const {
  if (is(kind::floating)) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

value value::make_list(std::vector<value> items, seq flavor) {
  auto l = std::make_shared<list_data>();
  l->items = std::move(items);
  l->flavor = flavor;
  return value{list_ptr{std::move(l)}};
}

value value::make_dict(dict_data d) {
  return value{dict_ptr{std::make_shared<dict_data>(std::move(d))}};
}

namespace {

template <class Json>
value convert(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return none_t{};
    case nlohmann::json::value_t::boolean:
      return j.template get<bool>();
    case nlohmann::json::value_t::number_integer:
      return j.template get<int64_t>();
    case nlohmann::json::value_t::number_unsigned: {
      auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return static_cast<int64_t>(u);
      return static_cast<double>(u);
    }
    case nlohmann::json::value_t::number_float:
      return j.template get<double>();
    case nlohmann::json::value_t::string:
      return j.template get<std::string>();
    case nlohmann::json::value_t::array: {
      std::vector<value> items;
      items.reserve(j.size());
      for (auto& e : j) items.push_back(convert(e));
      return value::make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      dict_data d;
      d.entries.reserve(j.size());
      // Keys of a JSON object are unique already: append without searching.
      for (auto it = j.begin(); it != j.end(); ++it) d.entries.emplace_back(it.key(), convert(*it));
      return value::make_dict(std::move(d));
    }
    default:
      return undefined_t{};
  }
}

void append_hex(std::string& out, uint32_t cp, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%0*x", digits, cp);
  out += buf;
}

/// Python's str.isprintable() for a non-ASCII code point, approximately: separators,
/// controls, format characters, surrogates and private use are not printable.
bool printable(uint32_t cp) {
  return !((cp >= 0x80 && cp <= 0xA0) || cp == 0xAD || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
           (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || (cp >= 0xD800 && cp <= 0xF8FF) ||
           cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB) || (cp >= 0xE0000 && cp <= 0xE007F) ||
           cp >= 0xF0000);
}

/// Bounds one walk over a value (printing, JSON, comparing): values can nest as deep as a
/// loop runs and share sublists, so that their printed form grows exponentially. Every
/// node visited is charged to the render's work budget.
struct walk {
  static constexpr int max_depth = 256;
  static constexpr size_t max_text = size_t{64} << 20;

  void step(int depth, const std::string* out = nullptr) {
    if (depth > max_depth) fail("value nested too deeply");
    if (out && out->size() > max_text) fail("value too large to print");
    charge_work();
  }
};

std::string string_repr(const std::string& s) {
  char quote = '\'';
  if (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) quote = '"';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = utf8_next(s, i);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += "\\x";
      append_hex(out, cp, 2);
    } else if (cp < 0x7F || printable(cp)) {
      append_utf8(out, cp);
    } else if (cp <= 0xFF) {
      out += "\\x";
      append_hex(out, cp, 2);
    } else if (cp <= 0xFFFF) {
      out += "\\u";
      append_hex(out, cp, 4);
    } else {
      out += "\\U";
      append_hex(out, cp, 8);
    }
  }
  out += quote;
  return out;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t cp = utf8_next(s, i);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp > 0xFFFF) {
        uint32_t v = cp - 0x10000;
        out += "\\u";
        append_hex(out, 0xD800 + (v >> 10), 4);
        out += "\\u";
        append_hex(out, 0xDC00 + (v & 0x3FF), 4);
      } else {
        out += "\\u";
        append_hex(out, cp, 4);
      }
    } else {
      out.append(s, start, i - start);
    }
  }
  out += '"';
}

void json_dump(std::string& out, const value& v, const json_options& o, int depth, walk& w) {
  using k = value::kind;
  w.step(depth, &out);
  const std::string item_sep = o.separators ? o.separators->first : (o.indent ? "," : ", ");
  const std::string key_sep = o.separators ? o.separators->second : ": ";
  auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<size_t>(std::max(0, *o.indent)) * static_cast<size_t>(level), ' ');
  };
  switch (v.type()) {
    case k::undefined:
      fail("Object of type Undefined is not JSON serializable");
    case k::none:
      out += "null";
      return;
    case k::boolean:
      out += v.as_bool() ? "true" : "false";
      return;
    case k::integer:
      out += std::to_string(v.as_int());
      return;
    case k::floating: {
      double d = v.as_double();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : float_repr(d);
      return;
    }
    case k::string:
      json_string(out, v.as_string(), o.ensure_ascii);
      return;
    case k::list: {
      if (!v.as_list().indexable())
        fail("Object of type " + type_name(v) + " is not JSON serializable");
      auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (o.indent) newline(depth + 1);
        json_dump(out, items[i], o, depth + 1, w);
      }
      if (o.indent) newline(depth);
      out += ']';
      return;
    }
    case k::dict: {
      std::vector<const std::pair<std::string, value>*> entries;
      for (auto& e : v.as_dict().entries) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (o.indent) newline(depth + 1);
        json_string(out, entries[i]->first, o.ensure_ascii);
        out += key_sep;
        json_dump(out, entries[i]->second, o, depth + 1, w);
      }
      if (o.indent) newline(depth);
      out += '}';
      return;
    }
    case k::ns:
    case k::callable:
      fail("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

value from_json(const nlohmann::json& j) {
  return convert(j);
}
value from_json(const nlohmann::ordered_json& j) {
  return convert(j);
}

bool truthy(const value& v) {
  using k = value::kind;
  switch (v.type()) {
    case k::undefined:
    case k::none:
      return false;
    case k::boolean:
      return v.as_bool();
    case k::integer:
      return v.as_int() != 0;
    case k::floating:
      return v.as_double() != 0.0;
    case k::string:
      return !v.as_string().empty();
    case k::list:
      return v.as_list().flavor == seq::generator || !v.as_list().items.empty();
    case k::dict:
      return !v.as_dict().entries.empty();
    case k::ns:
    case k::callable:
      return true;
  }
  return false;
}

namespace {

bool equals_in(const value& a, const value& b, walk& w, int depth) {
  using k = value::kind;
  w.step(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case k::undefined:
    case k::none:
      return true;
    case k::string:
      return a.as_string() == b.as_string();
    case k::list: {
      auto &x = a.as_list(), &y = b.as_list();
      if (x.flavor != y.flavor || x.items.size() != y.items.size()) return false;
      // Generators and dict_values compare by identity; keys and items views as sets.
      if (x.flavor == seq::generator || x.flavor == seq::dict_values) return &x == &y;
      for (size_t i = 0; i < x.items.size(); ++i) {
        auto same = [&](const value& o) { return equals_in(x.items[i], o, w, depth + 1); };
        if (x.indexable() ? !same(y.items[i]) : std::none_of(y.items.begin(), y.items.end(), same))
          return false;
      }
      return true;
    }
    case k::dict: {
      auto &x = a.as_dict(), &y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (auto& [key, val] : x.entries) {
        auto* other = y.find(key);
        if (!other || !equals_in(val, *other, w, depth + 1)) return false;
      }
      return true;
    }
    case k::ns:
      return &a.as_namespace() == &b.as_namespace();
    case k::callable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

int compare_in(const value& a, const value& b, walk& w, int depth) {
  w.step(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral())
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is(value::kind::list) && b.is(value::kind::list) && a.as_list().indexable() &&
      a.as_list().flavor == b.as_list().flavor) {
    auto &x = a.as_list().items, &y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals_in(x[i], y[i], w, depth + 1)) return compare_in(x[i], y[i], w, depth + 1);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("cannot compare '" + type_name(a) + "' with '" + type_name(b) + "'");
}

}  // namespace

bool equals(const value& a, const value& b) {
  walk w;
  return equals_in(a, b, w, 0);
}

int compare(const value& a, const value& b) {
  walk w;
  return compare_in(a, b, w, 0);
}

std::string type_name(const value& v) {
  using k = value::kind;
  switch (v.type()) {
    case k::undefined:
      return "Undefined";
    case k::none:
      return "NoneType";
    case k::boolean:
      return "bool";
    case k::integer:
      return "int";
    case k::floating:
      return "float";
    case k::string:
      return "str";
    case k::list:
      switch (v.as_list().flavor) {
        case seq::list:
          return "list";
        case seq::tuple:
          return "tuple";
        case seq::generator:
          return "generator";
        case seq::dict_items:
          return "dict_items";
        case seq::dict_keys:
          return "dict_keys";
        case seq::dict_values:
          return "dict_values";
      }
      return "list";
    case k::dict:
      return "dict";
    case k::ns:
      return "Namespace";
    case k::callable:
      return "function";
  }
  return "object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that read back as `d`, placed as Python's repr places them:
  // positional for exponents -4..15, scientific with a two-digit exponent otherwise.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  auto e_at = sci.find('e');
  int exp = std::stoi(sci.substr(e_at + 1));
  std::string digits = sci.substr(0, e_at);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  auto int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len)
    return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

void repr_into(std::string& out, const value& v, walk& w, int depth) {
  using k = value::kind;
  w.step(depth, &out);
  switch (v.type()) {
    case k::undefined:
      out += "Undefined";
      return;
    case k::string:
      out += string_repr(v.as_string());
      return;
    case k::list: {
      auto& l = v.as_list();
      if (l.flavor == seq::generator) {
        out += "<generator object>";
        return;
      }
      bool tuple = l.flavor == seq::tuple;
      if (!l.indexable()) out += type_name(v) + "(";
      out += tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        repr_into(out, l.items[i], w, depth + 1);
      }
      if (tuple && l.items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
      if (!l.indexable()) out += ")";
      return;
    }
    case k::dict:
    case k::ns: {
      // A namespace prints as Jinja's does: <Namespace {...}>.
      auto& entries = v.is(k::ns) ? v.as_namespace().attrs.entries : v.as_dict().entries;
      out += v.is(k::ns) ? "<Namespace {" : "{";
      bool first = true;
      for (auto& [key, val] : entries) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(key) + ": ";
        repr_into(out, val, w, depth + 1);
      }
      out += v.is(k::ns) ? "}>" : "}";
      return;
    }
    case k::callable:
      out += "<function '" + v.as_callable().name + "'>";
      return;
    default:
      out += to_str(v);
  }
}

}  // namespace

std::string repr(const value& v) {
  std::string out;
  walk w;
  repr_into(out, v, w, 0);
  return out;
}

std::string to_str(const value& v) {
  using k = value::kind;
  switch (v.type()) {
    case k::undefined:
      return "";
    case k::none:
      return "None";
    case k::boolean:
      return v.as_bool() ? "True" : "False";
    case k::integer:
      return std::to_string(v.as_int());
    case k::floating:
      return float_repr(v.as_double());
    case k::string:
      return v.as_string();
    default:
      return repr(v);
  }
}

std::string to_json_text(const value& v, const json_options& options) {
  std::string out;
  walk w;
  json_dump(out, v, options, 0, w);
  return out;
}

}  // namespace computron::text::jinja
