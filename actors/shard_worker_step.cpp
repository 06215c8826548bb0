#include "actors/shard_worker_state.hpp"

// The worker's step: one forward pass of a batch on the shard's compute lane, passed on to
// the next stage (or answered by the sampling rank). Its own file, as the actor's other
// handlers are about residency and groups.
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <caf/all.hpp>

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::actors::worker_detail {

caf::result<step_result> run_step(worker_pointer self, step_request& req) {
  auto& st = self->state;
  const int32_t index = st.opts.device_index;
  auto i = st.shards.find(req.model);
  if (i == st.shards.end())
    return make_error(ec::unknown_model,
                      "device " + std::to_string(index) + " holds no shard of model " + req.model);
  auto& e = i->second;
  if (!e.runner)
    return make_error(ec::invalid_request, "device " + std::to_string(index) + " holds " +
                                               req.model + " as an adapter of " +
                                               e.spec.model.base + ": it runs in its base's steps");
  if (req.stage != e.spec.pp_rank)
    return make_error(ec::invalid_request, "step for stage " + std::to_string(req.stage) +
                                               " reached device " + std::to_string(index) +
                                               ", which holds stage " +
                                               std::to_string(e.spec.pp_rank));
  // The rows' LoRA adapters: shards of this device beside the model's, which the batch's
  // leases keep resident (or loading) while it runs.
  std::vector<std::pair<std::string, shard_entry>> adapters;
  for (auto& name : req.input.adapters) {
    if (name.empty() ||
        std::any_of(adapters.begin(), adapters.end(), [&](auto& a) { return a.first == name; }))
      continue;
    auto a = st.shards.find(name);
    if (a == st.shards.end() || a->second.spec.model.base != req.model)
      return make_error(ec::invalid_request, "device " + std::to_string(index) +
                                                 " holds no adapter " + name + " of " + req.model);
    adapters.emplace_back(name, a->second);
  }
  const bool last_stage = e.spec.pp_rank == e.spec.model.pp - 1;
  // Its gpu-let: the lane and share the manager runs the model on here.
  const auto at = static_cast<size_t>(req.stage);
  const auto& lanes = req.lanes;
  const int32_t lane_index = at < lanes.lanes.size() ? lanes.lanes[at] : 0;
  const int32_t share = at < lanes.shares.size() ? lanes.shares[at] : 100;
  const auto partition =
      at < lanes.partitions.size() ? lanes.partitions[at] : std::vector<int32_t>{};
  // The manager's plan charges interference by its factor; so does this worker.
  sched::gpulet_options plan;
  plan.interference = lanes.interference;
  if (share < 1 || share > 100)
    return make_error(ec::invalid_request, "a step's share of device " + std::to_string(index) +
                                               " must be 1..100 percent, got " +
                                               std::to_string(share));
  auto lane = compute_lane(self, lane_index);
  if (!lane) return lane.error();
  // A model that moves to another lane (a re-plan) runs nothing there until what its
  // old lane still holds of it (a batch's end_batch, say) is done: one caller at a
  // time per runner.
  const int32_t previous_lane = e.lane;
  e.lane = lane_index;
  auto clock = st.gpulets;
  const bool emulate = st.emulate_gpulets;
  // A GPU's gpu-let computes on its green context's stream (the whole device on the
  // default one); the lane's thread is told before each step, as a lane may change
  // its share at a re-plan.
  std::shared_ptr<const model_kind> streams;
  if (st.dev->info().kind == gpu::device_kind::cuda)
    if (auto k = st.engines.find(e.spec.model.kind); k != st.engines.end()) streams = k->second;
  auto dev = st.dev;
  auto runner = e.runner;
  // The runner's backend uses the group: a rejoin may replace both while this step runs.
  auto group = e.group;
  auto w = e.weights;
  auto in_use = e.in_use;
  auto in = std::make_shared<step_request>(std::move(req));
  auto out = std::make_shared<step_result>();
  auto hidden_out = std::make_shared<tensor_payload>();
  const auto received = std::chrono::steady_clock::now();
  // Alone in its stage only: tensor-parallel ranks decide apart, and one that refused
  // would leave the others waiting in the step's collectives (those rows still end
  // at the step boundary after their limit).
  const bool alone = e.spec.model.tp == 1;
  lane_job job{[=]() -> caf::error {
    auto t0 = std::chrono::steady_clock::now();
    if (alone)
      if (auto err = step_too_late(*in, received, t0, index)) return err;
    // The lane is busy from here to the end of its wait (the partners' clock).
    struct busy_span {
      gpulet_clock* c;
      int32_t lane;
      ~busy_span() {
        if (c) c->end(lane);
      }
    } busy{clock.get(), lane_index};
    if (clock) clock->begin(lane_index);
    if (streams) {
      auto s = share < 100 ? dev->gpulet_stream(partition, static_cast<size_t>(lane_index))
                           : caf::expected<void*>{nullptr};
      if (!s) return s.error();
      if (auto err = streams->use_stream(dev, *s)) return err;
    }
    const double waited0 = gpu::thread_wait_seconds();
    (void)group;
    // No eviction unmaps the shard, nor its rows' adapters, until this step is done.
    std::shared_lock<std::shared_timed_mutex> computing{*in_use};
    auto state = w->state();
    if (state != gpu::residency::resident && state != gpu::residency::loading)
      return make_error(ec::not_resident, "model " + in->model + " is " + gpu::to_string(state) +
                                              " on device " + std::to_string(index));
    std::vector<std::shared_lock<std::shared_timed_mutex>> adapters_in_use;
    for (auto& [name, a] : adapters) {
      adapters_in_use.emplace_back(*a.in_use);
      auto s = a.weights->state();
      if (s != gpu::residency::resident && s != gpu::residency::loading)
        return make_error(ec::not_resident, "adapter " + name + " is " + gpu::to_string(s) +
                                                " on device " + std::to_string(index));
      if (auto err = runner->bind_adapter(name, a.weights)) return err;
    }
    models::host_tensor h;
    const models::host_tensor* hp = nullptr;
    if (in->stage > 0) {
      h = from_payload(in->hidden);
      hp = &h;
    }
    auto r = runner->step(in->input, hp);
    // What the KV pool holds now (after a last step dropped the batch's caches).
    out->kv_devices.push_back(index);
    out->kv_pool_bytes.push_back(runner->kv_device_bytes());
    if (!r) return r.error();
    if (!last_stage)
      *hidden_out = to_payload(r->hidden);
    else {
      out->tokens = std::move(r->tokens);
      out->logprobs = std::move(r->logprobs);
      out->prompt_logprobs = std::move(r->prompt_logprobs);
    }
    // Compute only: time spent waiting for bytes still loading is the load's.
    double compute_s = seconds_since(t0) - (gpu::thread_wait_seconds() - waited0);
    out->partner_busy = clock->partner_fraction(lane_index);
    if (emulate) {
      // An emulated gpu-let takes what its share and its partners make it take.
      double take = clock->seconds(lane_index, share, compute_s, plan);
      if (take > compute_s)
        std::this_thread::sleep_for(std::chrono::duration<double>(take - compute_s));
      compute_s = std::max(compute_s, take);
    }
    out->compute_ms = compute_s * 1e3;
    return {};
  }};
  auto rp = self->make_response_promise<step_result>();
  // A gpu-let's steps take longer by its share (and a busy partner); the slowest
  // stage's share bounds the whole chain's.
  int32_t slowest = 100;
  for (auto x : in->lanes.shares) slowest = std::clamp(x, 1, slowest);
  auto timeout = sched::gpulet_timeout(plan, st.opts.step_timeout, slowest);
  // A step on a loading shard also waits for its bytes (compute while loading).
  auto lane_timeout =
      w->state() == gpu::residency::loading ? timeout + st.opts.load_timeout : timeout;
  auto target = *lane;
  auto submit = [=]() mutable {
    // Bounded by the worker's tick, not a CAF timeout (reply_waits): a wedged step fails
    // at its deadline with request_timeout, as it did.
    auto wait = std::make_shared<reply_wait>();
    wait->deadline = self->clock().now() + lane_timeout;
    wait->expire = [rp]() mutable { rp.deliver(caf::make_error(caf::sec::request_timeout)); };
    if (auto in = self->state.lane_waits.watch(wait, self->clock().now()))
      self->delayed_send(self, *in, tick_atom_v);
    self->request(target, caf::infinite, run_atom_v, job)
        .then(
            [=](bool) mutable {
              if (!wait->answer()) return;
              if (last_stage) {
                rp.deliver(std::move(*out));
                return;
              }
              auto next_stage = static_cast<size_t>(in->stage + 1);
              if (in->route.size() <= next_stage) {
                rp.deliver(make_error(ec::invalid_request,
                                      "step route has no stage " + std::to_string(next_stage)));
                return;
              }
              auto next = in->route[next_stage];
              auto mine = out->compute_ms;
              auto mine_busy = out->partner_busy;
              auto mine_kv_devices = out->kv_devices;
              auto mine_kv_bytes = out->kv_pool_bytes;
              if (in->deadline_ms > 0)  // what is left of it for the stages after this
                in->deadline_ms = std::max<int64_t>(
                    1, in->deadline_ms - static_cast<int64_t>(seconds_since(received) * 1e3));
              auto remaining = static_cast<int>(in->route.size() - next_stage);
              in->stage += 1;
              in->hidden = std::move(*hidden_out);
              self->request(next, timeout * remaining, step_atom_v, std::move(*in))
                  .then(
                      [=](step_result& r) mutable {
                        r.compute_ms += mine;
                        r.partner_busy = std::max(r.partner_busy, mine_busy);
                        r.kv_devices.insert(r.kv_devices.end(), mine_kv_devices.begin(),
                                            mine_kv_devices.end());
                        r.kv_pool_bytes.insert(r.kv_pool_bytes.end(), mine_kv_bytes.begin(),
                                               mine_kv_bytes.end());
                        rp.deliver(std::move(r));
                      },
                      [=](caf::error& err) mutable { rp.deliver(std::move(err)); });
            },
            [=](caf::error& err) mutable {
              if (wait->answer()) rp.deliver(std::move(err));
            });
  };
  if (previous_lane == lane_index) {
    submit();
    return rp;
  }
  auto old_lane = compute_lane(self, previous_lane);
  if (!old_lane) {
    submit();
    return rp;
  }
  // The barrier: an empty job behind whatever the old lane still runs of it.
  lane_job barrier{[]() -> caf::error { return {}; }};
  self->request(*old_lane, lane_timeout, run_atom_v, std::move(barrier))
      .then([=](bool) mutable { submit(); }, [=](caf::error&) mutable { submit(); });
  return rp;
}

}  // namespace computron::actors::worker_detail
