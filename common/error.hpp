#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>

namespace caf {
class actor_system_config;
}

namespace computron {

/// Every failure Computron reports. One category ("computron") registered with CAF so
/// that errors render the same in logs, HTTP replies and across the network.
enum class ec : uint8_t {
  /// Never returned: CAF reserves 0 for "no error".
  none = 0,
  unspecified,
  unknown_model,
  not_resident,
  out_of_device_memory,
  out_of_host_memory,
  overloaded,
  deadline_exceeded,
  device_error,
  invalid_request,
  invalid_configuration,
  invalid_state,
  io_error,
  unavailable,
};

/// The CAF error category of `ec` (at most 10 characters, an atom in CAF 0.17).
constexpr caf::atom_value error_category = caf::atom("computron");

/// Name of an error code, e.g. "out_of_device_memory".
const char* to_string(ec code);

/// An error without context; lets CAF convert `ec` values implicitly.
caf::error make_error(ec code);

/// An error with a human-readable context: what was asked, and why it failed.
caf::error make_error(ec code, std::string context);

/// True when `err` is a Computron error with this code.
bool is(const caf::error& err, ec code);

/// "out_of_device_memory: <context>" for our errors; CAF's rendering for others. Works
/// without an actor system (logs, the CLI, tests).
std::string render(const caf::error& err);

/// Registers the error category with an actor system's configuration.
void register_errors(caf::actor_system_config& cfg);

}  // namespace computron
