#include "sched/dispatch.hpp"

#include <algorithm>

namespace computron::sched {

std::unique_ptr<dispatcher> dispatcher::make(batching_options opts, size_t devices, refusal* why) {
  auto b = batcher::make(std::move(opts), why);
  if (!b) return nullptr;
  return std::unique_ptr<dispatcher>(new dispatcher(std::move(b), devices));
}

uint32_t dispatcher::add_model(const std::string& name, int32_t tp, int32_t pp,
                               const std::vector<int32_t>& devices, int32_t priority) {
  auto index = batcher_->add_model(name, pp, priority);
  if (models_.size() <= index) models_.resize(static_cast<size_t>(index) + 1);
  models_[index] = {gate_.placement_key(tp, pp, devices), pp, devices};
  return index;
}

void dispatcher::arm(time_point at, time_point now, dispatch_effects& out) {
  at = std::max(at, now);
  if (auto i = ticks_.lower_bound(now); i != ticks_.end() && *i <= at) return;
  ticks_.insert(at);
  out.ticks.push_back(at + tick_slack);
}

void dispatcher::dispatch_pass(time_point now, dispatch_effects& out) {
  auto d = batcher_->dispatch(now);
  for (auto& [m, e] : d.expired) out.failures.push_back({m, e, row_end::expired, 0});
  for (auto& [m, e] : d.dropped) out.failures.push_back({m, e, row_end::dropped, 0});
  for (auto& plan : d.batches) {
    auto id = next_batch_++;
    batches_[id] = {plan.model, plan.rows, {}, {}};
    out.formed.push_back({id, plan.model, std::move(plan.rows)});
  }
  if (d.next_tick) arm(*d.next_tick, now, out);
  out.dispatched = true;
}

void dispatcher::run_pass(time_point now, dispatch_effects& out) {
  auto pass = gate_.begin_pass();
  std::deque<batch_id> still;
  bool freed = false;
  while (!runnable_.empty()) {
    auto id = runnable_.front();
    runnable_.pop_front();
    auto& b = batches_.at(id);
    auto& m = models_[b.model];
    if (b.lease.loading) {
      // Started too early, its first stage would hold the devices' compute lanes (and a
      // gate slot) while it waits for bytes, and every other batch there would wait
      // behind it. It starts when the rest of the load takes about its first stage.
      auto at = overlap_start(b.lease.leased_at, b.lease.load_left_s,
                              batcher_->step_seconds(b.model), m.pp);
      if (at > now) {
        arm(at, now, out);
        still.push_back(id);
        continue;
      }
    }
    if (!gate_.try_start(pass, m.gate_key, m.devices, m.pp)) {
      still.push_back(id);
      continue;
    }
    // Requests whose deadline passed while the model loaded end here, and those whose
    // clients withdrew them.
    auto start = std::max(now, b.lease.leased_at);
    std::vector<queued_entry> live;
    for (auto& e : b.rows) {
      if (std::find(b.cancelled.begin(), b.cancelled.end(), e.key) != b.cancelled.end())
        out.failures.push_back({b.model, e, row_end::cancelled, id});
      else if (e.deadline <= start)
        out.failures.push_back({b.model, e, row_end::expired_waiting, id});
      else
        live.push_back(e);
    }
    if (live.empty()) {
      gate_.finish(m.devices);
      out.releases.push_back({id, b.model});
      batcher_->batch_ended(b.model);
      batches_.erase(id);
      freed = true;
      continue;
    }
    b.rows = live;
    b.started = true;
    out.started.push_back({id, b.model, std::move(live), start});
  }
  runnable_ = std::move(still);
  // A model whose whole batch expired can take its next batch now.
  if (freed) dispatch_pass(now, out);
}

dispatch_effects dispatcher::admit(uint32_t model, uint64_t key, time_point now,
                                   int64_t deadline_ms, int64_t steps, bool drop_late) {
  dispatch_effects out;
  out.refused = batcher_->admit(model, key, now, deadline_ms, &out.deadline, steps, drop_late);
  if (!out.refused) dispatch_pass(now, out);
  return out;
}

dispatch_effects dispatcher::leased(batch_id id, const lease_info& l, time_point now) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end()) return out;
  auto& b = i->second;
  b.lease = l;
  if (l.resident) {
    std::vector<bool> in(batcher_->model_count(), false);
    for (auto m : *l.resident)
      if (m < in.size()) in[m] = true;
    for (uint32_t m = 0; m < in.size(); ++m) batcher_->set_resident(m, in[m]);
  }
  batcher_->note_load(b.model, l.load_estimate_s);
  batcher_->set_resident(b.model, true);
  runnable_.push_back(id);
  run_pass(now, out);
  return out;
}

dispatch_effects dispatcher::lease_failed(batch_id id, time_point now) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end()) return out;
  batcher_->batch_ended(i->second.model);
  batcher_->set_resident(i->second.model, false);
  batches_.erase(i);
  dispatch_pass(now, out);
  return out;
}

void dispatcher::abandon(batch_id id) {
  auto i = batches_.find(id);
  if (i == batches_.end()) return;
  batcher_->batch_ended(i->second.model);
  batches_.erase(i);
}

void dispatcher::cancel(batch_id id, uint64_t key) {
  // Only a batch not started yet fails the row here; a running one drops it after its
  // step (the manager's), and a long-lived one must not collect the keys.
  if (auto i = batches_.find(id); i != batches_.end() && !i->second.started)
    i->second.cancelled.push_back(key);
}

dispatch_effects dispatcher::batch_done(batch_id id, time_point now, bool ok, double compute_s,
                                        int64_t steps) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end()) return out;
  auto model = i->second.model;
  batches_.erase(i);
  gate_.finish(models_[model].devices);
  out.releases.push_back({id, model});
  batcher_->batch_ended(model);
  if (ok && steps > 0) batcher_->note_steps(model, compute_s, steps);
  run_pass(now, out);
  dispatch_pass(now, out);
  return out;
}

bool dispatcher::others_wait(uint32_t model) const {
  auto& mine = models_[model].devices;
  for (auto& [id, b] : batches_) {
    if (b.started || b.model == model) continue;
    for (auto d : models_[b.model].devices)
      if (std::find(mine.begin(), mine.end(), d) != mine.end()) return true;
  }
  return false;
}

dispatch_effects dispatcher::step_boundary(batch_id id, size_t running, time_point now) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end() || !i->second.started) return out;
  const auto model = i->second.model;
  const size_t room = batcher_->options().max_batch_size;
  if (!batcher_->options().continuous || running >= room || batcher_->queued(model) == 0 ||
      others_wait(model))
    return out;
  auto d = batcher_->join(model, room - running, now);
  for (auto& [m, e] : d.expired) out.failures.push_back({m, e, row_end::expired, 0});
  for (auto& [m, e] : d.dropped) out.failures.push_back({m, e, row_end::dropped, 0});
  for (auto& plan : d.batches)
    out.joins.push_back({id, next_batch_++, model, std::move(plan.rows)});
  out.dispatched = true;
  return out;
}

dispatch_effects dispatcher::tick(time_point now) {
  dispatch_effects out;
  ticks_.erase(ticks_.begin(), ticks_.upper_bound(now));
  run_pass(now, out);
  dispatch_pass(now, out);
  return out;
}

}  // namespace computron::sched
