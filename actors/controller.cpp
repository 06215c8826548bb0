#include "actors/controller.hpp"

#include <caf/all.hpp>

#include "common/error.hpp"

namespace computron::actors {

namespace {

struct controller_state {
  static constexpr const char* name = "controller";
  frontend_actor frontend;
  swap_scheduler_actor scheduler;
};

controller_actor::behavior_type controller(controller_actor::stateful_pointer<controller_state> self,
                                           frontend_actor frontend,
                                           swap_scheduler_actor scheduler) {
  self->state.frontend = std::move(frontend);
  self->state.scheduler = std::move(scheduler);
  auto fe = [=] { return self->state.frontend; };
  return {
      [=](list_atom a) { return self->delegate(fe(), a); },
      [=](devices_atom a) { return self->delegate(fe(), a); },
      [=](load_atom a, std::string& m) { return self->delegate(fe(), a, std::move(m)); },
      [=](unload_atom a, std::string& m) { return self->delegate(fe(), a, std::move(m)); },
      [=](pin_atom a, std::string& m, bool on) {
        return self->delegate(self->state.scheduler, a, std::move(m), on);
      },
      [=](infer_atom a, infer_request& r) { return self->delegate(fe(), a, std::move(r)); },
      [=](report_atom a) { return self->delegate(fe(), a); },
      [=](policy_atom a, std::string& name) {
        return self->delegate(self->state.scheduler, a, std::move(name));
      },
  };
}

}  // namespace

caf::expected<controller_actor> spawn_controller(caf::actor_system& sys, frontend_actor frontend,
                                                 swap_scheduler_actor scheduler) {
  if (!frontend || !scheduler)
    return make_error(ec::invalid_configuration, "a controller needs a frontend and a scheduler");
  return sys.spawn(controller, std::move(frontend), std::move(scheduler));
}

}  // namespace computron::actors
