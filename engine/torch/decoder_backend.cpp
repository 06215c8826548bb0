#include "engine/torch/decoder_backend.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "engine/sampling.hpp"
#include "sched/kv_blocks.hpp"

namespace computron::engine {

namespace {

class decoder_backend final : public backend {
 public:
  decoder_backend(std::unique_ptr<models::decoder_stage> stage, decoder_backend_options options)
      : stage_(std::move(stage)), options_(options) {}

  caf::expected<models::host_tensor> run(const step_input& req, const std::vector<int32_t>& keep,
                                         const std::vector<std::vector<uint32_t>>& tables,
                                         const models::host_tensor* hidden,
                                         const std::vector<models::device_draw>* draws) override {
    const auto batch = req.plan.batch;
    // The draws live in the caller's frame: held for this step only.
    draws_ = draws;
    struct forget {
      const std::vector<models::device_draw>*& d;
      ~forget() { d = nullptr; }
    } forget_draws{draws_};
    stage_->set_kv_spare(req.plan.kv_spare);
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
    // Kept stacks belong to some batch's adapters: none outlives the batches (another
    // batch still running stacks its own again at its next step).
    stage_->drop_adapter_stacks();
  }

  uint64_t kv_device_bytes() const override { return stage_->kv_blocks().device_bytes; }

  caf::error prepare() override {
    auto err = stage_->capture_graphs();
    // A capture that failed is the stage's to say (once); it serves eagerly.
    if (auto g = stage_->graphs(); !g.buckets.empty() && stage_->on_gpu())
      log::info("CUDA graphs captured for decode batches of up to {} rows", g.buckets.back());
    return err;
  }

  caf::error join_batch(uint64_t from, uint64_t into) override {
    auto f = caches_.find(from);
    auto i = caches_.find(into);
    if (f == caches_.end() || i == caches_.end()) {
      end_batch(from);
      return make_error(ec::invalid_request, "joining batch " + std::to_string(from) + " into " +
                                                 std::to_string(into) + ": no such batch here");
    }
    auto err = i->second.append(std::move(f->second));
    // Candidates only while every row of the joined batch needs no more than them; draws
    // on the device while every row can be drawn there (a row of candidates can).
    auto a = head_of(into), b = head_of(from);
    auto drawable = [](const models::head_output& h) { return h.top > 0 || h.draw; };
    if (a.top > 0 && b.top > 0)
      top_[into] = models::head_output{std::max(a.top, b.top)};
    else if (drawable(a) && drawable(b))
      top_[into] = models::head_output{0, true};
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
  /// When some row needs its whole row of logits but every row's token depends on its
  /// logits and plain settings only (device_drawable), the batch draws on the device
  /// instead (decoder_backend_options::device_sampling).
  void choose_head(const step_input& req) {
    int64_t top = req.sampling.empty() ? 0 : 1;
    using where = decoder_backend_options::sampling_on;
    bool drawable =
        !req.sampling.empty() && (options_.device_sampling == where::always ||
                                  (options_.device_sampling == where::gpu && stage_->on_gpu()));
    for (auto& s : req.sampling) {
      auto k = candidates_of(s);
      top = k == 0 || top == 0 ? 0 : std::max(top, k);
      drawable = drawable && device_drawable(s);
    }
    if (top > 0)
      top_[req.plan.batch] = models::head_output{top};
    else if (drawable)
      top_[req.plan.batch] = models::head_output{0, true};
    else
      top_.erase(req.plan.batch);  // a batch id used again starts afresh
  }

  /// The batch's head, with this step's draws (the sampling rank's) where it draws.
  models::head_output head_of(uint64_t batch_id) const {
    auto i = top_.find(batch_id);
    if (i == top_.end()) return {};
    auto h = i->second;
    if (h.draw) h.draws = draws_;
    return h;
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
  decoder_backend_options options_;
  /// The step in progress's draws (run's argument; null on ranks that do not sample).
  const std::vector<models::device_draw>* draws_ = nullptr;
  /// Bound adapters by name, with the ids the stage knows them by (never reused: a row's
  /// id names one adapter's weights for the batch's life).
  std::unordered_map<std::string, bound_adapter> adapters_;
  int64_t next_adapter_ = 1;
  std::unordered_map<uint64_t, models::kv_cache> caches_;
  /// Batches whose rows need only candidates (how many the last stage returns), or whose
  /// tokens are drawn on the device.
  std::unordered_map<uint64_t, models::head_output> top_;
};

}  // namespace

std::unique_ptr<backend> make_decoder_backend(std::unique_ptr<models::decoder_stage> stage,
                                              decoder_backend_options options) {
  return std::make_unique<decoder_backend>(std::move(stage), options);
}

}  // namespace computron::engine
