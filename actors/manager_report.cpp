// The manager's report (the controller's merged view, `computron status`, /v2/status): its
// own figures per model and its gpu-lets, then the scheduler's and every worker's.
#include <caf/all.hpp>

#include "actors/model_manager_state.hpp"
#include "common/error.hpp"

namespace computron::actors::manager_detail {

caf::result<caf::settings> report(manager_pointer self) {
  // Own figures, then the scheduler's and every worker's: the controller's merged view.
  auto& st = self->state;
  caf::settings mine;
  caf::config_value::list models;
  for (auto& [name, m] : st.models) {
    caf::settings x;
    x["model"] = caf::config_value{name};
    x["tp"] = caf::config_value{static_cast<int64_t>(m.cfg.tp)};
    x["pp"] = caf::config_value{static_cast<int64_t>(m.cfg.pp)};
    x["queued"] = caf::config_value{static_cast<int64_t>(st.queues().queued(m.index))};
    x["in-flight"] = caf::config_value{static_cast<int64_t>(st.queues().in_flight(m.index))};
    x["served"] = caf::config_value{static_cast<int64_t>(m.served)};
    // Bytes on the devices against the checkpoint's: above 1 only by what is
    // replicated (norms, biases, a tied head's last-stage slice).
    x["bytes"] = caf::config_value{static_cast<int64_t>(m.bytes)};
    x["weight-bytes"] = caf::config_value{static_cast<int64_t>(m.weight_bytes)};
    // Measured compute per forward step (0: none yet), for `computron sim --calibrate`.
    x["step-ms"] = caf::config_value{st.queues().step_seconds(m.index) * 1e3};
    // And as a line in the tokens a step computes (sched::step_fit).
    auto line = m.steps.fitted();
    x["step-fixed-ms"] = caf::config_value{line.fixed_s * 1e3};
    x["step-per-token-ms"] = caf::config_value{line.per_token_s * 1e3};
    // Its gpu-let on each of its devices (lane and share).
    caf::config_value::list lanes, shares;
    for (size_t k = 0; k < m.cfg.devices.size(); ++k) {
      auto& l = st.disp->lanes_of(m.index);
      lanes.emplace_back(static_cast<int64_t>(k < l.size() ? l[k] : 0));
      shares.emplace_back(static_cast<int64_t>(st.disp->share_of(m.index, k)));
    }
    x["lanes"] = caf::config_value{std::move(lanes)};
    x["shares"] = caf::config_value{std::move(shares)};
    // What the gpu-let planner knows of its steps: per share it ran at, the step
    // line without its partners' interference.
    caf::config_value::list profile;
    for (auto& [share, fit] : m.steps_at) {
      auto l = fit.fitted();
      caf::settings p;
      p["share"] = caf::config_value{static_cast<int64_t>(share)};
      p["fixed-ms"] = caf::config_value{l.fixed_s * 1e3};
      p["per-token-ms"] = caf::config_value{l.per_token_s * 1e3};
      profile.emplace_back(std::move(p));
    }
    x["gpulet-steps"] = caf::config_value{std::move(profile)};
    models.emplace_back(std::move(x));
  }
  mine["models"] = caf::config_value{std::move(models)};
  mine["dispatch"] = caf::config_value{st.opts.batching.dispatch};
  // The devices' gpu-lets: per device the shares of its compute lanes.
  caf::config_value::list parts;
  for (auto& p : st.disp->partitions()) {
    caf::config_value::list one;
    for (auto share : p) one.emplace_back(static_cast<int64_t>(share));
    parts.emplace_back(std::move(one));
  }
  mine["gpulets"] = caf::config_value{std::move(parts)};
  mine["gpulets-auto"] = caf::config_value{st.disp->gpulets().automatic};
  mine["runnable-batches"] = caf::config_value{static_cast<int64_t>(st.disp->runnable())};
  auto rp = self->make_response_promise<caf::settings>();
  self->request(st.scheduler, 5s, report_atom_v)
      .then(
          [=](caf::settings& sched) mutable {
            // A worker that does not answer in time is shown as such, not as an error
            // of the whole report.
            auto n = self->state.workers.size();
            auto acc = std::make_shared<std::vector<caf::config_value>>(n);
            auto left = std::make_shared<size_t>(n);
            auto out = std::make_shared<caf::settings>();
            (*out)["manager"] = caf::config_value{mine};
            (*out)["scheduler"] = caf::config_value{std::move(sched)};
            auto finish = [=]() mutable {
              (*out)["devices"] = caf::config_value{caf::config_value::list(*acc)};
              rp.deliver(std::move(*out));
            };
            for (size_t i = 0; i < n; ++i)
              self->request(self->state.workers[i], 2s, report_atom_v)
                  .then(
                      [=](caf::settings& w) mutable {
                        (*acc)[i] = caf::config_value{std::move(w)};
                        if (--*left == 0) finish();
                      },
                      [=](caf::error& e) mutable {
                        caf::settings w;
                        w["device"] = caf::config_value{static_cast<int64_t>(i)};
                        w["error"] = caf::config_value{render(e)};
                        (*acc)[i] = caf::config_value{std::move(w)};
                        if (--*left == 0) finish();
                      });
          },
          [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
  return rp;
}

}  // namespace computron::actors::manager_detail
