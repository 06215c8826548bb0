#pragma once

#include <chrono>
#include <string>

#include "common/error_code.hpp"

/// Time and refusals as the decision code sees them. Every decision takes the time it is
/// made at as a parameter: the actors pass their actor clock's `now()` (which CAF's test
/// coordinator moves), the simulator its virtual time. Free of CAF and torch.
namespace computron::sched {

/// The clock of the actor system (caf::actor_clock uses the steady clock).
using clock = std::chrono::steady_clock;
using time_point = clock::time_point;
using duration = clock::duration;

/// Seconds from `from` to `to` (negative when `to` is earlier).
inline double seconds_between(time_point from, time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

/// A duration of `s` seconds.
inline duration from_seconds(double s) {
  return std::chrono::duration_cast<duration>(std::chrono::duration<double>(s));
}

/// Why a decision says no: an error code (what the client sees) and a sentence.
struct refusal {
  ec code = ec::unspecified;
  std::string reason;
};

}  // namespace computron::sched
