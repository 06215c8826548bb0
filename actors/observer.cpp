#include "actors/observer.hpp"

namespace computron::actors {

namespace {

class fan_out final : public observer {
 public:
  explicit fan_out(std::vector<std::shared_ptr<observer>> parts) : parts_(std::move(parts)) {}
  void request_done(const std::string& m, const std::string& o, double s) override {
    for (auto& p : parts_) p->request_done(m, o, s);
  }
  void queue_depth(const std::string& m, size_t d) override {
    for (auto& p : parts_) p->queue_depth(m, d);
  }
  void running_requests(const std::string& m, size_t rows) override {
    for (auto& p : parts_) p->running_requests(m, rows);
  }
  void request_timeline(const std::string& m, const struct request_timeline& t) override {
    for (auto& p : parts_) p->request_timeline(m, t);
  }
  void batch_done(const std::string& m, const std::vector<int32_t>& d,
                  const std::vector<int32_t>& lanes, size_t rows, double start, double s) override {
    for (auto& p : parts_) p->batch_done(m, d, lanes, rows, start, s);
  }
  void gpulets(const std::vector<std::vector<int32_t>>& partitions) override {
    for (auto& p : parts_) p->gpulets(partitions);
  }
  void transfer_done(const std::string& m, int32_t d, bool load, uint64_t bytes, double start,
                     double s) override {
    for (auto& p : parts_) p->transfer_done(m, d, load, bytes, start, s);
  }
  void device_usage(int32_t d, uint64_t used, uint64_t cap, size_t n) override {
    for (auto& p : parts_) p->device_usage(d, used, cap, n);
  }
  void prefill_chunk(const std::string& m, int64_t tokens) override {
    for (auto& p : parts_) p->prefill_chunk(m, tokens);
  }
  void preempted(const std::string& m) override {
    for (auto& p : parts_) p->preempted(m);
  }
  void device_mapped(int32_t d, uint64_t bytes) override {
    for (auto& p : parts_) p->device_mapped(d, bytes);
  }
  void kv_device(int32_t d, uint64_t kv, uint64_t free) override {
    for (auto& p : parts_) p->kv_device(d, kv, free);
  }
  void kv_model(const std::string& m, uint64_t blocks) override {
    for (auto& p : parts_) p->kv_model(m, blocks);
  }
  void resident_models(size_t n) override {
    for (auto& p : parts_) p->resident_models(n);
  }
  void model_registered(const std::string& m, const std::vector<int32_t>& d) override {
    for (auto& p : parts_) p->model_registered(m, d);
  }

 private:
  std::vector<std::shared_ptr<observer>> parts_;
};

}  // namespace

double now_s() {
  static const auto t0 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::shared_ptr<observer> null_observer() {
  return std::make_shared<observer>();
}

std::shared_ptr<observer> combine(std::vector<std::shared_ptr<observer>> parts) {
  return std::make_shared<fan_out>(std::move(parts));
}

}  // namespace computron::actors
