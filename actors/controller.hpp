#pragma once

#include <functional>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/settings.hpp>

#include "actors/interfaces.hpp"

namespace computron::actors {

/// The timeline behind `trace start|stop`: start (true) or write to the path (false);
/// returns what was done, or an error. Null: no tracing in this process.
using trace_control = std::function<caf::expected<std::string>(bool start, const std::string&)>;

/// Recent request figures (throughput, latency percentiles) added to the report under
/// "recent". Null: none.
using stats_source = std::function<caf::settings()>;

/// Spawns the console's counterpart: requests go to `frontend` (admission, like HTTP
/// requests) and, for pins and the policy, to `scheduler`. Errors: a missing handle.
caf::expected<controller_actor> spawn_controller(caf::actor_system& sys, frontend_actor frontend,
                                                 swap_scheduler_actor scheduler,
                                                 trace_control trace = nullptr,
                                                 stats_source stats = nullptr);

}  // namespace computron::actors
