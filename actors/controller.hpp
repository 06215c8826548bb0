#pragma once

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/interfaces.hpp"

namespace computron::actors {

/// Spawns the console's counterpart: requests go to `frontend` (admission, like HTTP
/// requests) and, for pins and the policy, to `scheduler`. Errors: a missing handle.
caf::expected<controller_actor> spawn_controller(caf::actor_system& sys, frontend_actor frontend,
                                                 swap_scheduler_actor scheduler);

}  // namespace computron::actors
