#include "actors/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstring>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/random.hpp"
#include "engine/generate.hpp"
#include "engine/toy/toy_backend.hpp"

namespace computron::actors {

namespace {

constexpr int64_t toy_positions = 4096;

class toy_engine final : public model_kind {
 public:
  caf::error validate(const model_config& cfg,
                      const std::vector<gpu::device_kind>&) const override {
    if (cfg.toy_shard_bytes == 0)
      return make_error(ec::invalid_configuration, "toy model " + cfg.name + ": zero bytes");
    if (!(std::isfinite(cfg.toy_compute_ms) && cfg.toy_compute_ms >= 0 &&
          cfg.toy_compute_ms <= 60000))
      return make_error(ec::invalid_configuration,
                        "toy model " + cfg.name + ": toy_compute_ms must be 0..60000");
    return {};
  }
  int64_t vocab(const model_config&) const override { return computron::engine::toy_vocab; }
  int64_t max_positions(const model_config&) const override { return toy_positions; }
  /// Every shard's blob is its own: nothing is held twice.
  uint64_t weight_bytes(const model_config& cfg) const override {
    return cfg.toy_shard_bytes * static_cast<uint64_t>(std::max(1, cfg.tp) * std::max(1, cfg.pp));
  }

  caf::expected<gpu::tensor_table> layout(const shard_spec& s) const override {
    gpu::tensor_table t;
    if (auto err = t.add("blob", gpu::dtype::u8, {static_cast<int64_t>(s.model.toy_shard_bytes)}))
      return err;
    return t;
  }

  caf::error fill(const shard_spec& s, gpu::weight_shard& w) const override {
    auto shard_seed =
        s.model.seed * 1000003 + static_cast<uint64_t>(s.pp_rank * s.model.tp + s.tp_rank);
    fill_random_bytes(w.host_data(), w.size_bytes(), shard_seed);
    return {};
  }

  caf::expected<std::unique_ptr<backend>> make_backend(const shard_spec& s, gpu::weight_shard& w,
                                                       gpu::collective& g) const override {
    return computron::engine::make_toy_backend(
        {s.model.name, s.pp_rank, s.model.pp, s.model.toy_compute_ms}, w, g);
  }
};

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  return true;
}

}  // namespace

std::shared_ptr<const model_kind> make_toy_engine() {
  return std::make_shared<toy_engine>();
}

engine_registry torch_free_engines() {
  return {{"toy", make_toy_engine()}};
}

std::shared_ptr<computron::engine::runner> runner_of(const shard_spec& s,
                                                     std::unique_ptr<backend> b) {
  const bool last_stage = s.pp_rank == s.model.pp - 1;
  return std::make_shared<computron::engine::runner>(std::move(b), last_stage, s.tp_rank == 0);
}

tensor_payload to_payload(const models::host_tensor& t) {
  tensor_payload p;
  p.dtype = static_cast<uint8_t>(t.type);
  p.shape = t.shape;
  p.bytes.resize(t.bytes.size());
  if (!t.bytes.empty()) std::memcpy(p.bytes.data(), t.bytes.data(), t.bytes.size());
  return p;
}

models::host_tensor from_payload(const tensor_payload& p) {
  models::host_tensor t;
  t.type = static_cast<gpu::dtype>(p.dtype);
  t.shape = p.shape;
  t.bytes.resize(p.bytes.size());
  if (!p.bytes.empty()) std::memcpy(t.bytes.data(), p.bytes.data(), p.bytes.size());
  return t;
}

bool dtype_runs_on(const std::string& dtype, const std::vector<gpu::device_kind>& placed) {
  if (dtype != "f16" && dtype != "fp16") return true;
  for (auto k : placed)
    if (k != gpu::device_kind::cuda) return false;
  return true;
}

model_config resolve_dtype(model_config cfg, const std::vector<gpu::device_kind>& device_kinds,
                           bool quiet) {
  if (cfg.dtype != "auto") return cfg;
  std::vector<gpu::device_kind> placed;
  for (auto d : cfg.devices)
    placed.push_back(d >= 0 && static_cast<size_t>(d) < device_kinds.size()
                         ? device_kinds[static_cast<size_t>(d)]
                         : gpu::device_kind::emulated);
  auto want = cfg.checkpoint_dtype.empty() ? std::string{"bf16"} : cfg.checkpoint_dtype;
  if (dtype_runs_on(want, placed)) {
    cfg.dtype = want;
    if (!quiet) log::info("model {}: serving in {}, the checkpoint's dtype", cfg.name, want);
  } else {
    cfg.dtype = "bf16";
    if (!quiet)
      log::info("model {}: the checkpoint is {}, which its {} devices cannot run; serving in bf16",
                cfg.name, want, placed.empty() ? "" : gpu::to_string(placed.front()));
  }
  return cfg;
}

caf::error validate_model(const engine_registry& engines, const model_config& cfg,
                          const std::vector<gpu::device_kind>& device_kinds) {
  const size_t device_count = device_kinds.size();
  auto bad = [&](std::string why) {
    return make_error(ec::invalid_configuration, "model " + cfg.name + ": " + why);
  };
  if (!valid_name(cfg.name))
    return make_error(ec::invalid_configuration,
                      "model name '" + cfg.name + "' must be 1-128 of [A-Za-z0-9._-]");
  auto e = engines.find(cfg.kind);
  if (e == engines.end()) {
    std::string known;
    for (auto& [k, _] : engines) known += (known.empty() ? "" : ", ") + k;
    return bad("unknown kind '" + cfg.kind + "' (this build has: " + known + ")");
  }
  if (cfg.tp < 1 || cfg.pp < 1 || cfg.tp > 64 || cfg.pp > 64) return bad("tp and pp must be 1..64");
  if (cfg.slo_ms < 0) return bad("slo_ms must not be negative, got " + std::to_string(cfg.slo_ms));
  if (cfg.max_lora_rank < 0)
    return bad("max_lora_rank must not be negative, got " + std::to_string(cfg.max_lora_rank));
  if (cfg.cuda_graph_max_batch < 0 || cfg.cuda_graph_max_batch > 256)
    return bad("cuda_graph_max_batch must be from 0 (off) to 256, got " +
               std::to_string(cfg.cuda_graph_max_batch));
  auto shards = static_cast<size_t>(cfg.tp * cfg.pp);
  if (cfg.devices.size() != shards)
    return bad("needs " + std::to_string(shards) + " devices (tp x pp), got " +
               std::to_string(cfg.devices.size()));
  std::set<int32_t> seen;
  for (auto d : cfg.devices) {
    if (d < 0 || static_cast<size_t>(d) >= device_count)
      return bad("device " + std::to_string(d) + " does not exist (" +
                 std::to_string(device_count) + " devices)");
    if (!seen.insert(d).second)
      return bad("device " + std::to_string(d) + " holds two shards; each shard needs its own");
  }
  std::vector<gpu::device_kind> placed;
  for (auto d : cfg.devices) placed.push_back(device_kinds[static_cast<size_t>(d)]);
  return e->second->validate(cfg, placed);
}

caf::expected<std::vector<std::vector<int64_t>>> direct_generate(
    const model_kind& eng, const model_config& cfg, const std::vector<gpu::device_ptr>& devices,
    const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens,
    const row_sampling& sampling) {
  if (prompts.empty() || max_tokens < 1)
    return make_error(ec::invalid_request, "need at least one prompt and one token");
  const int tp = cfg.tp;
  const int pp = cfg.pp;
  struct shard_t {
    shard_spec spec;
    std::unique_ptr<gpu::weight_shard> weights;
    std::unique_ptr<gpu::collective> group;
    std::shared_ptr<computron::engine::runner> runner;
  };
  std::vector<shard_t> shards(static_cast<size_t>(tp * pp));
  static std::atomic<uint64_t> run_id{0};
  auto group_prefix = "direct/" + cfg.name + "/" + std::to_string(run_id++) + "/";
  for (int i = 0; i < tp * pp; ++i) {
    auto& s = shards[static_cast<size_t>(i)];
    s.spec = shard_spec{cfg, i % tp, i / tp, {}};
    auto table = eng.layout(s.spec);
    if (!table) return table.error();
    auto dev = devices.at(static_cast<size_t>(cfg.devices.at(static_cast<size_t>(i))));
    auto w = gpu::weight_shard::create(dev, std::move(*table));
    if (!w) return w.error();
    s.weights = std::move(*w);
    if (auto err = eng.fill(s.spec, *s.weights)) return err;
    if (auto err = s.weights->load()) return err;
    if (auto err = s.weights->wait_loaded(std::chrono::minutes(10))) return err;
    auto g = gpu::join_local_group(group_prefix + std::to_string(i / tp), i % tp, tp,
                                   std::chrono::minutes(2));
    if (!g) return g.error();
    s.group = std::move(*g);
    auto b = eng.make_backend(s.spec, *s.weights, *s.group);
    if (!b) return b.error();
    s.runner = runner_of(s.spec, std::move(*b));
    // As a worker prepares a registered shard (the decoder's CUDA graphs).
    if (auto err = s.runner->compute().prepare()) return err;
  }
  std::vector<std::vector<std::shared_ptr<computron::engine::runner>>> stages(
      static_cast<size_t>(pp));
  for (int i = 0; i < tp * pp; ++i)
    stages[static_cast<size_t>(i / tp)].push_back(shards[static_cast<size_t>(i)].runner);
  return computron::engine::generate(stages, prompts, max_tokens, sampling);
}

}  // namespace computron::actors
