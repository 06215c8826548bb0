// The shard worker's groups and lanes: the collective group a shard's stage joins, joining
// a cross-node group again when a node returns, and the compute lanes (one per gpu-let).
#include "actors/shard_worker_state.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::actors::worker_detail {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool same_shard(const shard_spec& a, const shard_spec& b) {
  return a.tp_rank == b.tp_rank && a.pp_rank == b.pp_rank && same_weights(a.model, b.model);
}

std::string group_name(const std::string& scope, const shard_spec& s) {
  std::string name =
      scope + "/model/" + s.model.name + "/stage" + std::to_string(s.pp_rank) + "/on";
  for (int r = 0; r < s.model.tp; ++r)
    name +=
        "-" + std::to_string(s.model.devices.at(static_cast<size_t>(s.pp_rank * s.model.tp + r)));
  return name;
}

/// The shard is here but its cross-node group is new (a peer's node restarted and the
/// group met again elsewhere): joins the new group and rebuilds the runner over the
/// weights already held.
caf::result<shard_report> rejoin(worker_pointer self, const std::string& name, shard_spec s) {
  auto& st = self->state;
  if (!st.opts.groups)
    return make_error(ec::invalid_configuration, "no cross-node groups in this process");
  if (st.preparing.count(name) > 0)
    return make_error(ec::invalid_state, "model " + name + " is being prepared");
  st.preparing.insert(name);
  auto& e = st.shards.at(name);
  auto weights = e.weights;
  auto eng = st.engines.at(s.model.kind);
  auto groups = st.opts.groups;
  auto group = group_name("cluster", s);
  auto bind_host = st.opts.host;
  auto timeout = st.opts.step_timeout;
  auto fresh = std::make_shared<shard_entry>();
  fresh->spec = s;
  fresh->weights = weights;
  fresh->load_began = e.load_began;
  fresh->begun = e.begun;
  fresh->lane = e.lane;
  const int32_t index = st.opts.device_index;
  lane_job job{[=]() -> caf::error {
    auto g = groups->join(s.group_address, group, s.tp_rank, s.model.tp, bind_host, timeout);
    if (!g) return g.error();
    fresh->group = std::shared_ptr<gpu::collective>(std::move(*g));
    auto b = eng->make_backend(s, *weights, *fresh->group);
    if (!b) return b.error();
    fresh->runner = runner_of(s, std::move(*b));
    return {};
  }};
  auto rp = self->make_response_promise<shard_report>();
  self->request(st.copy_lane, caf::timespan{std::chrono::hours(1)}, run_atom_v, std::move(job))
      .then(
          [=](bool) mutable {
            log::info("device {}: {} joined its group again at {}", index, name, s.group_address);
            // The new runner is prepared as a first one is (shard_worker.cpp).
            auto runner = fresh->runner;
            warm_on_compute_lane(
                self, name, [runner]() { return runner->compute().prepare(); },
                [=]() mutable {
                  self->state.preparing.erase(name);
                  self->state.shards[name] = std::move(*fresh);
                  rp.deliver(shard_report{name, index,
                                          self->state.dev->pages_of(weights->size_bytes()),
                                          weights->host_pinned()});
                });
          },
          [=](caf::error& err) mutable {
            self->state.preparing.erase(name);
            rp.deliver(std::move(err));
          });
  return rp;
}

void warm_on_compute_lane(worker_pointer self, const std::string& name,
                          std::function<caf::error()> work, std::function<void()> finish) {
  if (self->state.dev->info().kind == gpu::device_kind::emulated) return finish();
  const int32_t index = self->state.opts.device_index;
  self->request(self->state.compute_lanes.front(), caf::timespan{std::chrono::minutes(5)},
                run_atom_v, lane_job{std::move(work)})
      .then([=](bool) { finish(); },
            [=](caf::error& err) {
              log::warn("device {}: warm-up for {} failed (the first request pays it): {}", index,
                        name, render(err));
              finish();
            });
}

/// The compute lane `lane` (started on first use), or why there is none.
caf::expected<lane_actor> compute_lane(worker_pointer self, int32_t lane) {
  auto& st = self->state;
  if (lane < 0 || lane >= max_compute_lanes)
    return make_error(ec::invalid_request, "compute lane " + std::to_string(lane) +
                                               " does not exist on device " +
                                               std::to_string(st.opts.device_index) + " (0.." +
                                               std::to_string(max_compute_lanes - 1) + ")");
  while (st.compute_lanes.size() <= static_cast<size_t>(lane))
    st.compute_lanes.push_back(self->template spawn<caf::detached + caf::linked>(lane_behavior));
  return st.compute_lanes[static_cast<size_t>(lane)];
}

}  // namespace computron::actors::worker_detail
