#include "engine/toy/toy_backend.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace computron::engine {

namespace {

/// Longest a layer waits for its bytes (the load's own timeout ends it sooner).
constexpr auto layer_wait = std::chrono::minutes{10};

class toy_backend final : public backend {
 public:
  toy_backend(toy_shard s, gpu::weight_shard& w, gpu::collective& g)
      : spec_(std::move(s)), weights_(w), group_(g) {}

  caf::expected<models::host_tensor> run(const step_input& in, const std::vector<int32_t>& keep,
                                         const std::vector<std::vector<uint32_t>>&,
                                         const models::host_tensor* hidden,
                                         const std::vector<models::device_draw>*) override {
    const bool first = spec_.stage == 0;
    const bool last = spec_.stage == spec_.stages - 1;
    const size_t rows = in.rows();
    if (rows == 0) return make_error(ec::invalid_request, "toy: empty batch");
    const uint64_t n = weights_.size_bytes();
    const double stage_ms = spec_.compute_ms / static_cast<double>(spec_.stages);
    if (weights_.state() == gpu::residency::resident) {
      // One sleep, not one per layer: each would overshoot by the timer's slack.
      if (stage_ms > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(stage_ms));
    } else {
      // Still loading: layer by layer, each waits for its share of the shard, then
      // computes its share of the stage's time (as a GPU stream would be busy).
      for (int l = 0; l < toy_layers_per_stage; ++l) {
        auto need = n * static_cast<uint64_t>(l + 1) / toy_layers_per_stage;
        if (auto err = weights_.wait_bytes(need, layer_wait)) return err;
        if (stage_ms > 0)
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(stage_ms / toy_layers_per_stage));
      }
    }
    std::vector<float> x(rows);
    if (first) {
      for (size_t r = 0; r < rows; ++r) {
        int64_t v = 0;
        if (in.prefills())
          for (auto t : in.prompts[r]) v += t;
        else
          v = in.tokens[r];
        x[r] = static_cast<float>(((v % toy_vocab) + toy_vocab) % toy_vocab);
      }
    } else {
      if (!hidden || hidden->bytes.size() != rows * sizeof(float))
        return make_error(ec::invalid_request, "toy: hidden states do not match the batch");
      std::memcpy(x.data(), hidden->bytes.data(), rows * sizeof(float));
    }
    auto with = row_adapters(in, keep, rows);
    if (!with) return with.error();
    // The last step of a batch: nothing of it stays (as the decoder's caches go).
    if (in.last) rows_.erase(in.plan.batch);
    // Each rank adds one byte of its device copy; the all-reduce sums the ranks.
    std::vector<float> partial(rows);
    uint8_t window[64] = {};
    const uint64_t len = std::min<uint64_t>(n, sizeof(window));
    const uint64_t offset = (static_cast<uint64_t>(in.step) * 7919) % (n - len + 1);
    if (auto err = read_window(weights_, offset, window, len)) return err;
    for (size_t r = 0; r < rows; ++r)
      // The byte depends on the row's own value, never on its position in the batch.
      partial[r] = (group_.rank() == 0 ? x[r] : 0.0f) +
                   static_cast<float>(window[static_cast<uint64_t>(x[r]) % len]);
    // A row's LoRA adapter adds a byte of its own shard on every rank: its rows answer
    // differently from the base's, and from another adapter's.
    for (size_t r = 0; r < rows; ++r) {
      auto* a = (*with)[r].get();
      if (!a) continue;
      if (auto err = a->wait_loaded(layer_wait)) return err;
      uint8_t byte = 0;
      if (auto err = read_window(*a, static_cast<uint64_t>(x[r]) % a->size_bytes(), &byte, 1))
        return err;
      partial[r] += static_cast<float>(byte) + 1.0f;
    }
    if (auto err = group_.all_reduce_sum(partial.data(), rows)) return err;
    for (auto& v : partial) v = std::fmod(v, static_cast<float>(toy_vocab));
    models::host_tensor out;
    out.type = gpu::dtype::f32;
    if (!last) {
      out.shape = {static_cast<int64_t>(rows), 1};
      out.bytes.resize(rows * sizeof(float));
      std::memcpy(out.bytes.data(), partial.data(), out.bytes.size());
      return out;
    }
    // Logits peak at the token the sum names, so greedy picks it.
    out.shape = {static_cast<int64_t>(rows), toy_vocab};
    out.bytes.resize(rows * toy_vocab * sizeof(float));
    auto* logits = reinterpret_cast<float*>(out.bytes.data());
    for (size_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < toy_vocab; ++j)
        logits[r * toy_vocab + j] = -std::fabs(static_cast<float>(j) - partial[r]);
    return out;
  }

  void end_batch(uint64_t batch_id) override { rows_.erase(batch_id); }

  caf::error join_batch(uint64_t from, uint64_t into) override {
    auto f = rows_.find(from);
    if (f == rows_.end()) return {};
    auto moved = std::move(f->second);
    rows_.erase(f);
    auto& to = rows_[into];
    to.insert(to.end(), moved.begin(), moved.end());
    return {};
  }

  caf::error bind_adapter(const std::string& name,
                          std::shared_ptr<gpu::weight_shard> weights) override {
    adapters_[name] = std::move(weights);
    return {};
  }

  void unbind_adapter(const std::string& name) override { adapters_.erase(name); }

 private:
  using adapter_ptr = std::shared_ptr<gpu::weight_shard>;

  /// The adapter of each of the step's `rows` (null: the base alone): named at step 0
  /// (in.adapters), then the batch's, kept and joined as its rows are.
  caf::expected<std::vector<adapter_ptr>> row_adapters(const step_input& in,
                                                       const std::vector<int32_t>& keep,
                                                       size_t rows) {
    auto& mine = rows_[in.plan.batch];
    if (in.prefills()) {
      if (!in.adapters.empty() && in.adapters.size() != rows)
        return make_error(ec::invalid_request, "toy: a step names " +
                                                   std::to_string(in.adapters.size()) +
                                                   " rows' adapters for " + std::to_string(rows));
      mine.assign(rows, nullptr);
      for (size_t r = 0; r < in.adapters.size(); ++r) {
        if (in.adapters[r].empty()) continue;
        auto a = adapters_.find(in.adapters[r]);
        if (a == adapters_.end())
          return make_error(ec::invalid_request,
                            "toy: adapter " + in.adapters[r] + " is not bound to " + spec_.model);
        mine[r] = a->second;
      }
      return mine;
    }
    if (!keep.empty()) {
      std::vector<adapter_ptr> kept;
      for (auto k : keep)
        if (k >= 0 && static_cast<size_t>(k) < mine.size()) kept.push_back(mine[k]);
      mine = std::move(kept);
    }
    if (mine.size() != rows)
      return make_error(ec::invalid_request, "toy: batch " + std::to_string(in.plan.batch) +
                                                 " has " + std::to_string(mine.size()) +
                                                 " rows, its step " + std::to_string(rows));
    return mine;
  }

  /// Emulated device memory is host memory: read it in place, as a GPU kernel reads its
  /// own memory. read_back would queue behind every copy in flight on the device's link
  /// (other models' loads), which no compute on a real GPU waits for.
  caf::error read_window(gpu::weight_shard& w, uint64_t offset, uint8_t* dst, uint64_t len) {
    if (w.dev().info().kind != gpu::device_kind::emulated) return w.read_back(offset, dst, len);
    if (w.state() != gpu::residency::resident)
      return make_error(ec::not_resident,
                        "toy: a shard of " + spec_.model + " is " + gpu::to_string(w.state()));
    auto base = w.device_data();
    if (!base) return base.error();
    std::memcpy(dst, *base + offset, len);
    return {};
  }

  toy_shard spec_;
  gpu::weight_shard& weights_;
  gpu::collective& group_;
  std::unordered_map<std::string, adapter_ptr> adapters_;
  /// Per batch, its rows' adapters (a stage keeps no other state of a batch).
  std::unordered_map<uint64_t, std::vector<adapter_ptr>> rows_;
};

}  // namespace

std::unique_ptr<backend> make_toy_backend(toy_shard s, gpu::weight_shard& w, gpu::collective& g) {
  return std::make_unique<toy_backend>(std::move(s), w, g);
}

}  // namespace computron::engine
