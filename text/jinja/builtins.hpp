#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/value.hpp"

/// Jinja's filters, tests, methods and globals that chat templates use. The parser asks
/// which names exist (a template naming any other is refused); the interpreter applies them.
namespace computron::text::jinja {

/// Evaluated arguments of a call: positional, then keyword.
struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keyword;

  /// Argument `index` or keyword `name`; `fallback` when given as neither.
  value get(size_t index, std::string_view name, value fallback = undefined_t{}) const;
  /// Fails when more than `max_positional` positional arguments or a keyword outside
  /// `names` came (`what` names the filter or function).
  void check(std::string_view what, size_t max_positional,
             std::initializer_list<std::string_view> names) const;
};

/// Whether the filter (`x | name`) is implemented; the parser refuses any other.
bool is_filter(std::string_view name);
/// Whether the test (`x is name`) is implemented; the parser refuses any other.
bool is_test(std::string_view name);
/// Whether the method is implemented: methods of str, dict and list (`'a'.upper()`, `d.items()`).
bool is_method(std::string_view name);

/// `operand | name(args)`.
value apply_filter(std::string_view name, const value& operand, const call_args& args);
/// `operand is name(args)`.
bool apply_test(std::string_view name, const value& operand, const call_args& args);
/// `receiver.name(args)`.
value call_method(const value& receiver, std::string_view name, const call_args& args);
/// Python's iteration: list items, dict keys, string characters; undefined is empty.
std::vector<value> iterate(const value& v);
/// Python's `item in container`.
bool contains(const value& container, const value& item);
/// Jinja's `obj[key]`: a missing key or index is undefined; on undefined it fails.
value get_item(const value& obj, const value& key);
/// Jinja's `obj.name`: a dict's key or a namespace's attribute, else undefined.
value get_attr(const value& obj, const std::string& name);
/// Python's str.strip/lstrip/rstrip: `chars` none or undefined strips whitespace.
std::string strip(std::string_view s, const value& chars, bool left, bool right);
/// Python's str.upper() with the first character's case changed: capitalize().
std::string capitalize(std::string_view s);

}  // namespace computron::text::jinja
