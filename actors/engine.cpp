#include "actors/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstring>
#include <future>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/random.hpp"

namespace computron::actors {

namespace {

constexpr int64_t toy_vocab = 1024;
constexpr int64_t toy_positions = 4096;
/// Longest a layer waits for its bytes (the load's own timeout ends it sooner).
constexpr auto layer_wait = std::chrono::minutes{10};

class toy_backend final : public backend {
 public:
  toy_backend(const shard_spec& s, gpu::weight_shard& w, gpu::collective& g)
      : spec_(s), weights_(w), group_(g) {}

  caf::expected<models::host_tensor> run(const computron::engine::step_input& in,
                                         const std::vector<int32_t>& keep,
                                         const models::host_tensor* hidden) override {
    const bool first = spec_.pp_rank == 0;
    const bool last = spec_.pp_rank == spec_.model.pp - 1;
    const size_t rows = in.rows();
    if (rows == 0) return make_error(ec::invalid_request, "toy: empty batch");
    const uint64_t n = weights_.size_bytes();
    const double stage_ms = spec_.model.toy_compute_ms / static_cast<double>(spec_.model.pp);
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
  caf::expected<std::vector<adapter_ptr>> row_adapters(const computron::engine::step_input& in,
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
          return make_error(ec::invalid_request, "toy: adapter " + in.adapters[r] +
                                                     " is not bound to " + spec_.model.name);
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
                        "toy: a shard of " + spec_.model.name + " is " + gpu::to_string(w.state()));
    auto base = w.device_data();
    if (!base) return base.error();
    std::memcpy(dst, *base + offset, len);
    return {};
  }

  shard_spec spec_;
  gpu::weight_shard& weights_;
  gpu::collective& group_;
  std::unordered_map<std::string, adapter_ptr> adapters_;
  /// Per batch, its rows' adapters (a stage keeps no other state of a batch).
  std::unordered_map<uint64_t, std::vector<adapter_ptr>> rows_;
};

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
  int64_t vocab(const model_config&) const override { return toy_vocab; }
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
    return std::unique_ptr<backend>{std::make_unique<toy_backend>(s, w, g)};
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
  }
  // The same plans the dispatch core makes: the rows' whole prompts, then one token each.
  std::vector<row_sampling> rows(prompts.size(), sampling);
  for (size_t r = 0; r < rows.size(); ++r) rows[r].seed = sampling.seed + r;
  auto in = computron::engine::prefill_step(1, prompts, std::move(rows));
  std::vector<std::vector<int64_t>> out(prompts.size());
  for (int64_t step = 0; step < max_tokens; ++step) {
    in.last = step + 1 == max_tokens;
    std::vector<computron::engine::step_output> hidden(static_cast<size_t>(tp));
    for (int stage = 0; stage < pp; ++stage) {
      std::vector<std::future<caf::expected<computron::engine::step_output>>> runs;
      for (int r = 0; r < tp; ++r) {
        auto& s = shards[static_cast<size_t>(stage * tp + r)];
        const models::host_tensor* h =
            stage == 0 ? nullptr : &hidden[static_cast<size_t>(r)].hidden;
        runs.push_back(
            std::async(std::launch::async, [&s, &in, h] { return s.runner->step(in, h); }));
      }
      caf::error first_error;
      for (int r = 0; r < tp; ++r) {
        auto res = runs[static_cast<size_t>(r)].get();
        if (!res) {
          if (!first_error) first_error = res.error();
        } else {
          hidden[static_cast<size_t>(r)] = std::move(*res);
        }
      }
      if (first_error) return first_error;
    }
    auto& next = hidden[0].tokens;
    if (next.size() != out.size())
      return make_error(ec::invalid_state, "a step sampled " + std::to_string(next.size()) +
                                               " tokens for " + std::to_string(out.size()) +
                                               " rows");
    for (size_t r = 0; r < out.size(); ++r) out[r].push_back(next[r]);
    computron::engine::next_decode_step(in, next);
  }
  return out;
}

}  // namespace computron::actors
