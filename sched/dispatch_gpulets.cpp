// The dispatch core's gpu-lets: which compute lane of each device a model's batches run
// on (the gate guards lanes), a fixed partition's lanes, and the automatic planner's
// re-plans, which take effect once the models they move have drained.
#include <algorithm>

#include "sched/dispatch.hpp"

namespace computron::sched {

dispatcher::dispatcher(std::unique_ptr<batcher> b, size_t devices, gpulet_config g)
    : batcher_(std::move(b)), gpulets_(std::move(g)), gate_(0) {
  gpulets_.plan.device_count = static_cast<int32_t>(devices);
  if (gpulets_.automatic) max_lanes_ = std::max(1, gpulets_.plan.max_per_device);
  for (auto& p : gpulets_.partitions)
    max_lanes_ = std::max(max_lanes_, static_cast<int32_t>(p.size()));
  partitions_.assign(devices, std::vector<int32_t>{100});
  for (size_t d = 0; d < gpulets_.partitions.size() && d < devices; ++d)
    partitions_[d] = gpulets_.partitions[d];
  gate_ = device_gate(devices * static_cast<size_t>(max_lanes_));
}

int32_t dispatcher::share_of(uint32_t model, size_t position) const {
  auto& m = models_[model];
  if (position >= m.devices.size() || position >= m.lanes.size()) return 100;
  auto& p = partitions_[static_cast<size_t>(m.devices[position])];
  auto lane = static_cast<size_t>(m.lanes[position]);
  return lane < p.size() ? p[lane] : 100;
}

const std::vector<int32_t>& dispatcher::partition_of(uint32_t model, size_t position) const {
  static const std::vector<int32_t> whole{100};
  auto& m = models_[model];
  if (position >= m.devices.size()) return whole;
  return partitions_[static_cast<size_t>(m.devices[position])];
}

int32_t dispatcher::run_share(uint32_t model) const {
  int32_t share = 100;
  for (size_t k = 0; k < models_[model].devices.size(); ++k)
    share = std::min(share, share_of(model, k));
  return share;
}

void dispatcher::remove_model(uint32_t model) {
  if (model >= models_.size()) return;
  models_[model].gone = true;
  models_[model].arrivals = models_[model].prompt_tokens = models_[model].steps = 0;
}

void dispatcher::set_units(uint32_t model) {
  auto& m = models_[model];
  m.units.clear();
  for (size_t k = 0; k < m.devices.size(); ++k)
    m.units.push_back(m.devices[k] * max_lanes_ + m.lanes[k]);
  m.gate_key = gate_.placement_key(m.tp, m.pp, m.units);
}

void dispatcher::place_lanes(uint32_t model) {
  auto& m = models_[model];
  // The lane index on all its devices that the fewest models use (ties: the lowest), so
  // that a tensor-parallel model gets the same lane on each device where it can.
  int32_t lanes = max_lanes_;
  for (auto d : m.devices)
    lanes = std::min(lanes, static_cast<int32_t>(partitions_[static_cast<size_t>(d)].size()));
  int32_t best = 0;
  size_t best_use = SIZE_MAX;
  for (int32_t l = 0; l < std::max(1, lanes); ++l) {
    size_t use = 0;
    for (uint32_t o = 0; o < model; ++o)
      for (size_t k = 0; k < models_[o].devices.size() && !models_[o].gone; ++k)
        for (auto d : m.devices)
          if (models_[o].devices[k] == d && k < models_[o].lanes.size() && models_[o].lanes[k] == l)
            ++use;
    if (use < best_use) {
      best = l;
      best_use = use;
    }
  }
  m.lanes.assign(m.devices.size(), best);
  set_units(model);
}

void dispatcher::set_profile(uint32_t model, std::map<int32_t, step_fit::line> cost, double slo_s) {
  if (model >= models_.size()) return;
  models_[model].cost = std::move(cost);
  models_[model].slo_s = slo_s;
}

void dispatcher::note_arrival(uint32_t model, int64_t prompt_tokens, int64_t steps, time_point now,
                              dispatch_effects& out) {
  auto& m = models_[model];
  m.arrivals += 1;
  m.prompt_tokens += static_cast<double>(std::max<int64_t>(1, prompt_tokens));
  m.steps += static_cast<double>(std::max<int64_t>(1, steps));
  // A re-plan is armed while requests come; an idle server arms none (so a simulation
  // ends with its last request).
  if (!replan_at_) {
    if (window_start_ == time_point{}) window_start_ = now;
    replan_at_ = window_start_ + from_seconds(gpulets_.replan_s);
    if (*replan_at_ <= now) replan_at_ = now + from_seconds(gpulets_.replan_s);
    arm(*replan_at_, now, out);
  }
}

size_t dispatcher::running_batches(uint32_t model) const {
  size_t n = 0;
  for (auto& [id, b] : batches_)
    if (b.started && b.model == model) ++n;
  return n;
}

bool dispatcher::replans() const {
  if (gpulets_.automatic) return true;
  // A fixed partition with a split device: which model runs on which lane is planned.
  for (auto& p : partitions_)
    if (p.size() > 1) return true;
  return false;
}

bool dispatcher::moving(uint32_t model) const {
  return pending_plan_ && std::find(pending_moves_.begin(), pending_moves_.end(),
                                    batcher_->name(model)) != pending_moves_.end();
}

void dispatcher::replan(time_point now, dispatch_effects& out) {
  replan_at_.reset();
  const double window = seconds_between(window_start_, now);
  window_start_ = now;
  if (!(window > 0)) return;
  std::vector<gpulet_model> in;
  bool known = true;
  std::vector<uint32_t> planned;
  for (uint32_t i = 0; i < models_.size(); ++i) {
    auto& m = models_[i];
    if (m.gone) continue;
    planned.push_back(i);
    gpulet_model g;
    g.name = batcher_->name(i);
    g.devices = m.devices;
    g.rate = m.arrivals / window;
    g.slo_s = m.slo_s;
    g.max_batch = static_cast<int32_t>(batcher_->options().max_batch_size);
    if (m.arrivals > 0) {
      g.prompt_tokens = m.prompt_tokens / m.arrivals;
      g.output_tokens = m.steps / m.arrivals;
    }
    g.cost = m.cost;
    // Not measured yet: the batcher's mean step, where it has one.
    if (g.cost.empty())
      if (auto s = batcher_->step_seconds(i); s > 0) g.cost[100] = {s, 0};
    if (g.cost.empty()) {
      // A model that gets requests and was never measured: no plan can size it yet.
      if (m.arrivals > 0) known = false;
      g.cost[100] = {0, 0};
    }
    m.arrivals = m.prompt_tokens = m.steps = 0;
    in.push_back(std::move(g));
  }
  if (!known || in.empty()) return;
  // A fixed partition keeps its lanes' shares: only which lane each model runs on.
  auto plan = gpulets_.automatic ? plan_gpulets(in, gpulets_.plan)
                                 : plan_lanes(gpulets_.partitions, in, gpulets_.plan);
  if (plan.partitions.empty()) return;  // inputs the planner refuses: keep what is
  // The plan now in force, as the planner would write it.
  gpulet_plan current;
  current.partitions = partitions_;
  for (auto i : planned) {
    auto& name = batcher_->name(i);
    current.lane[name] = models_[i].lanes;
    current.devices[name] = models_[i].devices;
    current.share[name] = run_share(i);
  }
  // A new plan only where it keeps more models within their SLOs than the one in force
  // would at the same rates: every move drains models, and plans from noisy rates would
  // otherwise trade places back and forth.
  auto now_in_force = evaluate_plan(current, in, gpulets_.plan);
  auto moves = plan_changes(current, plan);
  if ((moves.empty() && plan.partitions == partitions_) ||
      plan.at_risk.size() >= now_in_force.at_risk.size()) {
    pending_plan_.reset();
    pending_moves_.clear();
    return;
  }
  pending_plan_ = std::move(plan);
  pending_moves_ = std::move(moves);
  apply_plan(out);
}

void dispatcher::apply_plan(dispatch_effects& out) {
  if (!pending_plan_) return;
  // The models it moves run no batch (their batches stopped taking joiners).
  for (uint32_t i = 0; i < models_.size(); ++i)
    if (!models_[i].gone && moving(i) && running_batches(i) > 0) return;
  // Nor may a model that keeps its lanes run on a lane whose share changes: plan_changes
  // lists it then (its share differs), so every running batch is on an unchanged lane.
  auto& plan = *pending_plan_;
  partitions_ = plan.partitions;
  for (uint32_t i = 0; i < models_.size(); ++i) {
    if (models_[i].gone) continue;
    if (auto l = plan.lane.find(batcher_->name(i)); l != plan.lane.end()) {
      models_[i].lanes = l->second;
      set_units(i);
    } else {
      // Added after the plan was made: its lanes anew, on the partitions now in force.
      place_lanes(i);
    }
  }
  pending_plan_.reset();
  pending_moves_.clear();
  out.gpulets_changed = true;
}

}  // namespace computron::sched
