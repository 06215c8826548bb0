#include <algorithm>

#include <locale.h>
#include <wctype.h>

#include "text/jinja/builtins.hpp"

/// The methods of str, dict and list that chat templates call, with Python's semantics.
namespace computron::text::jinja {

namespace {

const std::string_view method_names[] = {"capitalize", "count",  "endswith", "find",  "get",
                                         "items",      "join",   "keys",     "lower", "lstrip",
                                         "replace",    "rsplit", "rstrip",   "split", "startswith",
                                         "strip",      "title",  "upper",    "values"};

/// Code points with their byte offsets, for the methods that count in characters.
struct decoded {
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;  // one more than cps: the end
  explicit decoded(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
      offsets.push_back(i);
      cps.push_back(utf8_next(s, i));
    }
    offsets.push_back(s.size());
  }
};

bool is_letter(uint32_t cp) {
  static locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return utf8 && iswalpha_l(static_cast<wint_t>(cp), utf8);
}

/// Python's str.title(): a letter after a non-letter goes upper, other letters lower.
std::string py_title(std::string_view s) {
  std::string out;
  bool prev_letter = false;
  for (auto ch : utf8_chars(s)) {
    size_t k = 0;
    uint32_t cp = utf8_next(ch, k);
    bool letter = is_letter(cp);
    out += letter ? (prev_letter ? to_lower(ch) : to_upper(ch)) : std::string{ch};
    prev_letter = letter;
  }
  return out;
}

/// Python's str.split / str.rsplit.
std::vector<value> split(const std::string& s, const value& sep_value, int64_t maxsplit,
                         bool from_right) {
  std::vector<std::string> parts;
  if (sep_value.is_undefined() || sep_value.is_none()) {
    // Runs of whitespace separate; none at the ends yields empty strings.
    decoded d(s);
    auto n = static_cast<int64_t>(d.cps.size());
    auto space = [&](int64_t k) { return is_python_space(d.cps[static_cast<size_t>(k)]); };
    auto at = [&](int64_t k) { return d.offsets[static_cast<size_t>(k)]; };
    if (!from_right) {
      int64_t i = 0;
      while (true) {
        while (i < n && space(i)) ++i;
        if (i >= n) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(s.substr(at(i)));
          break;
        }
        int64_t j = i;
        while (j < n && !space(j)) ++j;
        parts.push_back(s.substr(at(i), at(j) - at(i)));
        i = j;
      }
    } else {
      int64_t i = n;
      while (true) {
        while (i > 0 && space(i - 1)) --i;
        if (i <= 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(s.substr(0, at(i)));
          break;
        }
        int64_t j = i;
        while (j > 0 && !space(j - 1)) --j;
        parts.push_back(s.substr(at(j), at(i) - at(j)));
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    if (!sep_value.is_string()) fail("must be str or None, not " + type_name(sep_value));
    const std::string& sep = sep_value.as_string();
    if (sep.empty()) fail("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (true) {
        size_t at = s.find(sep, start);
        if (at == std::string::npos ||
            (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.push_back(s.substr(start));
          break;
        }
        parts.push_back(s.substr(start, at - start));
        start = at + sep.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        size_t at = end >= sep.size() ? s.rfind(sep, end - sep.size()) : std::string::npos;
        if (at == std::string::npos ||
            (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.push_back(s.substr(0, end));
          break;
        }
        parts.push_back(s.substr(at + sep.size(), end - at - sep.size()));
        end = at;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<value> out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

/// Python's str.replace; an empty `old` inserts `repl` around every character.
std::string replace(const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    auto chars = utf8_chars(s);
    for (size_t i = 0; i <= chars.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < chars.size()) out += chars[i];
    }
    return out;
  }
  size_t start = 0;
  while (true) {
    size_t at = count >= 0 && done >= count ? std::string::npos : s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += repl;
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

bool affix(const std::string& s, const value& what, bool prefix) {
  auto one = [&](const value& v) {
    if (!v.is_string()) fail("startswith/endswith first arg must be str or a tuple of str");
    const std::string& a = v.as_string();
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (what.is(value::kind::list)) {
    for (auto& v : what.as_list().items)
      if (one(v)) return true;
    return false;
  }
  return one(what);
}

int64_t count_in(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_chars(s).size()) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

value string_method(const std::string& s, std::string_view name, const call_args& args) {
  auto arg = [&](size_t i, std::string_view key, value fallback = undefined_t{}) {
    return args.get(i, key, std::move(fallback));
  };
  auto str_arg = [&](size_t i, std::string_view key) {
    value v = arg(i, key);
    if (!v.is_string()) fail(std::string{name} + "() argument must be str, not " + type_name(v));
    return v.as_string();
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return strip(s, arg(0, "chars"), name != "rstrip", name != "lstrip");
  if (name == "split" || name == "rsplit") {
    value maxsplit = arg(1, "maxsplit", -1);
    if (!maxsplit.is_integral()) fail("maxsplit must be an integer");
    return value::make_list(split(s, arg(0, "sep"), maxsplit.as_int(), name == "rsplit"));
  }
  if (name == "startswith" || name == "endswith") {
    if (args.positional.size() != 1) fail(std::string{name} + "() takes exactly one argument here");
    return affix(s, args.positional[0], name == "startswith");
  }
  if (name == "replace") {
    value count = arg(2, "count", -1);
    if (!count.is_integral()) fail("replace() count must be an integer");
    return replace(s, str_arg(0, "old"), str_arg(1, "new"), count.as_int());
  }
  if (name == "upper") return to_upper(s);
  if (name == "lower") return to_lower(s);
  if (name == "title") return py_title(s);
  if (name == "capitalize") return capitalize(s);
  if (name == "count") return count_in(s, str_arg(0, "sub"));
  if (name == "find") {
    size_t at = s.find(str_arg(0, "sub"));
    if (at == std::string::npos) return -1;
    return static_cast<int64_t>(utf8_chars(std::string_view{s}.substr(0, at)).size());
  }
  if (name == "join") {
    std::string out;
    auto items = iterate(arg(0, "iterable"));
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string())
        fail("sequence item " + std::to_string(i) + ": expected str instance, " +
             type_name(items[i]) + " found");
      if (i) out += s;
      out += items[i].as_string();
    }
    return out;
  }
  fail("'str' object has no attribute '" + std::string{name} + "'");
}

}  // namespace

bool is_method(std::string_view name) {
  return std::find(std::begin(method_names), std::end(method_names), name) !=
         std::end(method_names);
}

std::string strip(std::string_view s, const value& chars, bool left, bool right) {
  std::vector<uint32_t> set;
  bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) {
    if (!chars.is_string()) fail("strip arg must be None or str, not " + type_name(chars));
    decoded c(chars.as_string());
    set = c.cps;
  }
  auto drop = [&](uint32_t cp) {
    return whitespace ? is_python_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  decoded d(s);
  size_t b = 0, e = d.cps.size();
  if (left)
    while (b < e && drop(d.cps[b])) ++b;
  if (right)
    while (e > b && drop(d.cps[e - 1])) --e;
  return std::string{s.substr(d.offsets[b], d.offsets[e] - d.offsets[b])};
}

std::string capitalize(std::string_view s) {
  auto chars = utf8_chars(s);
  if (chars.empty()) return "";
  return to_upper(chars[0]) + to_lower(s.substr(chars[0].size()));
}

value call_method(const value& receiver, std::string_view name, const call_args& args) {
  if (receiver.is_string()) return string_method(receiver.as_string(), name, args);
  if (receiver.is(value::kind::dict)) {
    auto& d = receiver.as_dict();
    if (name == "items" || name == "keys" || name == "values") {
      std::vector<value> out;
      for (auto& [k, v] : d.entries)
        out.push_back(name == "keys"     ? value{k}
                      : name == "values" ? v
                                         : value::make_list({k, v}, seq::tuple));
      return value::make_list(std::move(out), name == "items"  ? seq::dict_items
                                              : name == "keys" ? seq::dict_keys
                                                               : seq::dict_values);
    }
    if (name == "get") {
      value key = args.get(0, "key");
      if (key.is_string())
        if (auto* v = d.find(key.as_string())) return *v;
      return args.get(1, "default", none_t{});
    }
  }
  if (receiver.is(value::kind::list) && receiver.as_list().indexable() && name == "count") {
    int64_t n = 0;
    value x = args.get(0, "value");
    for (auto& v : receiver.as_list().items) n += equals(v, x) ? 1 : 0;
    return n;
  }
  fail("'" + type_name(receiver) + "' object has no attribute '" + std::string{name} + "'");
}

}  // namespace computron::text::jinja
