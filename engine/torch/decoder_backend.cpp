#include "engine/torch/decoder_backend.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "engine/sampling.hpp"
#include "sched/kv_blocks.hpp"

namespace computron::engine {

namespace {

class decoder_backend final : public backend {
 public:
  explicit decoder_backend(std::unique_ptr<models::decoder_stage> stage)
      : stage_(std::move(stage)) {}

  caf::expected<models::host_tensor> run(const step_input& req, const std::vector<int32_t>& keep,
                                         const std::vector<std::vector<uint32_t>>& tables,
                                         const models::host_tensor* hidden) override {
    const auto batch = req.plan.batch;
    if (req.plan.kv_blocks > 0) stage_->set_kv_budget(static_cast<int64_t>(req.plan.kv_blocks));
    auto& cache = caches_[batch];
    if (!req.prefills() && !keep.empty()) {
      // Rows that finished left the batch: their keys and values go too.
      std::vector<int64_t> rows(keep.begin(), keep.end());
      if (auto err = cache.keep_rows(rows)) {
        end_batch(batch);
        return err;
      }
    }
    caf::expected<models::host_tensor> out{models::host_tensor{}};
    if (req.prefills() && req.plan.chunk > 0) {
      // A chunk of a chunked prefill: the first one chooses the batch's head as a one-step
      // prefill does; the others carry on with it (they may carry no settings).
      if (models::first_prefill_chunk(req.prompts, req.plan.left, req.plan.chunk)) {
        for (auto& s : req.sampling)
          if (s.prompt_logprobs >= 0) {
            end_batch(batch);
            return make_error(ec::invalid_request,
                              "prompt log-probabilities need the prompt prefilled in one step, "
                              "not in chunks");
          }
        choose_head(req);
      }
      auto ids = adapter_ids(req);
      if (!ids) {
        end_batch(batch);
        return ids.error();
      }
      out = stage_->prefill_chunk(req.prompts, req.plan.left, req.plan.chunk, hidden, cache,
                                  head_of(batch), *ids);
    } else if (req.prefills()) {
      // Rows that ask for their prompt's log-probabilities get their positions' logits.
      std::vector<bool> score;
      for (auto& s : req.sampling) score.push_back(s.prompt_logprobs >= 0);
      choose_head(req);
      auto ids = adapter_ids(req);
      if (!ids) {
        end_batch(batch);
        return ids.error();
      }
      out = stage_->prefill(req.prompts, hidden, cache, score, head_of(batch), *ids);
    } else {
      out = stage_->decode(req.tokens, hidden, cache, head_of(batch));
    }
    if (out && !req.last) {
      // The pool places the blocks itself (a page table of its own); the runner's tables,
      // named by the dispatch core, must cover what the cache holds all the same.
      auto lengths = cache.lengths();
      if (lengths.size() != tables.size())
        out = make_error(ec::invalid_state,
                         fmt::format("batch {}: the KV cache holds {} rows and the step's "
                                     "tables {}",
                                     batch, lengths.size(), tables.size()));
      for (size_t r = 0; out && r < lengths.size(); ++r)
        if (static_cast<size_t>(sched::kv_blocks_for(lengths[r])) > tables[r].size())
          out = make_error(ec::invalid_state,
                           fmt::format("batch {} row {}: {} positions cached, {} KV blocks named",
                                       batch, r, lengths[r], tables[r].size()));
    }
    if (req.last || !out) end_batch(batch);
    return out;
  }

  void end_batch(uint64_t batch_id) override {
    caches_.erase(batch_id);
    top_.erase(batch_id);
  }

  uint64_t kv_device_bytes() const override { return stage_->kv_blocks().device_bytes; }

  caf::error join_batch(uint64_t from, uint64_t into) override {
    auto f = caches_.find(from);
    auto i = caches_.find(into);
    if (f == caches_.end() || i == caches_.end()) {
      end_batch(from);
      return make_error(ec::invalid_request, "joining batch " + std::to_string(from) + " into " +
                                                 std::to_string(into) + ": no such batch here");
    }
    auto err = i->second.append(std::move(f->second));
    // Candidates only while every row of the joined batch needs no more than them.
    auto a = head_of(into).top, b = head_of(from).top;
    if (a > 0 && b > 0)
      top_[into] = std::max(a, b);
    else
      top_.erase(into);
    end_batch(from);
    return err;
  }

 private:
  /// Step 0's settings choose the batch's head: the most candidates a row needs, or whole
  /// rows when some row needs them. Every rank of the stage got the same settings, so all
  /// take the same head (and make the same collective calls). The batch keeps it: later
  /// steps carry none.
  void choose_head(const step_input& req) {
    int64_t top = req.sampling.empty() ? 0 : 1;
    for (auto& s : req.sampling) {
      auto k = candidates_of(s);
      top = k == 0 || top == 0 ? 0 : std::max(top, k);
    }
    if (top > 0)
      top_[req.plan.batch] = top;
    else
      top_.erase(req.plan.batch);  // a batch id used again starts afresh
  }

  models::head_output head_of(uint64_t batch_id) const {
    auto i = top_.find(batch_id);
    return models::head_output{i == top_.end() ? 0 : i->second};
  }

  /// The stage's adapter id of each row of a prefill (0: the base alone; empty: all).
  caf::expected<std::vector<int64_t>> adapter_ids(const step_input& req) const {
    std::vector<int64_t> ids;
    if (req.adapters.empty()) return ids;
    if (req.adapters.size() != req.prompts.size())
      return make_error(ec::invalid_request,
                        fmt::format("a step names {} rows' adapters for {} prompts",
                                    req.adapters.size(), req.prompts.size()));
    for (auto& name : req.adapters) {
      if (name.empty()) {
        ids.push_back(0);
        continue;
      }
      auto a = adapters_.find(name);
      if (a == adapters_.end())
        return make_error(ec::invalid_request, "adapter " + name + " is not bound to this model");
      ids.push_back(a->second.id);
    }
    return ids;
  }

 public:
  caf::error bind_adapter(const std::string& name,
                          std::shared_ptr<gpu::weight_shard> weights) override {
    auto a = adapters_.find(name);
    if (a != adapters_.end()) {
      if (a->second.weights == weights) return {};
      // Registered again (other weights under the name): the old rows' id goes with the
      // old shard, so no row, and no cache, mixes the two.
      unbind_adapter(name);
    }
    // r: the rows of any lora_A tensor (every pair of an adapter has the same rank).
    int64_t rank = 0;
    for (auto& t : weights->table().entries())
      if (t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".lora_A") == 0 &&
          !t.shape.empty()) {
        rank = t.shape.front();
        break;
      }
    auto id = next_adapter_++;
    if (auto err = stage_->attach_adapter(id, *weights, rank))
      return with_context(err, "adapter " + name);
    adapters_[name] = bound_adapter{id, std::move(weights)};
    return {};
  }

  void unbind_adapter(const std::string& name) override {
    auto a = adapters_.find(name);
    if (a == adapters_.end()) return;
    (void)stage_->detach_adapter(a->second.id);
    adapters_.erase(a);
  }

 private:
  struct bound_adapter {
    int64_t id = 0;
    std::shared_ptr<gpu::weight_shard> weights;
  };

  std::unique_ptr<models::decoder_stage> stage_;
  /// Bound adapters by name, with the ids the stage knows them by (never reused: a row's
  /// id names one adapter's weights for the batch's life).
  std::unordered_map<std::string, bound_adapter> adapters_;
  int64_t next_adapter_ = 1;
  std::unordered_map<uint64_t, models::kv_cache> caches_;
  /// Batches whose rows need only candidates: how many the last stage returns.
  std::unordered_map<uint64_t, int64_t> top_;
};

}  // namespace

std::unique_ptr<backend> make_decoder_backend(std::unique_ptr<models::decoder_stage> stage) {
  return std::make_unique<decoder_backend>(std::move(stage));
}

}  // namespace computron::engine
