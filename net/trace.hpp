#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/observer.hpp"

/// A Chrome trace-event timeline (opens in Perfetto / chrome://tracing) of loads,
/// evictions and batches, one track per device (per gpu-let of a device split into
/// gpu-lets), and a memory counter per device: weights, KV blocks and what is free of the
/// scheduler's budget.
namespace computron::net {

class trace_recorder final : public actors::observer {
 public:
  /// Keeps the newest `max_events` events (older ones are dropped, so memory is bounded).
  explicit trace_recorder(size_t max_events = 200000) : max_events_(max_events) {}

  /// The timeline as trace-event JSON.
  std::string to_json() const;

  /// Writes to_json() to `path`; false when the file cannot be written.
  bool write(const std::string& path) const;

  /// Drops every event so far: the timeline starts now (the console's `trace start`).
  void clear();

  /// A batch's span on each of its devices, on the track of its gpu-let there.
  void batch_done(const std::string& model, const std::vector<int32_t>& devices,
                  const std::vector<int32_t>& lanes, size_t rows, double start_s,
                  double seconds) override;
  void gpulets(const std::vector<std::vector<int32_t>>& partitions) override;
  void transfer_done(const std::string& model, int32_t device, bool load, uint64_t bytes,
                     double start_s, double seconds) override;
  void device_usage(int32_t device, uint64_t used_bytes, uint64_t capacity_bytes,
                    size_t resident_models) override;
  void kv_device(int32_t device, uint64_t kv_bytes, uint64_t free_bytes) override;

 private:
  struct event {
    std::string name;
    std::string category;
    int32_t device;
    /// The gpu-let of the device it ran on (0: the whole device when it is not split).
    int32_t lane;
    double start_s;
    double seconds;
    std::string args;
    /// "X" (a span) or "C" (a counter sample at start_s).
    const char* phase = "X";
  };
  void add(event e);

  size_t max_events_;
  mutable std::mutex mtx_;
  std::deque<event> events_;
  /// Weights' bytes per device as last reported (kv_device follows device_usage).
  std::map<int32_t, uint64_t> weights_;
  /// The devices' gpu-lets as last reported (per device the shares of its lanes).
  std::vector<std::vector<int32_t>> partitions_;
};

}  // namespace computron::net
