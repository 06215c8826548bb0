#include "net/recent_stats.hpp"

#include <algorithm>
#include <vector>

#include "workload/stats.hpp"

namespace computron::net {

void recent_stats::trim(std::chrono::steady_clock::time_point now) const {
  while (!done_.empty() && (now - done_.front().at > window_ || done_.size() > max_))
    done_.pop_front();
}

void recent_stats::request_done(const std::string&, const std::string& outcome, double seconds) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> guard{mtx_};
  done_.push_back({now, seconds, outcome == "ok"});
  trim(now);
}

caf::settings recent_stats::summary() const {
  auto now = std::chrono::steady_clock::now();
  std::vector<double> ok_ms;
  int64_t failed = 0;
  double span_s = 0;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    trim(now);
    for (auto& d : done_) {
      if (d.ok)
        ok_ms.push_back(d.seconds * 1e3);
      else
        ++failed;
    }
    if (!done_.empty()) span_s = std::chrono::duration<double>(now - done_.front().at).count();
  }
  caf::settings s;
  auto window_s = static_cast<double>(window_.count());
  s["window-s"] = caf::config_value{window_s};
  s["requests"] = caf::config_value{static_cast<int64_t>(ok_ms.size()) + failed};
  s["ok"] = caf::config_value{static_cast<int64_t>(ok_ms.size())};
  s["failed"] = caf::config_value{failed};
  auto over = std::max(1.0, std::min(window_s, span_s));
  s["throughput-rps"] = caf::config_value{static_cast<double>(ok_ms.size()) / over};
  s["p50-ms"] = caf::config_value{workload::percentile(ok_ms, 0.5)};
  s["p90-ms"] = caf::config_value{workload::percentile(ok_ms, 0.9)};
  s["p99-ms"] = caf::config_value{workload::percentile(ok_ms, 0.99)};
  return s;
}

}  // namespace computron::net
