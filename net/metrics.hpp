#pragma once

#include <memory>
#include <string>

#include "actors/observer.hpp"

/// Prometheus metrics (prometheus-cpp) fed by the actors through the observer hooks;
/// prometheus stays out of this header.
namespace computron::net {

class metrics final : public actors::observer {
 public:
  metrics();
  ~metrics() override;

  /// Every metric in Prometheus' text exposition format (GET /metrics).
  std::string render() const;

  void request_done(const std::string& model, const std::string& outcome, double seconds) override;
  void queue_depth(const std::string& model, size_t depth) override;
  void running_requests(const std::string& model, size_t rows) override;
  void preempted(const std::string& model) override;
  void prefill_chunk(const std::string& model, int64_t tokens) override;
  void kv_device(int32_t device, uint64_t kv_bytes, uint64_t free_bytes) override;
  void device_mapped(int32_t device, uint64_t bytes) override;
  void kv_model(const std::string& model, uint64_t blocks) override;
  void request_timeline(const std::string& model, const actors::request_timeline& t) override;
  /// An HTTP response went out: counted by status code (refusals included, 4xx too) and
  /// route family ("openai", "kserve", "control", "other").
  void http_response(const std::string& route, int status);
  void batch_done(const std::string& model, const std::vector<int32_t>& devices,
                  const std::vector<int32_t>& lanes, size_t rows, double start_s,
                  double seconds) override;
  void gpulets(const std::vector<std::vector<int32_t>>& partitions) override;
  void transfer_done(const std::string& model, int32_t device, bool load, uint64_t bytes,
                     double start_s, double seconds) override;
  void device_usage(int32_t device, uint64_t used_bytes, uint64_t capacity_bytes,
                    size_t resident_models) override;
  void resident_models(size_t count) override;
  void model_registered(const std::string& model, const std::vector<int32_t>& devices) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace computron::net
