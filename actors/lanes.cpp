// The lanes: detached actors that run blocking jobs (copies, compute) in order on threads
// of their own, off CAF's scheduler; and the step's deadline check a compute lane makes
// before it starts a step.
#include <algorithm>
#include <chrono>
#include <exception>
#include <string>

#include <fmt/format.h>
#include <caf/all.hpp>

#include "actors/shard_worker.hpp"
#include "common/error.hpp"

namespace computron::actors {

lane_actor::behavior_type lane_behavior(lane_actor::pointer self) {
  return {
      [=](run_atom, lane_job& job) -> caf::result<bool> {
        // No exception crosses the actor boundary.
        try {
          if (auto err = job.run()) return err;
          return true;
        } catch (const std::exception& e) {
          return make_error(ec::unspecified, std::string{"blocking job threw: "} + e.what());
        }
      },
  };
}

lane_actor spawn_lane(caf::actor_system& sys) {
  return sys.spawn<caf::detached>(lane_behavior);
}

// Declared in shard_worker.hpp, which says what it decides.
caf::error step_too_late(const step_request& req, std::chrono::steady_clock::time_point received,
                         std::chrono::steady_clock::time_point start, int32_t device) {
  if (req.deadline_ms <= 0) return {};
  const auto stages = std::max<size_t>(1, req.route.size());
  const auto left_stages = stages - std::min(stages - 1, static_cast<size_t>(req.stage));
  const double to_go =
      req.expected_ms * static_cast<double>(left_stages) / static_cast<double>(stages);
  const double waited = std::chrono::duration<double, std::milli>(start - received).count();
  if (waited + to_go <= static_cast<double>(req.deadline_ms)) return {};
  return make_error(ec::deadline_exceeded,
                    fmt::format("step {} of {} reached device {}'s compute lane {:.0f} ms after "
                                "it came, with {} ms of its deadline left then and about "
                                "{:.0f} ms of compute to go: it would end past the deadline",
                                req.input.step, req.model, device, waited, req.deadline_ms, to_go));
}

}  // namespace computron::actors
