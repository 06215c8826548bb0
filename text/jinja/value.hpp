#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error_code.hpp"
#include "text/jinja/text.hpp"

/// The values a chat template computes with, and their Python semantics (truthiness,
/// equality, str() and repr(), json.dumps), so that output matches what Hugging Face's
/// Python renderer prints. Internal to text/chat_template.
namespace computron::text::jinja {

/// A failure while parsing or rendering; caught at the chat_template boundary and turned
/// into a caf::error. `line` 0 means "not known yet": the evaluator fills in the line of the
/// expression it was evaluating when the error passes through it.
struct template_error {
  ec code;
  std::string message;
  int line = 0;
};

/// Throws a render-time type error (ec::invalid_request) without a line.
[[noreturn]] void fail(std::string message);

/// Charges `units` of work (a statement, an expression, a value visited while printing or
/// comparing) to the render running on this thread; fails once its budget is spent, so that
/// no template loops or prints for ever. Without a budget in place nothing is counted.
void charge_work(size_t units = 1);

/// Puts a work budget in place on this thread for its lifetime (one render).
class work_budget {
 public:
  explicit work_budget(size_t units);
  ~work_budget();
  work_budget(const work_budget&) = delete;
  work_budget& operator=(const work_budget&) = delete;

 private:
  size_t saved_;
};

struct callable;
struct namespace_object;
class value;

/// Which Python sequence a list_data stands for. Jinja's select, map, unique, items and
/// reverse filters give generators (always true, no len(), printed as an object) and
/// dict.items()/keys()/values() views: templates see those differences, so we keep them.
enum class seq : uint8_t { list, tuple, generator, dict_items, dict_keys, dict_values };

/// A Python list, tuple, generator or dict view; immutable once built (the sandbox forbids
/// mutation).
struct list_data {
  std::vector<value> items;
  seq flavor = seq::list;
  /// A list or a tuple: indexable, sliceable, with a length and a JSON form.
  bool indexable() const { return flavor == seq::list || flavor == seq::tuple; }
};

/// A Python dict with string keys, ordered as inserted.
struct dict_data {
  std::vector<std::pair<std::string, value>> entries;
  /// The value under `key`, or null.
  const value* find(std::string_view key) const;
  /// Inserts or replaces, keeping the first insertion's position (as Python does).
  void set(std::string key, value v);
};

/// Jinja's undefined: carries what was looked up ("'x' is undefined"), the message of the
/// error that using it raises.
struct undefined_t {
  std::string name;
};
/// Python's None.
struct none_t {};

/// A dynamically typed Jinja value. Lists and dicts share their (immutable) data, so copies
/// are cheap; namespaces are owned by the render that made them (see interpreter).
class value {
 public:
  /// The variant's alternatives, in order.
  enum class kind : uint8_t {
    undefined,
    none,
    boolean,
    integer,
    floating,
    string,
    list,
    dict,
    ns,
    callable
  };
  using list_ptr = std::shared_ptr<const list_data>;
  using dict_ptr = std::shared_ptr<const dict_data>;
  using callable_ptr = std::shared_ptr<const callable>;

  /// Undefined by default; each constructor makes the value of its argument's Python type.
  value() : v_(undefined_t{}) {}
  value(undefined_t u) : v_(std::move(u)) {}
  value(none_t) : v_(none_t{}) {}
  value(bool b) : v_(b) {}
  value(int64_t i) : v_(i) {}
  value(int i) : v_(static_cast<int64_t>(i)) {}
  value(double d) : v_(d) {}
  value(std::string s) : v_(std::move(s)) {}
  value(const char* s) : v_(std::string{s}) {}
  value(list_ptr l) : v_(std::move(l)) {}
  value(dict_ptr d) : v_(std::move(d)) {}
  value(namespace_object* n) : v_(n) {}
  value(callable_ptr c) : v_(std::move(c)) {}

  /// What the value is; the is_* tests ask the same.
  kind type() const { return static_cast<kind>(v_.index()); }
  bool is(kind k) const { return type() == k; }
  bool is_undefined() const { return is(kind::undefined); }
  bool is_none() const { return is(kind::none); }
  bool is_string() const { return is(kind::string); }
  /// int or bool (Python's bool is an int).
  bool is_integral() const { return is(kind::integer) || is(kind::boolean); }
  bool is_number() const { return is_integral() || is(kind::floating); }

  /// The content, for a value of that kind (std::bad_variant_access otherwise).
  bool as_bool() const { return std::get<bool>(v_); }
  /// The integer of an int or bool.
  int64_t as_int() const;
  /// Any number as a double.
  double as_double() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const list_data& as_list() const { return *std::get<list_ptr>(v_); }
  const dict_data& as_dict() const { return *std::get<dict_ptr>(v_); }
  namespace_object& as_namespace() const { return *std::get<namespace_object*>(v_); }
  const callable& as_callable() const { return *std::get<callable_ptr>(v_); }
  /// The message an undefined value fails with.
  const std::string& undefined_name() const { return std::get<undefined_t>(v_).name; }

  /// A new list (or tuple, generator, dict view) value.
  static value make_list(std::vector<value> items, seq flavor = seq::list);
  /// A new dict value.
  static value make_dict(dict_data d);

 private:
  std::variant<undefined_t, none_t, bool, int64_t, double, std::string, list_ptr, dict_ptr,
               namespace_object*, callable_ptr>
      v_;
};

/// A `namespace(...)` object: the only mutable value, assigned with `set ns.attr = ...`.
struct namespace_object {
  dict_data attrs;
};

/// Context values from JSON; objects keep their order (ordered_json keeps the sender's).
value from_json(const nlohmann::json& j);
value from_json(const nlohmann::ordered_json& j);

/// Python's bool(v); undefined is false.
bool truthy(const value& v);
/// Python's ==; 1 == 1.0 == True, [1] != (1,), undefined equals only undefined.
bool equals(const value& a, const value& b);
/// Python's ordering (<: -1, ==: 0, >: 1) for numbers, strings and lists; fails otherwise.
int compare(const value& a, const value& b);
/// Python's str(v), Jinja's printing: undefined prints as "".
std::string to_str(const value& v);
/// Python's repr(v): strings quoted as Python quotes them.
std::string repr(const value& v);
/// Python's type name ("str", "int", "dict", "NoneType"), for error messages.
std::string type_name(const value& v);

/// Python json.dumps options, as transformers' `tojson` passes them.
struct json_options {
  std::optional<int> indent;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;
};
/// Python's json.dumps(v, ...); undefined, generators, namespaces and callables fail.
std::string to_json_text(const value& v, const json_options& options);
/// Python's repr of a float ("1.0", "0.1", "1e+16", "inf").
std::string float_repr(double d);

}  // namespace computron::text::jinja
