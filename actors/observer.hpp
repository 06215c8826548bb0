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

/// One request's timeline as LLM operators chart it (vLLM's meanings), reported when a
/// request that ran ends (a success, or a row cancelled while it ran).
struct request_timeline {
  /// From its arrival at the model's queue to leaving it (into a batch, or joining one).
  double queue_s = 0;
  /// Waiting for its model's load (a swap); 0 when the model was resident or it joined
  /// a running batch.
  double swap_s = 0;
  /// From its arrival to its first token; negative when it produced none.
  double ttft_s = -1;
  /// Between its consecutive tokens (inter-token latency), in order.
  std::vector<double> itl_s{};
  /// From its arrival to its answer.
  double e2e_s = 0;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  /// Why it ended: "stop", "length" or "cancelled".
  std::string finish_reason{};
};

class observer {
 public:
  virtual ~observer() = default;
  /// A request ended: "ok" or the error's code name, with its latency.
  virtual void request_done(const std::string& model, const std::string& outcome, double seconds) {}
  /// Requests waiting in the model's queue.
  virtual void queue_depth(const std::string& model, size_t depth) {}
  /// Rows of the model's batches running now.
  virtual void running_requests(const std::string& model, size_t rows) {}
  /// A running row of the model was preempted for KV room (it will be recomputed).
  virtual void preempted(const std::string& model) {}
  /// A chunk of joiners' prompts ran as a step of its own between a batch's steps
  /// (chunked prefill); `tokens`: the prompt tokens it computed.
  virtual void prefill_chunk(const std::string& model, int64_t tokens) {}
  /// KV bytes a device holds for running batches, and what is free of its budget beside
  /// the weights and the KV.
  virtual void kv_device(int32_t device, uint64_t kv_bytes, uint64_t free_bytes) {}
  /// KV blocks the model's running batches hold (on each of its shards).
  virtual void kv_model(const std::string& model, uint64_t blocks) {}
  /// A request that ran ended (after request_done): its timeline.
  virtual void request_timeline(const std::string& model, const request_timeline& t) {}
  /// A batch of `rows` sequences ran on `devices` from `start_s` for `seconds`, on the
  /// gpu-let `lanes[k]` of `devices[k]` (empty, or a position beyond it: lane 0, the
  /// whole device when it is not split).
  virtual void batch_done(const std::string& model, const std::vector<int32_t>& devices,
                          const std::vector<int32_t>& lanes, size_t rows, double start_s,
                          double seconds) {}
  /// The devices' gpu-lets: per device the shares (percent of its SMs) of its compute
  /// lanes, lane 0 first ({100}: not split). Reported when the manager starts and after
  /// every re-plan that took effect.
  virtual void gpulets(const std::vector<std::vector<int32_t>>& partitions) {}
  /// One shard's load (or eviction) on one device.
  virtual void transfer_done(const std::string& model, int32_t device, bool load, uint64_t bytes,
                             double start_s, double seconds) {}
  /// The scheduler's accounting of a device after a change.
  virtual void device_usage(int32_t device, uint64_t used_bytes, uint64_t capacity_bytes,
                            size_t resident_models) {}
  /// Bytes of pages device `device` itself has mapped, after a load or an eviction on it
  /// (the ledger's used and KV bytes for it never count less).
  virtual void device_mapped(int32_t device, uint64_t bytes) {}
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
