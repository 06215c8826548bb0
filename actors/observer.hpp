#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

/// What the actors tell the outside world as they work: metrics and the trace timeline
/// hang off this (net/ implements it with prometheus-cpp and a trace-event recorder), so
/// actors never depend on an exporter. Implementations must be thread-safe; every
/// method defaults to doing nothing.
namespace computron::actors {

/// Seconds on the steady clock since the first call in this process (trace timestamps).
double now_s();

class observer {
 public:
  virtual ~observer() = default;
  /// A request ended: "ok" or the error's code name, with its latency.
  virtual void request_done(const std::string& model, const std::string& outcome, double seconds) {}
  /// Requests waiting in the model's queue.
  virtual void queue_depth(const std::string& model, size_t depth) {}
  /// A batch of `rows` sequences ran on `devices` from `start_s` for `seconds`.
  virtual void batch_done(const std::string& model, const std::vector<int32_t>& devices,
                          size_t rows, double start_s, double seconds) {}
  /// One shard's load (or eviction) on one device.
  virtual void transfer_done(const std::string& model, int32_t device, bool load, uint64_t bytes,
                             double start_s, double seconds) {}
  /// The scheduler's accounting of a device after a change.
  virtual void device_usage(int32_t device, uint64_t used_bytes, uint64_t capacity_bytes,
                            size_t resident_models) {}
  /// Models resident anywhere.
  virtual void resident_models(size_t count) {}
  /// A model was registered with shards on `devices` (its per-model series start at 0).
  virtual void model_registered(const std::string& model, const std::vector<int32_t>& devices) {}
};

/// An observer that records nothing.
std::shared_ptr<observer> null_observer();

/// Fans every call out to several observers (metrics and trace together).
std::shared_ptr<observer> combine(std::vector<std::shared_ptr<observer>> parts);

}  // namespace computron::actors
