// The gpu-let planner: minimum shares, placement by demand (own gpu-lets, then joining in
// time where every SLO still holds, then the least busy), growth against interference,
// the leftover; and the whole-device comparison. One mutable state, explicit inputs.
#include "sched/gpulets.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace computron::sched {

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

/// The plan being built: lanes per device, each model's lane on each of its devices.
class planner {
 public:
  planner(const std::vector<gpulet_model>& models, const gpulet_options& opts)
      : models_(models),
        opts_(opts),
        shares_(allowed_shares(opts)),
        dev_(opts.device_count),
        lane_of_(models.size()),
        temporal_(models.size(), false) {
    for (size_t i = 0; i < models.size(); ++i) lane_of_[i].assign(models[i].devices.size(), -1);
    by_name_.resize(models.size());
    std::iota(by_name_.begin(), by_name_.end(), size_t{0});
    std::sort(by_name_.begin(), by_name_.end(),
              [&](size_t a, size_t b) { return models[a].name < models[b].name; });
  }

  /// temporal_plan: one whole-device lane per device, every model on it.
  void all_in_time() {
    for (auto& lanes : dev_) lanes.push_back({100, {}});
    for (auto i : by_name_)  // members by name: the same sums whatever the input order
      for (size_t k = 0; k < lane_of_[i].size(); ++k) {
        dev_[models_[i].devices[k]][0].members.push_back(i);
        lane_of_[i][k] = 0;
      }
    for (size_t i = 0; i < models_.size(); ++i)
      for (auto d : models_[i].devices)
        if (dev_[d][0].members.size() > 1) temporal_[i] = true;
  }

  /// The lanes of `plan` (a model it lacks, or whose lanes do not fit a partition, goes
  /// to lane 0 of each of its devices).
  void adopt(const gpulet_plan& plan) {
    for (size_t d = 0; d < dev_.size(); ++d) {
      if (d < plan.partitions.size())
        for (auto share : plan.partitions[d]) dev_[d].push_back({share, {}});
      if (dev_[d].empty()) dev_[d].push_back({100, {}});
    }
    for (auto i : by_name_) {
      auto l = plan.lane.find(models_[i].name);
      for (size_t k = 0; k < lane_of_[i].size(); ++k) {
        const auto d = static_cast<size_t>(models_[i].devices[k]);
        int32_t g = l != plan.lane.end() && k < l->second.size() ? l->second[k] : 0;
        if (g < 0 || static_cast<size_t>(g) >= dev_[d].size()) g = 0;
        dev_[d][static_cast<size_t>(g)].members.push_back(i);
        lane_of_[i][k] = g;
      }
    }
    for (size_t i = 0; i < models_.size(); ++i)
      for (size_t k = 0; k < lane_of_[i].size(); ++k)
        if (lane(i, k).members.size() > 1) temporal_[i] = true;
  }

  /// Places models by decreasing demand.
  void place_all() {
    struct demand {
      int32_t share = 0;
      double busy = 0;
    };
    std::vector<demand> dem(models_.size());
    for (size_t i = 0; i < models_.size(); ++i) {
      auto s = min_share(models_[i], opts_);
      dem[i].share = s ? *s : 101;  // fits nowhere alone: the heaviest
      dem[i].busy = predict_alone(models_[i], 100, 1.0, opts_.max_utilization).busy;
    }
    auto order = by_name_;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (dem[a].share != dem[b].share) return dem[a].share > dem[b].share;
      return dem[a].busy > dem[b].busy;
    });
    for (auto i : order) place(i, std::min(dem[i].share, 100));
  }

  /// While a model misses its SLO (with interference) and its devices have room, its
  /// gpu-lets grow to the next allowed share. Every growth takes share, so this ends.
  void grow() {
    for (;;) {
      auto ev = evaluate();
      bool grew = false;
      for (auto i : by_name_) {
        if (meets_slo(models_[i], latency_of(i, ev))) continue;
        const int32_t cur = run_share(i);
        auto next = std::upper_bound(shares_.begin(), shares_.end(), cur);
        if (next == shares_.end()) continue;
        bool room = true;
        for (size_t k = 0; k < lane_of_[i].size(); ++k) {
          const int32_t d = models_[i].devices[k];
          if (lane(i, k).share == cur && used(d) + *next - cur > 100) room = false;
        }
        if (!room) continue;
        for (size_t k = 0; k < lane_of_[i].size(); ++k)
          if (lane(i, k).share == cur) lane(i, k).share = *next;
        grew = true;
        break;
      }
      if (!grew) return;
    }
  }

  /// Each device's leftover goes to its gpu-lets: the assignment of allowed shares (none
  /// smaller than now) that uses the most of the device, then evens out their load (the
  /// highest busy fraction times share over new share), then their sizes; searched in
  /// order, the current shares first, so the first best one wins. One lane: 100.
  void spread_leftover() {
    auto ev = evaluate();
    for (size_t d = 0; d < dev_.size(); ++d) {
      auto& lanes = dev_[d];
      if (lanes.size() == 1) lanes[0].share = 100;
      if (lanes.size() < 2) continue;
      std::vector<double> work(lanes.size());
      for (size_t g = 0; g < lanes.size(); ++g) work[g] = ev.lanes[d][g].busy * lanes[g].share;
      std::vector<int32_t> pick(lanes.size()), best;
      double best_load = inf;
      int32_t best_sum = -1, best_spread = 0;
      int64_t budget = 1'000'000;  // leaves at most: fine shares and many lanes stay bounded
      auto visit = [&](auto&& self, size_t g, int32_t sum) -> void {
        if (budget <= 0) return;
        if (g == lanes.size()) {
          --budget;
          double load = 0;
          for (size_t h = 0; h < lanes.size(); ++h) load = std::max(load, work[h] / pick[h]);
          auto [lo, hi] = std::minmax_element(pick.begin(), pick.end());
          const int32_t spread = *hi - *lo;
          const bool better =
              sum > best_sum ||
              (sum == best_sum &&
               (load < best_load - 1e-12 || (load <= best_load + 1e-12 && spread < best_spread)));
          if (better) best = pick, best_sum = sum, best_load = load, best_spread = spread;
          return;
        }
        for (auto s : shares_) {
          if (s < lanes[g].share || sum + s > 100) continue;
          pick[g] = s;
          self(self, g + 1, sum + s);
        }
      };
      visit(visit, 0, 0);
      for (size_t g = 0; g < lanes.size(); ++g) lanes[g].share = best[g];
    }
  }

  gpulet_plan result() const {
    gpulet_plan p;
    auto ev = evaluate();
    for (auto& lanes : dev_) {
      p.partitions.emplace_back();
      for (auto& l : lanes) p.partitions.back().push_back(l.share);
      if (lanes.empty()) p.partitions.back().push_back(100);
    }
    for (auto i : by_name_) {
      const auto& m = models_[i];
      p.lane[m.name] = lane_of_[i];
      p.devices[m.name] = m.devices;
      p.share[m.name] = run_share(i);
      const double lat = latency_of(i, ev);
      p.predicted_latency_s[m.name] = lat;
      double util = 0;
      for (size_t k = 0; k < lane_of_[i].size(); ++k) {
        const int32_t d = m.devices[k];
        util = std::max(util, ev.lanes[d][lane_of_[i][k]].busy_of[member_pos(i, k)]);
      }
      p.utilization[m.name] = util;
      if (temporal_[i]) p.temporal.push_back(m.name);
      if (!meets_slo(m, lat)) p.at_risk.push_back(m.name);
    }
    return p;
  }

 private:
  struct lane_state {
    int32_t share = 0;
    std::vector<size_t> members;  // model indices, in joining order
  };
  struct evaluation {
    std::vector<std::vector<lane_prediction>> lanes;  // per device, per lane
  };

  lane_state& lane(size_t i, size_t k) { return dev_[models_[i].devices[k]][lane_of_[i][k]]; }

  int32_t used(int32_t d) const {
    int32_t s = 0;
    for (auto& l : dev_[d]) s += l.share;
    return s;
  }
  bool room(int32_t d, int32_t share) const {
    return static_cast<int32_t>(dev_[d].size()) < opts_.max_per_device && used(d) + share <= 100;
  }

  /// The share a model's steps run at: its smallest gpu-let's (100 while unplaced).
  int32_t run_share(size_t i) const {
    int32_t s = 100;
    for (size_t k = 0; k < lane_of_[i].size(); ++k)
      if (lane_of_[i][k] >= 0) s = std::min(s, dev_[models_[i].devices[k]][lane_of_[i][k]].share);
    return s;
  }

  size_t member_pos(size_t i, size_t k) const {
    const auto& mem = dev_[models_[i].devices[k]][lane_of_[i][k]].members;
    return static_cast<size_t>(std::find(mem.begin(), mem.end(), i) - mem.begin());
  }

  /// Lane g of device d, its steps `slowdown` slower; `extra` (a model and its share)
  /// joins it last when given.
  lane_prediction predict(int32_t d, size_t g, double slowdown,
                          std::optional<std::pair<size_t, int32_t>> extra = {}) const {
    std::vector<lane_member> mem;
    for (auto j : dev_[d][g].members)
      mem.push_back({&models_[j], slowed(step_at(models_[j], run_share(j)), slowdown)});
    if (extra)
      mem.push_back({&models_[extra->first],
                     slowed(step_at(models_[extra->first], extra->second), slowdown)});
    return predict_lane(mem, opts_.max_utilization);
  }

  /// All lanes with interference: each lane's slowdown follows from its partners' busy
  /// fractions, which grow with their slowdowns; iterated to a fixed point.
  evaluation evaluate() const {
    evaluation ev;
    std::vector<std::vector<double>> slow(dev_.size());
    for (size_t d = 0; d < dev_.size(); ++d) slow[d].assign(dev_[d].size(), 1.0);
    for (int iter = 0; iter < 100; ++iter) {
      ev.lanes.assign(dev_.size(), {});
      for (size_t d = 0; d < dev_.size(); ++d)
        for (size_t g = 0; g < dev_[d].size(); ++g)
          ev.lanes[d].push_back(predict(static_cast<int32_t>(d), g, slow[d][g]));
      double change = 0;
      for (size_t d = 0; d < dev_.size(); ++d) {
        double total = 0;
        for (auto& p : ev.lanes[d]) total += p.busy;
        for (size_t g = 0; g < dev_[d].size(); ++g) {
          const double s = interference_slowdown(opts_, total - ev.lanes[d][g].busy);
          change = std::max(change, std::abs(s - slow[d][g]));
          slow[d][g] = s;
        }
      }
      if (change < 1e-12) break;
    }
    return ev;
  }

  /// A model's latency: the worst of its gpu-lets' (its steps wait for all of them).
  double latency_of(size_t i, const evaluation& ev) const {
    double lat = 0;
    for (size_t k = 0; k < lane_of_[i].size(); ++k)
      lat = std::max(lat,
                     ev.lanes[models_[i].devices[k]][lane_of_[i][k]].latency_s[member_pos(i, k)]);
    return lat;
  }

  void add(size_t i, size_t k, int32_t g, int32_t share) {
    const int32_t d = models_[i].devices[k];
    if (g < 0) {
      dev_[d].push_back({share, {i}});
      g = static_cast<int32_t>(dev_[d].size()) - 1;
    } else {
      dev_[d][g].members.push_back(i);
      temporal_[i] = true;
    }
    lane_of_[i][k] = g;
  }

  void place(size_t i, int32_t want) {
    const auto& m = models_[i];
    const size_t n = m.devices.size();
    // Its own gpu-lets of its minimum share.
    if (std::all_of(m.devices.begin(), m.devices.end(), [&](int32_t d) { return room(d, want); })) {
      for (size_t k = 0; k < n; ++k) add(i, k, -1, want);
      return;
    }
    // Join gpu-lets of one share on all its devices (a new one where a device has room and
    // the model meets its SLO alone there): fewest new shares, then its lowest latency.
    struct option {
      int32_t share = 0, new_share = 0;
      double latency_s = inf;
      std::vector<int32_t> lanes;  // -1: a new gpu-let
    };
    std::optional<option> best;
    for (auto s : shares_) {
      option o{s, 0, 0, std::vector<int32_t>(n, -1)};
      bool ok = true;
      for (size_t k = 0; k < n && ok; ++k) {
        const int32_t d = m.devices[k];
        double lat = inf;
        for (size_t g = 0; g < dev_[d].size(); ++g) {
          if (dev_[d][g].share != s) continue;
          auto p = predict(d, g, 1.0, std::pair{i, s});
          bool fine = p.keeps_up;
          for (size_t j = 0; j < p.latency_s.size() && fine; ++j) {
            const auto& who = j < dev_[d][g].members.size() ? models_[dev_[d][g].members[j]] : m;
            if (who.slo_s > 0 && p.latency_s[j] > who.slo_s) fine = false;
          }
          if (fine && p.latency_s.back() < lat) lat = p.latency_s.back(), o.lanes[k] = g;
        }
        if (o.lanes[k] < 0 && room(d, s)) {
          auto p = predict_alone(m, s, 1.0, opts_.max_utilization);
          if (p.keeps_up && meets_slo(m, p.latency_s[0])) lat = p.latency_s[0], o.new_share += s;
        }
        ok = std::isfinite(lat);
        o.latency_s = std::max(o.latency_s, lat);
      }
      if (ok && (!best ||
                 std::pair{o.new_share, o.latency_s} < std::pair{best->new_share, best->latency_s}))
        best = o;
    }
    if (best) {
      for (size_t k = 0; k < n; ++k) add(i, k, best->lanes[k], best->share);
      return;
    }
    // Fits nowhere: its own gpu-let where a device has room for its share, else the least
    // busy gpu-let there (shares may then differ; its steps run at the smallest).
    for (size_t k = 0; k < n; ++k) {
      const int32_t d = m.devices[k];
      if (room(d, want)) {  // always so on a device without gpu-lets
        add(i, k, -1, want);
        continue;
      }
      int32_t g_best = 0;
      double busy = inf;
      for (size_t g = 0; g < dev_[d].size(); ++g) {
        const double b = predict(d, g, 1.0).busy;
        if (b < busy) busy = b, g_best = static_cast<int32_t>(g);
      }
      add(i, k, g_best, 0);
    }
  }

  const std::vector<gpulet_model>& models_;
  const gpulet_options& opts_;
  std::vector<int32_t> shares_;
  std::vector<std::vector<lane_state>> dev_;
  std::vector<std::vector<int32_t>> lane_of_;  // per model, per its device: lane index
  std::vector<bool> temporal_;                 // per model: shares a lane it joined
  std::vector<size_t> by_name_;                // model indices by name: every tie's order
};

}  // namespace

gpulet_plan plan_gpulets(const std::vector<gpulet_model>& models, const gpulet_options& opts) {
  if (check_gpulet_inputs(models, opts)) return {};
  planner p(models, opts);
  p.place_all();
  p.grow();
  p.spread_leftover();
  auto plan = p.result();
  // Where a share's speed scales about linearly (an emulated device), a partition gains no
  // speed, adds interference and splits the batching: time sharing can then keep more
  // models within their SLOs, and is the plan.
  auto whole = temporal_plan(models, opts);
  return whole.at_risk.size() < plan.at_risk.size() ? whole : plan;
}

gpulet_plan evaluate_plan(const gpulet_plan& plan, const std::vector<gpulet_model>& models,
                          const gpulet_options& opts) {
  if (check_gpulet_inputs(models, opts)) return {};
  planner p(models, opts);
  p.adopt(plan);
  return p.result();
}

gpulet_plan plan_lanes(const std::vector<std::vector<int32_t>>& partitions,
                       const std::vector<gpulet_model>& models, const gpulet_options& opts) {
  if (check_gpulet_inputs(models, opts)) return {};
  gpulet_plan p;
  p.partitions = partitions;
  p.partitions.resize(static_cast<size_t>(opts.device_count), std::vector<int32_t>{100});
  // Each model's lane index (the same on each of its devices), as the fixed partition's
  // lanes allow; every combination is judged (at most max_combinations), else models keep
  // lane 0 beyond that and are placed one by one.
  std::vector<int32_t> choices(models.size(), 1);
  for (size_t i = 0; i < models.size(); ++i) {
    int32_t n = 100;
    for (auto d : models[i].devices)
      n = std::min(n, static_cast<int32_t>(p.partitions[static_cast<size_t>(d)].size()));
    choices[i] = std::max(1, n);
  }
  constexpr uint64_t max_combinations = 1 << 14;
  // How good a plan is: fewer models at risk, then the lowest sum of latency over SLO (or
  // over one second where there is none), then the lower lanes (a stable order).
  auto score = [&](const gpulet_plan& e) {
    double sum = 0;
    for (auto& m : models) {
      auto l = e.predicted_latency_s.at(m.name);
      sum += std::isfinite(l) ? l / (m.slo_s > 0 ? m.slo_s : 1.0) : 1e9;
    }
    return std::make_pair(e.at_risk.size(), sum);
  };
  auto with = [&](const std::vector<int32_t>& pick) {
    for (size_t i = 0; i < models.size(); ++i)
      p.lane[models[i].name].assign(models[i].devices.size(), pick[i]);
    return evaluate_plan(p, models, opts);
  };
  std::vector<int32_t> pick(models.size(), 0), best = pick;
  auto best_score = score(with(pick));
  uint64_t total = 1;
  for (auto c : choices)
    total = std::min<uint64_t>(total * static_cast<uint64_t>(c), max_combinations + 1);
  if (total <= max_combinations) {
    for (uint64_t k = 1; k < total; ++k) {
      uint64_t x = k;
      for (size_t i = 0; i < models.size(); ++i) {
        pick[i] = static_cast<int32_t>(x % static_cast<uint64_t>(choices[i]));
        x /= static_cast<uint64_t>(choices[i]);
      }
      auto sc = score(with(pick));
      if (sc < best_score) {
        best_score = sc;
        best = pick;
      }
    }
  } else {
    for (size_t i = 0; i < models.size(); ++i)
      for (int32_t l = 1; l < choices[i]; ++l) {
        pick = best;
        pick[i] = l;
        auto sc = score(with(pick));
        if (sc < best_score) {
          best_score = sc;
          best = pick;
        }
      }
  }
  return with(best);
}

gpulet_plan temporal_plan(const std::vector<gpulet_model>& models, const gpulet_options& opts) {
  if (check_gpulet_inputs(models, opts)) return {};
  planner p(models, opts);
  p.all_in_time();
  return p.result();
}

}  // namespace computron::sched
