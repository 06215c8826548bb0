// The gpu-let cost and lane model (step cost at a share, a batch's round, the duty cycle
// of a lane, minimum shares, interference), and the plan's checks: input validation and
// which models a new plan moves. The planner itself is in sched/gpulets_plan.cpp.
#include "sched/gpulets.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>

namespace computron::sched {

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

/// Rows of a model's batch when its lane cycles every `cycle_s` seconds.
double rows_at(const gpulet_model& m, double cycle_s) {
  return std::clamp(m.rate * cycle_s, 1.0, static_cast<double>(m.max_batch));
}

}  // namespace

std::vector<int32_t> allowed_shares(const gpulet_options& opts) {
  std::vector<int32_t> s;
  for (auto x : opts.shares)
    if (x > 0 && x <= 100) s.push_back(x);
  s.push_back(100);
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

bool meets_slo(const gpulet_model& m, double latency_s) {
  return m.slo_s > 0 ? latency_s <= m.slo_s : std::isfinite(latency_s);
}

step_fit::line step_at(const gpulet_model& m, int32_t share) {
  if (m.cost.empty() || share <= 0) return {};
  auto it = m.cost.lower_bound(share);  // the nearest measured share at or above
  if (it == m.cost.end()) it = std::prev(it);
  return slowed(it->second, static_cast<double>(it->first) / share);
}

double round_s(const gpulet_model& m, const step_fit::line& step, double rows) {
  const double o = std::max(1.0, m.output_tokens);
  return o * step.fixed_s + rows * step.per_token_s * (m.prompt_tokens + o - 1);
}

double service_s(const gpulet_model& m, int32_t share, double rows) {
  return round_s(m, step_at(m, share), rows) / rows;
}

double capacity_rps(const gpulet_model& m, int32_t share, double rows) {
  const double r = round_s(m, step_at(m, share), rows);
  return r > 0 ? rows / r : inf;
}

lane_prediction predict_lane(const std::vector<lane_member>& members, double max_utilization) {
  lane_prediction p;
  const size_t n = members.size();
  p.latency_s.assign(n, inf);
  p.busy_of.assign(n, 0);
  p.rows.assign(n, 0);
  if (n == 0) {
    p.keeps_up = true;
    return p;
  }
  // g(C) = work of one cycle - max_utilization * C is piecewise linear in C: a batch has
  // one row below C = 1/rate and rate*C rows above; no batch may pass max_batch (C_cap).
  double cap = inf;
  for (auto& x : members)
    if (x.model->rate > 0) cap = std::min(cap, x.model->max_batch / x.model->rate);
  std::vector<double> points{0};
  for (auto& x : members)
    if (x.model->rate > 0 && 1 / x.model->rate < cap) points.push_back(1 / x.model->rate);
  if (std::isfinite(cap)) points.push_back(cap);
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  auto g = [&](double c) {
    double work = 0;
    for (auto& x : members) work += round_s(*x.model, x.step, rows_at(*x.model, c));
    return work - max_utilization * c;
  };
  double cycle = inf;
  for (size_t i = 0; i < points.size() && !std::isfinite(cycle); ++i) {
    const double gi = g(points[i]);
    if (gi <= 0) {
      cycle = points[i];
    } else if (i + 1 < points.size()) {
      const double gn = g(points[i + 1]);
      if (gn <= 0) cycle = points[i] + (points[i + 1] - points[i]) * gi / (gi - gn);
    } else if (!std::isfinite(cap)) {
      // Past the last point every batch grows with C: g's slope is sum(rate * per-row cost).
      double slope = -max_utilization;
      for (auto& x : members)
        slope += x.model->rate * x.step.per_token_s *
                 (x.model->prompt_tokens + std::max(1.0, x.model->output_tokens) - 1);
      if (slope < 0) cycle = points[i] + gi / -slope;
    }
  }
  p.keeps_up = std::isfinite(cycle);
  p.cycle_s = cycle;
  for (size_t k = 0; k < n; ++k) {
    const auto& m = *members[k].model;
    // Not keeping up: what the lane would need at full batches, its least demand.
    p.rows[k] = p.keeps_up ? rows_at(m, cycle) : m.max_batch;
    const double r = round_s(m, members[k].step, p.rows[k]);
    p.busy_of[k] = m.rate * r / p.rows[k];
    p.busy += p.busy_of[k];
    if (p.keeps_up) p.latency_s[k] = cycle + r;
  }
  return p;
}

lane_prediction predict_alone(const gpulet_model& m, int32_t share, double slowdown,
                              double max_utilization) {
  return predict_lane({{&m, slowed(step_at(m, share), slowdown)}}, max_utilization);
}

std::optional<int32_t> min_share(const gpulet_model& m, const gpulet_options& opts) {
  for (auto s : allowed_shares(opts)) {
    auto p = predict_alone(m, s, 1.0, opts.max_utilization);
    if (p.keeps_up && meets_slo(m, p.latency_s[0])) return s;
  }
  return std::nullopt;
}

double interference_slowdown(const gpulet_options& opts, double partner_busy) {
  return 1 + (opts.interference - 1) * std::clamp(partner_busy, 0.0, 1.0);
}

double gpulet_seconds(const gpulet_options& opts, double whole_s, int32_t share,
                      double partner_busy) {
  const double s = std::clamp(share, 1, 100);
  return whole_s * 100.0 / s * interference_slowdown(opts, partner_busy);
}

std::chrono::milliseconds gpulet_timeout(const gpulet_options& opts,
                                         std::chrono::milliseconds whole, int32_t share) {
  if (share >= 100) return whole;
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      whole * gpulet_seconds(opts, 1.0, share, 1.0));
}

std::optional<refusal> check_gpulet_config(const gpulet_config& c, size_t devices) {
  auto bad = [](std::string why) { return refusal{ec::invalid_configuration, std::move(why)}; };
  for (auto x : c.plan.shares)
    if (x < 1 || x > 100)
      return bad("devices.gpulet_shares: " + std::to_string(x) + " is not a percent in 1..100");
  auto allowed = allowed_shares(c.plan);
  if (c.plan.max_per_device < 1 || c.plan.max_per_device > max_gpulets_per_device)
    return bad("devices.gpulets_per_device must be 1.." + std::to_string(max_gpulets_per_device) +
               ", got " + std::to_string(c.plan.max_per_device));
  if (!(std::isfinite(c.plan.interference) && c.plan.interference >= 1))
    return bad("devices.gpulet_interference must be 1 or more, got " +
               std::to_string(c.plan.interference));
  if (!(std::isfinite(c.replan_s) && c.replan_s >= 0.01))
    return bad("devices.gpulet_replan_ms must be 10 or more, got " +
               std::to_string(c.replan_s * 1e3));
  if (c.automatic && !c.partitions.empty())
    return bad("devices.gpulets is either \"auto\" or a partition per device, not both");
  if (c.partitions.size() > devices)
    return bad("devices.gpulets gives " + std::to_string(c.partitions.size()) + " partitions for " +
               std::to_string(devices) + " devices");
  for (size_t d = 0; d < c.partitions.size(); ++d) {
    auto& p = c.partitions[d];
    auto where = "devices.gpulets[" + std::to_string(d) + "]";
    if (p.empty()) return bad(where + " is empty: give [100] for a whole device");
    if (static_cast<int32_t>(p.size()) > c.plan.max_per_device)
      return bad(where + " has " + std::to_string(p.size()) + " gpu-lets; at most " +
                 std::to_string(c.plan.max_per_device) + " per device");
    int32_t sum = 0;
    for (auto s : p) {
      if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
        std::string list;
        for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::to_string(a);
        return bad(where + ": share " + std::to_string(s) + " is not one of " + list);
      }
      sum += s;
    }
    if (sum > 100) return bad(where + "'s shares sum to " + std::to_string(sum) + ", above 100");
  }
  return std::nullopt;
}

std::vector<std::string> plan_changes(const gpulet_plan& from, const gpulet_plan& to) {
  // (device, lane, share) of each of a model's gpu-lets; empty when the plan lacks it.
  auto lanes_of = [](const gpulet_plan& p, const std::string& name) {
    std::vector<std::tuple<int32_t, int32_t, int32_t>> out;
    auto l = p.lane.find(name);
    auto d = p.devices.find(name);
    if (l == p.lane.end() || d == p.devices.end()) return out;
    for (size_t k = 0; k < l->second.size() && k < d->second.size(); ++k) {
      const auto dev = static_cast<size_t>(d->second[k]);
      const auto g = static_cast<size_t>(l->second[k]);
      const int32_t share =
          dev < p.partitions.size() && g < p.partitions[dev].size() ? p.partitions[dev][g] : -1;
      out.emplace_back(d->second[k], l->second[k], share);
    }
    return out;
  };
  std::vector<std::string> names;
  for (auto& [n, _] : from.lane) names.push_back(n);
  for (auto& [n, _] : to.lane) names.push_back(n);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::vector<std::string> changed;
  for (auto& n : names)
    if (!from.lane.count(n) || !to.lane.count(n) || lanes_of(from, n) != lanes_of(to, n))
      changed.push_back(n);
  return changed;
}

std::optional<refusal> check_gpulet_inputs(const std::vector<gpulet_model>& models,
                                           const gpulet_options& opts) {
  std::ostringstream why;
  auto bad = [](double x) { return !std::isfinite(x) || x < 0; };
  if (opts.device_count < 1)
    why << "device_count = " << opts.device_count << ": must be at least 1";
  else if (opts.shares.empty())
    why << "shares is empty: at least one gpu-let size";
  else if (opts.max_per_device < 1)
    why << "max_per_device = " << opts.max_per_device << ": must be at least 1";
  else if (!std::isfinite(opts.interference) || opts.interference < 1)
    why << "interference = " << opts.interference << ": must be finite and >= 1";
  else if (!(opts.max_utilization > 0 && opts.max_utilization <= 1))
    why << "max_utilization = " << opts.max_utilization << ": must be in (0, 1]";
  for (size_t i = 0; i < opts.shares.size() && why.tellp() == 0; ++i)
    if (opts.shares[i] <= 0 || opts.shares[i] > 100)
      why << "shares[" << i << "] = " << opts.shares[i] << ": must be in (0, 100]";
  for (size_t i = 0; i < models.size() && why.tellp() == 0; ++i) {
    const auto& m = models[i];
    const std::string at = "models[" + std::to_string(i) + "] ('" + m.name + "').";
    if (m.name.empty()) why << "models[" << i << "].name is empty";
    for (size_t j = 0; j < i && why.tellp() == 0; ++j)
      if (models[j].name == m.name) why << at << "name: also models[" << j << "]";
    if (why.tellp() != 0) break;
    if (m.devices.empty()) why << at << "devices is empty";
    for (size_t k = 0; k < m.devices.size() && why.tellp() == 0; ++k) {
      if (m.devices[k] < 0 || m.devices[k] >= opts.device_count)
        why << at << "devices[" << k << "] = " << m.devices[k] << ": not in [0, "
            << opts.device_count << ")";
      for (size_t j = 0; j < k && why.tellp() == 0; ++j)
        if (m.devices[j] == m.devices[k])
          why << at << "devices[" << k << "] = " << m.devices[k] << ": listed twice";
    }
    if (why.tellp() != 0) break;
    if (bad(m.rate))
      why << at << "rate = " << m.rate << ": must be finite and >= 0";
    else if (bad(m.slo_s))
      why << at << "slo_s = " << m.slo_s << ": must be finite and >= 0";
    else if (bad(m.prompt_tokens))
      why << at << "prompt_tokens = " << m.prompt_tokens << ": must be finite and >= 0";
    else if (!std::isfinite(m.output_tokens) || m.output_tokens < 1)
      why << at << "output_tokens = " << m.output_tokens << ": must be finite and >= 1";
    else if (m.max_batch < 1)
      why << at << "max_batch = " << m.max_batch << ": must be at least 1";
    else if (m.cost.empty())
      why << at << "cost is empty: at least one measured share";
    for (auto& [share, l] : m.cost) {
      if (why.tellp() != 0) break;
      if (share <= 0 || share > 100)
        why << at << "cost[" << share << "]: share not in (0, 100]";
      else if (bad(l.fixed_s) || bad(l.per_token_s))
        why << at << "cost[" << share << "] = {" << l.fixed_s << ", " << l.per_token_s
            << "}: must be finite and >= 0";
    }
  }
  if (why.tellp() == 0) return std::nullopt;
  return refusal{ec::invalid_configuration, why.str()};
}

}  // namespace computron::sched
