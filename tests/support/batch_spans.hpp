#pragma once

// An observer that keeps every batch's span (model, start, seconds): what the trace draws,
// so that tests can ask whether two models computed at the same time.
#include <mutex>
#include <string>
#include <vector>

#include "actors/observer.hpp"

namespace computron::test {

struct batch_spans final : actors::observer {
  struct span {
    std::string model;
    double start_s = 0, seconds = 0;
    /// The gpu-let of its first device it ran on.
    int32_t lane = 0;
  };
  std::mutex mtx;
  std::vector<span> all;

  void batch_done(const std::string& m, const std::vector<int32_t>&,
                  const std::vector<int32_t>& lanes, size_t, double start, double s) override {
    std::lock_guard<std::mutex> g{mtx};
    all.push_back({m, start, s, lanes.empty() ? 0 : lanes.front()});
  }
  /// Every span of model `m`, in the order they ended.
  std::vector<span> all_of(const std::string& m) {
    std::lock_guard<std::mutex> g{mtx};
    std::vector<span> out;
    for (auto& x : all)
      if (x.model == m) out.push_back(x);
    return out;
  }
  /// The first span of model `m` (empty if none).
  span of(const std::string& m) {
    auto xs = all_of(m);
    return xs.empty() ? span{} : xs.front();
  }
  void clear() {
    std::lock_guard<std::mutex> g{mtx};
    all.clear();
  }
};

inline bool overlap(const batch_spans::span& x, const batch_spans::span& y) {
  return x.start_s < y.start_s + y.seconds && y.start_s < x.start_s + x.seconds;
}

}  // namespace computron::test
