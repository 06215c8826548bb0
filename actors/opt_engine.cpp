#include "actors/opt_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include <sys/stat.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/model_spec.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/collective.hpp"
#include "models/checkpoint.hpp"
#include "models/decoder_stage.hpp"
#include "models/lora_adapter.hpp"
#include "models/weights.hpp"

namespace computron::actors {

namespace {

struct decoder_shape {
  models::decoder_spec spec;
  gpu::dtype type;
  models::parallel_config par;
};

caf::expected<decoder_shape> shape_of(const model_config& cfg) {
  auto spec = decoder_spec_of(cfg);
  if (!spec) return spec.error();
  auto type = gpu::parse_weight_dtype(cfg.dtype);
  if (!type) return type.error();
  return decoder_shape{*spec, *type, models::parallel_config{cfg.tp, cfg.pp}};
}

/// KV blocks from the shard's own device, in pages as the weights are, so that KV bytes
/// and weights share the device's memory and its accounting.
models::kv_pool_options device_kv(gpu::device& dev) {
  models::kv_pool_options o;
  o.page_bytes = dev.page_bytes();
  o.allocate = [d = dev.shared_from_this()](uint64_t bytes) -> caf::expected<models::kv_memory> {
    auto a = d->allocate(bytes);
    if (!a) return std::move(a.error());
    auto held = std::make_shared<gpu::device_allocation>(std::move(*a));
    return models::kv_memory{held->data(), held};
  };
  return o;
}

class decoder_backend final : public backend {
 public:
  explicit decoder_backend(std::unique_ptr<models::decoder_stage> stage)
      : stage_(std::move(stage)) {}

  caf::expected<models::host_tensor> run(const computron::engine::step_input& req,
                                         const std::vector<int32_t>& keep,
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
  void choose_head(const computron::engine::step_input& req) {
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
  caf::expected<std::vector<int64_t>> adapter_ids(const computron::engine::step_input& req) const {
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

class decoder_engine final : public model_kind {
 private:
  mutable std::mutex warm_mtx_;
  mutable std::set<std::string> warmed_;

  /// A LoRA adapter's part for one shard: its PEFT folder read against the base's shape,
  /// cut as the base's shard is, in the base's dtype (models/lora_adapter.hpp).
  static caf::expected<models::lora_rank_adapter> adapter_part(const shard_spec& sh) {
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    auto a = models::read_lora_adapter(sh.model.weights_path, s->spec);
    if (!a) return with_context(a.error(), "adapter " + sh.model.name);
    return models::slice_lora_adapter(*a, s->par, {sh.tp_rank, sh.pp_rank}, s->type);
  }

  /// What names one adapter part: the shard, its base's shape and dtype, and the folder's
  /// files as they are now, so that a folder changed on disk is read again.
  static std::string part_key(const shard_spec& sh) {
    namespace fs = std::filesystem;
    std::string key =
        fmt::format("{}|{}|{}|{}|{}|{}|{}x{}|{}|{}|{}", sh.model.name, sh.model.weights_path,
                    sh.model.kind, sh.model.spec, sh.model.arch, fmt::join(sh.model.shape, ","),
                    sh.model.tp, sh.model.pp, sh.tp_rank, sh.pp_rank, sh.model.dtype);
    // Size, inode and change time: a file replaced or rewritten changes at least one,
    // whatever its modification time says (cp -p and rsync keep that).
    for (auto* f : {"adapter_config.json", "adapter_model.safetensors"}) {
      struct stat st {};
      auto p = (fs::path{sh.model.weights_path} / f).string();
      if (::stat(p.c_str(), &st) != 0) st = {};
      key += fmt::format("|{}:{}:{}.{}", static_cast<int64_t>(st.st_size),
                         static_cast<uint64_t>(st.st_ino), static_cast<int64_t>(st.st_ctim.tv_sec),
                         static_cast<int64_t>(st.st_ctim.tv_nsec));
    }
    return key;
  }

  /// Adapter layouts are asked for again and again (every registration sizes the models
  /// already registered to place a new one), and each read converts and hashes the whole
  /// folder: the table is kept per part, and the part itself until its fill, which follows
  /// the layout of a registration (bounded: a part not filled is read again).
  caf::expected<gpu::tensor_table> adapter_layout(const shard_spec& sh) const {
    auto key = part_key(sh);
    {
      std::lock_guard<std::mutex> guard{parts_mtx_};
      if (auto t = adapter_tables_.find(key); t != adapter_tables_.end()) return t->second;
    }
    auto part = adapter_part(sh);
    if (!part) return part.error();
    auto table = part->table;
    std::lock_guard<std::mutex> guard{parts_mtx_};
    adapter_tables_[key] = table;
    if (unfilled_.size() >= max_unfilled_parts) unfilled_.erase(unfilled_.begin());
    unfilled_[key] = std::move(*part);
    return table;
  }

  caf::expected<models::lora_rank_adapter> adapter_to_fill(const shard_spec& sh) const {
    auto key = part_key(sh);
    {
      std::lock_guard<std::mutex> guard{parts_mtx_};
      if (auto p = unfilled_.find(key); p != unfilled_.end()) {
        auto part = std::move(p->second);
        unfilled_.erase(p);
        return part;
      }
    }
    return adapter_part(sh);
  }

  static constexpr size_t max_unfilled_parts = 64;
  mutable std::mutex parts_mtx_;
  mutable std::map<std::string, gpu::tensor_table> adapter_tables_;
  mutable std::map<std::string, models::lora_rank_adapter> unfilled_;

 public:
  caf::error validate(const model_config& cfg,
                      const std::vector<gpu::device_kind>& placed) const override {
    auto s = shape_of(cfg);
    if (!s) return with_context(s.error(), "model " + cfg.name);
    if (!dtype_runs_on(cfg.dtype, placed)) {
      std::string kinds;
      for (auto k : placed)
        if (k != gpu::device_kind::cuda && kinds.find(gpu::to_string(k)) == std::string::npos)
          kinds += (kinds.empty() ? "" : ", ") + std::string{gpu::to_string(k)};
      return make_error(ec::invalid_configuration,
                        "model " + cfg.name +
                            ": f16 runs only on CUDA devices, and it is placed on " + kinds +
                            " devices; use bf16 or f32 there (or \"auto\")");
    }
    if (auto err = models::validate(s->spec, s->par)) return with_context(err, "model " + cfg.name);
    return {};
  }

  int64_t vocab(const model_config& cfg) const override {
    auto s = decoder_spec_of(cfg);
    return s ? s->vocab : 0;
  }

  int64_t max_positions(const model_config& cfg) const override {
    auto s = decoder_spec_of(cfg);
    return s ? s->max_positions : 0;
  }

  uint64_t weight_bytes(const model_config& cfg) const override {
    auto s = shape_of(cfg);
    return s ? models::weight_bytes(s->spec, s->type) : 0;
  }

  uint64_t kv_block_bytes(const shard_spec& sh) const override {
    if (!sh.model.base.empty()) return 0;  // its rows' KV is in its base's blocks
    auto s = shape_of(sh.model);
    return s ? models::kv_block_bytes(s->spec, s->type, s->par, {sh.tp_rank, sh.pp_rank}) : 0;
  }

  caf::expected<gpu::tensor_table> layout(const shard_spec& sh) const override {
    if (!sh.model.base.empty()) return adapter_layout(sh);
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    return models::shard_layout(s->spec, s->type, s->par, {sh.tp_rank, sh.pp_rank});
  }

  caf::error fill(const shard_spec& sh, gpu::weight_shard& w) const override {
    if (!sh.model.base.empty()) {
      auto part = adapter_to_fill(sh);
      if (!part) return part.error();
      if (part->host.size() != w.size_bytes())
        return make_error(
            ec::invalid_state,
            "adapter " + sh.model.name + " changed on disk between its layout and its fill");
      std::memcpy(w.host_data(), part->host.data(), part->host.size());
      return {};
    }
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    models::shard_index idx{sh.tp_rank, sh.pp_rank};
    if (sh.model.weights_path.empty())
      return models::fill_seeded(s->spec, s->par, idx, w.table(), w.host_data(), sh.model.seed);
    auto file = models::checkpoint::open(sh.model.weights_path);
    if (!file) return file.error();
    return models::fill_from_checkpoint(s->spec, s->par, idx, w.table(), w.host_data(), *file);
  }

  caf::error use_stream(const gpu::device_ptr& dev, void* stream) const override {
    return models::use_compute_stream(*dev, stream);
  }

  caf::error warm_up(const shard_spec& sh, const gpu::device_ptr& dev) const override {
    if (!dev || dev->info().kind != gpu::device_kind::cuda) return {};
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    // One layer of the same width in the same dtype runs the same kernels as the model.
    auto w = s->spec;
    w.name = "warm-up";
    w.layers = 1;
    w.vocab = 64;
    w.max_positions = 64;
    auto key = fmt::format("{}/{}/{}/{}/{}/{}", dev->info().ordinal, gpu::to_string(s->type),
                           models::to_json(w).dump(), w.hidden, w.heads, w.ffn);
    {
      std::lock_guard<std::mutex> guard{warm_mtx_};
      if (!warmed_.insert(key).second) return {};
    }
    auto t0 = std::chrono::steady_clock::now();
    auto table = models::shard_layout(w, s->type, {1, 1}, {0, 0});
    if (!table) return table.error();
    auto shard = gpu::weight_shard::create(dev, std::move(*table));
    if (!shard) return shard.error();
    auto& ws = **shard;
    if (auto err = models::fill_seeded(w, {1, 1}, {0, 0}, ws.table(), ws.host_data(), 1))
      return err;
    if (auto err = ws.load()) return err;
    if (auto err = ws.wait_loaded(std::chrono::minutes{1})) return err;
    auto group = gpu::join_local_group("warm-up/" + key, 0, 1, std::chrono::seconds{10});
    if (!group) return group.error();
    auto stage = models::decoder_stage::create(w, {1, 1}, {0, 0}, ws, **group, device_kv(*dev));
    if (!stage) return stage.error();
    models::kv_cache cache;
    auto out = (*stage)->prefill({{2, 5, 7, 11, 13, 17, 19, 23}}, nullptr, cache);
    if (!out) return out.error();
    auto next = (*stage)->decode({3}, nullptr, cache);
    if (!next) return next.error();
    stage->reset();
    if (auto err = ws.evict()) return err;
    log::info(
        "{}: warmed up {} compute for width {} in {:.0f} ms", dev->info().name,
        gpu::to_string(s->type), w.hidden,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    return {};
  }

  caf::expected<std::unique_ptr<backend>> make_backend(const shard_spec& sh, gpu::weight_shard& w,
                                                       gpu::collective& g) const override {
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    auto stage = models::decoder_stage::create(s->spec, s->par, {sh.tp_rank, sh.pp_rank}, w, g,
                                               device_kv(w.dev()));
    if (!stage) return stage.error();
    return std::unique_ptr<backend>{std::make_unique<decoder_backend>(std::move(*stage))};
  }
};

}  // namespace

std::shared_ptr<const model_kind> make_decoder_engine() {
  return std::make_shared<decoder_engine>();
}

engine_registry all_engines() {
  auto r = torch_free_engines();
  // One engine for every decoder family: the shape says which block runs.
  auto decoder = make_decoder_engine();
  for (auto f : {models::model_family::opt, models::model_family::llama})
    r.emplace(models::to_string(f), decoder);
  return r;
}

}  // namespace computron::actors
