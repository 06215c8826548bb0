#include "actors/controller.hpp"

#include <caf/all.hpp>

#include "common/error.hpp"

namespace computron::actors {

namespace {

struct controller_state {
  static constexpr const char* name = "controller";
  frontend_actor frontend;
  swap_scheduler_actor scheduler;
  trace_control trace;
  stats_source stats;
};

controller_actor::behavior_type controller(
    controller_actor::stateful_pointer<controller_state> self, frontend_actor frontend,
    swap_scheduler_actor scheduler, trace_control trace, stats_source stats) {
  self->state.frontend = std::move(frontend);
  self->state.scheduler = std::move(scheduler);
  self->state.trace = std::move(trace);
  self->state.stats = std::move(stats);
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
      [=](report_atom a) -> caf::result<caf::settings> {
        auto rp = self->make_response_promise<caf::settings>();
        self->request(fe(), std::chrono::seconds(10), a)
            .then(
                [=](caf::settings& s) mutable {
                  if (self->state.stats) s["recent"] = caf::config_value{self->state.stats()};
                  rp.deliver(std::move(s));
                },
                [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](policy_atom a, std::string& name) {
        return self->delegate(self->state.scheduler, a, std::move(name));
      },
      [=](trace_atom, bool start, std::string& path) -> caf::result<std::string> {
        auto& t = self->state.trace;
        if (!t) return make_error(ec::invalid_state, "this controller records no trace");
        if (!start && path.empty())
          return make_error(ec::invalid_request, "trace stop needs a file to write");
        // A quick in-memory copy or a file write of a bounded timeline: done in place.
        auto r = t(start, path);
        if (!r) return r.error();
        return *r;
      },
  };
}

}  // namespace

caf::expected<controller_actor> spawn_controller(caf::actor_system& sys, frontend_actor frontend,
                                                 swap_scheduler_actor scheduler,
                                                 trace_control trace, stats_source stats) {
  if (!frontend || !scheduler)
    return make_error(ec::invalid_configuration, "a controller needs a frontend and a scheduler");
  return sys.spawn(controller, std::move(frontend), std::move(scheduler), std::move(trace),
                   std::move(stats));
}

}  // namespace computron::actors
