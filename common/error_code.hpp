#pragma once

#include <cstdint>

/// The error codes alone, without CAF: decision code (sched/) names its refusals with
/// them and stays free of the actor framework; common/error.hpp makes them CAF errors.
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
  /// The client withdrew the request (it disconnected, or its stop string appeared).
  cancelled,
};

/// Name of an error code, e.g. "out_of_device_memory".
const char* to_string(ec code);

}  // namespace computron
