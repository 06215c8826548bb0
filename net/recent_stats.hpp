#pragma once

#include <chrono>
#include <deque>
#include <mutex>
#include <string>

#include <caf/settings.hpp>

#include "actors/observer.hpp"

namespace computron::net {

/// The requests of the last minute, for the console's `stats`: throughput and latency
/// percentiles computed from the requests themselves (Prometheus histograms only give
/// bucket bounds). Bounded: at most `max_requests` are kept.
class recent_stats final : public actors::observer {
 public:
  explicit recent_stats(std::chrono::seconds window = std::chrono::seconds(60),
                        size_t max_requests = 100000)
      : window_(window), max_(max_requests) {}

  void request_done(const std::string& model, const std::string& outcome, double seconds) override;

  /// window-s, requests, ok, failed, throughput-rps (ok per second over the window, or
  /// since the first request when that is shorter), p50-ms, p90-ms, p99-ms (of the ok
  /// ones).
  caf::settings summary() const;

 private:
  struct done {
    std::chrono::steady_clock::time_point at;
    double seconds;
    bool ok;
  };
  void trim(std::chrono::steady_clock::time_point now) const;

  std::chrono::seconds window_;
  size_t max_;
  mutable std::mutex mtx_;
  mutable std::deque<done> done_;
};

}  // namespace computron::net
