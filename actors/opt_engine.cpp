#include "actors/opt_engine.hpp"

#include <unordered_map>

#include "common/error.hpp"
#include "models/safetensors.hpp"
#include "models/weights.hpp"

namespace computron::actors {

namespace {

struct opt_shape {
  models::opt_spec spec;
  gpu::dtype type;
  models::parallel_config par;
};

caf::expected<opt_shape> shape_of(const model_config& cfg) {
  auto spec = models::find_spec(cfg.spec);
  if (!spec) return spec.error();
  auto type = gpu::parse_weight_dtype(cfg.dtype);
  if (!type) return type.error();
  return opt_shape{*spec, *type, models::parallel_config{cfg.tp, cfg.pp}};
}

class opt_program final : public shard_program {
 public:
  explicit opt_program(std::unique_ptr<models::opt_stage> stage) : stage_(std::move(stage)) {}

  caf::expected<models::host_tensor> run(const step_request& req,
                                         const models::host_tensor* hidden) override {
    auto& cache = caches_[req.batch_id];
    caf::expected<models::host_tensor> out = req.step == 0
                                                 ? stage_->prefill(req.prompts, hidden, cache)
                                                 : stage_->decode(req.tokens, hidden, cache);
    if (req.last || !out) caches_.erase(req.batch_id);
    return out;
  }

  void end_batch(uint64_t batch_id) override { caches_.erase(batch_id); }

 private:
  std::unique_ptr<models::opt_stage> stage_;
  std::unordered_map<uint64_t, models::kv_cache> caches_;
};

class opt_engine final : public engine {
 public:
  caf::error validate(const model_config& cfg) const override {
    auto s = shape_of(cfg);
    if (!s)
      return make_error(ec::invalid_configuration, "model " + cfg.name + ": " + render(s.error()));
    if (s->type == gpu::dtype::f16)
      return make_error(ec::invalid_configuration,
                        "model " + cfg.name + ": f16 needs a CUDA device; use bf16 or f32");
    if (auto err = models::validate(s->spec, s->par))
      return make_error(ec::invalid_configuration, "model " + cfg.name + ": " + render(err));
    return {};
  }

  int64_t vocab(const model_config& cfg) const override {
    auto s = models::find_spec(cfg.spec);
    return s ? s->vocab : 0;
  }

  int64_t max_positions(const model_config& cfg) const override {
    auto s = models::find_spec(cfg.spec);
    return s ? s->max_positions : 0;
  }

  caf::expected<gpu::tensor_table> layout(const shard_spec& sh) const override {
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    return models::shard_layout(s->spec, s->type, s->par, {sh.tp_rank, sh.pp_rank});
  }

  caf::error fill(const shard_spec& sh, gpu::weight_shard& w) const override {
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    models::shard_index idx{sh.tp_rank, sh.pp_rank};
    if (sh.model.weights_path.empty())
      return models::fill_seeded(s->spec, s->par, idx, w.table(), w.host_data(), sh.model.seed);
    auto file = models::safetensors_file::open(sh.model.weights_path);
    if (!file) return file.error();
    return models::fill_from_checkpoint(s->spec, s->par, idx, w.table(), w.host_data(), *file);
  }

  caf::expected<std::unique_ptr<shard_program>> make_program(const shard_spec& sh,
                                                             gpu::weight_shard& w,
                                                             gpu::collective& g) const override {
    auto s = shape_of(sh.model);
    if (!s) return s.error();
    auto stage = models::opt_stage::create(s->spec, s->par, {sh.tp_rank, sh.pp_rank}, w, g);
    if (!stage) return stage.error();
    return std::unique_ptr<shard_program>{std::make_unique<opt_program>(std::move(*stage))};
  }
};

}  // namespace

std::shared_ptr<const engine> make_opt_engine() {
  return std::make_shared<opt_engine>();
}

engine_registry all_engines() {
  auto r = torch_free_engines();
  r.emplace("opt", make_opt_engine());
  return r;
}

}  // namespace computron::actors
