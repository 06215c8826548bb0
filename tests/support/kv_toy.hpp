#pragma once

// A test engine: the toy engine with KV blocks of a given size per shard, so that the
// manager and the scheduler count its batches' KV in the ledger (the toy keeps none).
#include <memory>
#include <vector>

#include "actors/engine.hpp"

namespace computron::testing {

/// The toy engine with KV blocks of `block_bytes` per shard (the toy itself keeps none).
class kv_toy final : public actors::model_kind {
 public:
  explicit kv_toy(uint64_t block_bytes) : toy_(actors::make_toy_engine()), block_(block_bytes) {}
  caf::error validate(const actors::model_config& cfg,
                      const std::vector<gpu::device_kind>& placed) const override {
    return toy_->validate(cfg, placed);
  }
  int64_t vocab(const actors::model_config& cfg) const override { return toy_->vocab(cfg); }
  int64_t max_positions(const actors::model_config& cfg) const override {
    return toy_->max_positions(cfg);
  }
  caf::expected<gpu::tensor_table> layout(const actors::shard_spec& s) const override {
    return toy_->layout(s);
  }
  uint64_t kv_block_bytes(const actors::shard_spec&) const override { return block_; }
  caf::error fill(const actors::shard_spec& s, gpu::weight_shard& w) const override {
    return toy_->fill(s, w);
  }
  caf::expected<std::unique_ptr<actors::backend>> make_backend(const actors::shard_spec& s,
                                                               gpu::weight_shard& w,
                                                               gpu::collective& g) const override {
    return toy_->make_backend(s, w, g);
  }

 private:
  std::shared_ptr<const actors::model_kind> toy_;
  uint64_t block_;
};

}  // namespace computron::testing
