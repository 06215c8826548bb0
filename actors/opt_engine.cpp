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
#include "engine/torch/decoder_backend.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "gpu/collective.hpp"
#include "models/checkpoint.hpp"
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

class decoder_engine final : public model_kind {
 private:
  mutable std::mutex warm_mtx_;
  mutable std::set<std::string> warmed_;

  /// A LoRA adapter's part for one shard: its PEFT folder read against the base's shape,
  /// cut as the base's shard is, in the base's dtype (models/lora_adapter.hpp).
  static caf::expected<models::lora_rank_adapter> adapter_part(const shard_spec& sh) {
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    models::lora_limits limits;
    if (sh.model.max_lora_rank > 0) limits.max_rank = sh.model.max_lora_rank;
    auto a = models::read_lora_adapter(sh.model.weights_path, s->spec, limits);
    if (!a) return with_context(a.error(), "adapter " + sh.model.name);
    return models::slice_lora_adapter(*a, s->par, {sh.tp_rank, sh.pp_rank}, s->type);
  }

  /// What names one adapter part: the shard, its base's shape and dtype, and the folder's
  /// files as they are now, so that a folder changed on disk is read again.
  static std::string part_key(const shard_spec& sh) {
    namespace fs = std::filesystem;
    std::string key = fmt::format(
        "{}|{}|{}|{}|{}|{}|{}x{}|{}|{}|{}|r<={}", sh.model.name, sh.model.weights_path,
        sh.model.kind, sh.model.spec, sh.model.arch, fmt::join(sh.model.shape, ","), sh.model.tp,
        sh.model.pp, sh.tp_rank, sh.pp_rank, sh.model.dtype, sh.model.max_lora_rank);
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
    // CUDA graphs where the shard is on a GPU (elsewhere there is no launch to save).
    models::compute_options compute;
    if (w.dev().info().kind == gpu::device_kind::cuda)
      compute.graph_max_batch = sh.model.cuda_graph_max_batch;
    auto stage = models::decoder_stage::create(s->spec, s->par, {sh.tp_rank, sh.pp_rank}, w, g,
                                               device_kv(w.dev()), compute);
    if (!stage) return stage.error();
    return computron::engine::make_decoder_backend(std::move(*stage));
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
