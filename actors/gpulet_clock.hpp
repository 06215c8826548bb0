#pragma once

// How an emulated device computes on gpu-lets: a lane of share s takes 100/s times what
// the whole device takes, slowed further while the device's other lanes are busy
// (sched::gpulet_seconds, the rule the simulator charges). The worker's compute lanes
// share one clock per device. On a GPU, whose green contexts slow by themselves, the clock
// only measures how busy each step's partners were.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "sched/gpulets.hpp"

namespace computron::actors {

class gpulet_clock {
 public:
  using clock = std::chrono::steady_clock;

  /// Lane `lane` starts a job.
  void begin(int32_t lane) {
    std::lock_guard<std::mutex> g{mtx_};
    auto now = clock::now();
    auto& u = lanes_[lane];
    u.since = now;
    u.partners_at_begin = partners_busy(lane, now);
  }

  /// The lane's job computed for `whole_s` seconds at the whole device's speed: the
  /// seconds a gpu-let of `share` takes for it with the partners' busy time meanwhile,
  /// by the plan's interference factor (each step carries it). The lane waits out the
  /// difference before end().
  double seconds(int32_t lane, int32_t share, double whole_s, const sched::gpulet_options& plan) {
    return sched::gpulet_seconds(plan, whole_s, share, partner_fraction(lane));
  }

  /// The fraction of the lane's job so far during which its partners were busy (0..1).
  double partner_fraction(int32_t lane) {
    std::lock_guard<std::mutex> g{mtx_};
    auto now = clock::now();
    auto& u = lanes_[lane];
    double span = u.since ? std::chrono::duration<double>(now - *u.since).count() : 0;
    double busy = partners_busy(lane, now) - u.partners_at_begin;
    return span > 0 ? std::clamp(busy / span, 0.0, 1.0) : 0;
  }

  /// The lane's job ended (its wait included).
  void end(int32_t lane) {
    std::lock_guard<std::mutex> g{mtx_};
    auto& u = lanes_[lane];
    if (u.since) u.busy_s += std::chrono::duration<double>(clock::now() - *u.since).count();
    u.since.reset();
  }

 private:
  struct lane_use {
    double busy_s = 0;
    std::optional<clock::time_point> since{};
    double partners_at_begin = 0;
  };

  /// Seconds the other lanes have been busy in all, up to `now`.
  double partners_busy(int32_t lane, clock::time_point now) const {
    double s = 0;
    for (auto& [l, u] : lanes_) {
      if (l == lane) continue;
      s += u.busy_s;
      if (u.since) s += std::chrono::duration<double>(now - *u.since).count();
    }
    return s;
  }

  std::mutex mtx_;
  std::map<int32_t, lane_use> lanes_;
};

}  // namespace computron::actors
