#pragma once

#include <string>
#include <string_view>

#include "text/jinja/ast.hpp"
#include "text/jinja/value.hpp"

/// Walks a parsed chat template with a context and produces its text.
namespace computron::text::jinja {

struct scope;

/// A macro defined by the template, or one of the globals (`range`, `namespace`, ...).
struct callable {
  std::string name;
  /// The macro's statement (owned by the program); null for a global.
  const stmt* macro = nullptr;
  /// The scope the macro was defined in (owned by the render); its free names resolve there.
  scope* closure = nullptr;
};

/// Whether `name` is a global function: raise_exception, strftime_now, range, namespace,
/// dict.
bool is_global(std::string_view name);

/// Renders `p` with the variables of `context` (a dict). Throws template_error: a type
/// error or an undefined value used with the line of the expression, ec::invalid_request;
/// raise_exception's message as it is (line -1).
std::string render_program(const program& p, const value& context);

}  // namespace computron::text::jinja
