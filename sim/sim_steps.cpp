// What takes time in the simulator: a load's or eviction's shards over their links (each
// stage's bytes as they arrive), and a forward step: every stage in order on its devices' compute
// lanes (gpu-lets at their share, slowed by busy partners), each layer of a stage still loading
// after its bytes (simulator.cpp carries the steps out).
#include <algorithm>

#include "sched/dispatch.hpp"
#include "sched/gpulets.hpp"
#include "sim/sim_records.hpp"

namespace computron::sim::detail {

time_point::duration ready_after(const sim_config& cfg, time_point::duration span, uint64_t bytes,
                                 int64_t num, int64_t den) {
  const auto c = cfg.chunk_bytes;
  if (c == 0 || bytes == 0) return span * num / den;
  const auto need = bytes * static_cast<uint64_t>(num) / static_cast<uint64_t>(den);
  const auto upto = std::min(bytes, (need + c - 1) / c * c);
  return std::chrono::duration_cast<time_point::duration>(
      span * (static_cast<double>(upto) / static_cast<double>(bytes)));
}

time_point step_end(const lanes_view& v, uint32_t model, const std::vector<stage_load>& loads,
                    time_point start, int64_t tokens, double& compute_s) {
  const auto& cfg_ = v.cfg;
  auto& device_free_ = v.device_free;
  const auto lanes_ = v.lanes;
  const auto* disp_ = &v.disp;
  auto& sm = cfg_.models[model];
  const auto pp = static_cast<size_t>(sm.pp);
  const auto layers = static_cast<int64_t>(sm.layers);
  auto t = start;
  double stage_s =
      (sm.step_s + sm.step_per_token_s * static_cast<double>(tokens)) / static_cast<double>(pp) +
      cfg_.cost.stage_overhead_s;
  const auto& lanes = disp_->lanes_of(model);
  for (size_t k = 0; k < pp; ++k) {
    // A stage runs on its devices' compute lanes (the model's gpu-let of each; the
    // whole device without gpu-lets), one job at a time per lane, whichever model the
    // job is of.
    const auto tp = static_cast<size_t>(sm.tp);
    auto unit = [&](size_t r) {
      auto pos = k * tp + r;
      return static_cast<size_t>(sm.devices[pos]) * lanes_ +
             static_cast<size_t>(pos < lanes.size() ? lanes[pos] : 0);
    };
    for (size_t r = 0; r < tp; ++r) t = std::max(t, device_free_[unit(r)]);
    // On a gpu-let the stage takes its share's time, slowed while the device's other
    // lanes are busy (the runtime's emulated lanes wait out the same).
    double took_s = stage_s;
    if (lanes_ > 1 || disp_->share_of(model, k * tp) < 100) {
      for (size_t r = 0; r < tp; ++r) {
        auto share = disp_->share_of(model, k * tp + r);
        double alone = stage_s * 100.0 / std::max(1, share);
        auto dev = static_cast<size_t>(sm.devices[k * tp + r]);
        double partners = 0;
        for (size_t l = 0; l < lanes_; ++l)
          if (dev * lanes_ + l != unit(r))
            partners += std::max(0.0, sched::seconds_between(t, device_free_[dev * lanes_ + l]));
        took_s = std::max(took_s, sched::gpulet_seconds(cfg_.gpulets.plan, stage_s, share,
                                                        alone > 0 ? partners / alone : 0));
      }
    }
    if (t >= loads[k].to) {
      t += sched::from_seconds(took_s);
    } else {
      // The stage's bytes still arrive: layer i waits for the chunk holding the last
      // of the first (i+1)/layers of them.
      auto span = loads[k].to - loads[k].from;
      for (int64_t i = 0; i < layers; ++i) {
        t = std::max(t, loads[k].from + ready_after(cfg_, span, loads[k].bytes, i + 1, layers));
        t += sched::from_seconds(took_s / static_cast<double>(layers));
      }
    }
    for (size_t r = 0; r < tp; ++r) device_free_[unit(r)] = t;
    compute_s += took_s;
  }
  return t;
}

double transfer(const sim_config& cfg, uint32_t m, bool load, time_point now,
                std::vector<stage_load>& stages, std::vector<workload::device_traffic>& traffic,
                std::vector<workload::swap_event>* swaps, double at_s) {
  auto& sm = cfg.models[m];
  double longest = 0;
  if (load)
    for (auto& st : stages) st = {now + sched::from_seconds(cfg.cost.load_overhead_s), now, 0};
  for (size_t k = 0; k < sm.devices.size(); ++k) {
    auto d = static_cast<size_t>(sm.devices[k]);
    double secs = load ? load_seconds(cfg.cost, sm.shard_bytes[k], cfg.devices[d].link_gbps)
                       : cfg.cost.evict_s;
    longest = std::max(longest, secs);
    if (load) {
      auto& st = stages[k / static_cast<size_t>(sm.tp)];
      st.to = std::max(st.to, now + sched::from_seconds(secs));
      st.bytes = std::max(st.bytes, sm.shard_bytes[k]);
    }
    auto& t = traffic[d];
    if (load) {
      t.shard_loads += 1;
      t.bytes_loaded += static_cast<double>(sm.shard_bytes[k]);
      t.load_seconds += secs;
    } else {
      t.evictions += 1;
      t.evict_seconds += secs;
    }
    if (swaps) swaps->push_back({sm.name, sm.devices[k], load, at_s, secs, sm.shard_bytes[k]});
  }
  return longest;
}

}  // namespace computron::sim::detail
