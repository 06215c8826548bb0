#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/interfaces.hpp"
#include "actors/observer.hpp"

namespace computron::actors {

struct frontend_options {
  /// Requests admitted and not yet answered, per model and in all; more are refused
  /// as overloaded at once (HTTP 429), so memory stays bounded under any burst.
  uint32_t max_outstanding_per_model = 256;
  uint32_t max_outstanding = 4096;
  /// Slack on top of a request's deadline before the frontend gives up on the backend.
  std::chrono::milliseconds reply_slack{std::chrono::seconds(30)};
  /// Deadline assumed for requests that name none; start_runtime sets the manager's.
  std::chrono::milliseconds default_deadline{std::chrono::seconds(60)};
  std::shared_ptr<observer> obs = null_observer();
};

/// Spawns a frontend in front of `backend` (a model manager or a composed pipeline).
caf::expected<frontend_actor> spawn_frontend(caf::actor_system& sys, serving_actor backend,
                                             frontend_options opts);

}  // namespace computron::actors
