#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.hpp"

/// The syntax tree of a chat template: what the parser builds and the interpreter walks.
/// One node type for expressions and one for statements, each a kind plus the fields that
/// kind uses, keeps the tree small for the handful of constructs templates use.
namespace computron::text::jinja {

struct expr;
struct stmt;
using expr_ptr = std::unique_ptr<expr>;
using stmt_ptr = std::unique_ptr<stmt>;
using stmt_list = std::vector<stmt_ptr>;

/// What an expression node computes; the comment names the fields it uses.
enum class expr_kind : uint8_t {
  literal,      ///< lit
  name,         ///< name
  list,         ///< args: the items
  tuple,        ///< args: the items
  dict,         ///< args: key, value, key, value, ...
  attr,         ///< args[0] . name
  item,         ///< args[0] [ args[1] ]
  slice,        ///< args[0] [ args[1] : args[2] : args[3] ]; an omitted bound is null
  call,         ///< args[0] ( args[1..], kwargs ): args[0] is a name or an attr (a method)
  filter,       ///< args[0] | name ( args[1..], kwargs )
  test,         ///< args[0] is [not: negated] name ( args[1..] )
  unary,        ///< name ("not", "-", "+") args[0]
  binary,       ///< args[0] name args[1]: + - * / // % ** ~ and or
  compare,      ///< args[0] ops[0] args[1] ops[1] args[2] ...: == != < > <= >= in "not in"
  conditional,  ///< args[0] if args[1] else args[2] (args[2] null: undefined)
};

/// One expression node; `line` is where it starts in the template.
struct expr {
  expr_kind kind;
  int line = 0;
  /// Nodes on the longest path down from here (1 for a leaf), bounded by the parser.
  int height = 1;
  std::string name;
  value lit;
  bool negated = false;
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  std::vector<std::string> ops;
};

/// What a statement node does; the comment names the fields it uses.
enum class stmt_kind : uint8_t {
  text,       ///< text
  output,     ///< {{ value }}
  if_,        ///< if value: body else orelse (an elif is an if alone in orelse)
  for_,       ///< for targets in value [if filter]: body else orelse
  set,        ///< set targets = value, or set targets[0].attr = value when attr is non-empty
  set_block,  ///< set targets[0] %} body {% endset
  macro,      ///< macro text(params): body
  break_,
  continue_,
  block,  ///< a body rendered in place: {% generation %}
};

/// One statement node; `line` is where its tag starts.
struct stmt {
  stmt_kind kind;
  int line = 0;
  std::string text;
  expr_ptr value;
  expr_ptr filter;
  std::vector<std::string> targets;
  std::string attr;
  stmt_list body;
  stmt_list orelse;
  std::vector<std::pair<std::string, expr_ptr>> params;
};

/// A parsed template.
struct program {
  stmt_list body;
};

}  // namespace computron::text::jinja
