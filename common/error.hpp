#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>

#include "common/error_code.hpp"

namespace caf {
class actor_system_config;
}

namespace computron {

/// The CAF error category of `ec` (at most 10 characters, an atom in CAF 0.17).
constexpr caf::atom_value error_category = caf::atom("computron");

/// An error without context; lets CAF convert `ec` values implicitly.
caf::error make_error(ec code);

/// An error with a human-readable context: what was asked, and why it failed.
caf::error make_error(ec code, std::string context);

/// `err` with `prefix` before its context ("prefix: context"); the code stays, so the
/// caller's HTTP status and retry decisions still see what went wrong.
caf::error with_context(const caf::error& err, const std::string& prefix);

/// True when `err` is a Computron error with this code.
bool is(const caf::error& err, ec code);

/// "out_of_device_memory: <context>" for our errors; CAF's rendering for others. Works
/// without an actor system (logs, the CLI, tests).
std::string render(const caf::error& err);

/// Registers the error category with an actor system's configuration.
void register_errors(caf::actor_system_config& cfg);

}  // namespace computron
