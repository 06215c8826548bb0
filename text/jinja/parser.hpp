#pragma once

#include <string>

#include "text/jinja/ast.hpp"

namespace computron::text::jinja {

/// Parses a chat template. Throws template_error (ec::invalid_configuration, with the line)
/// for malformed templates and for any construct the interpreter does not implement (an
/// unknown tag, filter, test, method or function), so that nothing is rendered wrong later.
program parse_program(const std::string& source);

}  // namespace computron::text::jinja
