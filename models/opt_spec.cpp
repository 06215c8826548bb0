#include "models/opt_spec.hpp"

#include <fmt/format.h>

#include "common/error.hpp"

namespace computron::models {

const std::vector<opt_spec>& catalogue() {
  // Shapes from the OPT paper (Zhang et al. 2022), table 1; vocab 50272, 2048 positions.
  // opt-350m's 512-wide embedding projection is not modelled: it is treated as a plain
  // 1024-wide decoder (its size differs from the real checkpoint by about 1%).
  static const std::vector<opt_spec> specs = {
      {"opt-tiny", 64, 2, 4, 256, 512, 128},
      {"opt-mini", 128, 4, 8, 512, 1024, 256},
      {"opt-125m", 768, 12, 12, 3072, 50272, 2048},
      {"opt-350m", 1024, 24, 16, 4096, 50272, 2048},
      {"opt-1.3b", 2048, 24, 32, 8192, 50272, 2048},
      {"opt-2.7b", 2560, 32, 32, 10240, 50272, 2048},
      {"opt-6.7b", 4096, 32, 32, 16384, 50272, 2048},
      {"opt-13b", 5120, 40, 40, 20480, 50272, 2048},
      {"opt-30b", 7168, 48, 56, 28672, 50272, 2048},
      {"opt-66b", 9216, 64, 72, 36864, 50272, 2048},
      {"opt-175b", 12288, 96, 96, 49152, 50272, 2048},
  };
  return specs;
}

caf::expected<opt_spec> find_spec(std::string_view name) {
  std::string known;
  for (auto& s : catalogue()) {
    if (s.name == name) return s;
    known += known.empty() ? s.name : ", " + s.name;
  }
  return make_error(ec::unknown_model,
                    fmt::format("no model shape '{}' in the catalogue ({})", name, known));
}

caf::error validate(const opt_spec& spec, const parallel_config& par) {
  auto bad = [&](std::string why) {
    return make_error(ec::invalid_configuration, fmt::format("{} cannot be split tp={} x pp={}: {}",
                                                             spec.name, par.tp, par.pp, why));
  };
  if (spec.hidden <= 0 || spec.layers <= 0 || spec.heads <= 0 || spec.ffn <= 0 || spec.vocab <= 0 ||
      spec.max_positions <= 0)
    return bad("every dimension must be positive");
  if (spec.hidden % spec.heads != 0) return bad("hidden size is not a multiple of the heads");
  if (par.tp < 1 || par.pp < 1) return bad("tp and pp must be at least 1");
  if (spec.heads % par.tp != 0) return bad(fmt::format("{} heads do not divide by tp", spec.heads));
  if (spec.ffn % par.tp != 0)
    return bad(fmt::format("FFN size {} does not divide by tp", spec.ffn));
  if (spec.layers < par.pp)
    return bad(fmt::format("only {} layers for {} stages", spec.layers, par.pp));
  return {};
}

std::pair<int64_t, int64_t> stage_layers(const opt_spec& spec, int pp, int pp_rank) {
  auto base = spec.layers / pp;
  auto extra = spec.layers % pp;
  auto begin = pp_rank * base + std::min<int64_t>(pp_rank, extra);
  auto size = base + (pp_rank < extra ? 1 : 0);
  return {begin, begin + size};
}

std::vector<param_spec> shard_params(const opt_spec& spec, const parallel_config& par,
                                     const shard_index& shard) {
  std::vector<param_spec> out;
  auto h = spec.hidden;
  auto add = [&](std::string name, std::vector<int64_t> shape, split_kind split, init_kind init) {
    auto local = shape;
    if (split == split_kind::dim0) local[0] /= par.tp;
    if (split == split_kind::dim1) local[1] /= par.tp;
    out.push_back(param_spec{std::move(name), std::move(shape), split, init, std::move(local)});
  };
  bool first = shard.pp_rank == 0;
  bool last = shard.pp_rank == par.pp - 1;
  if (first) {
    add("embed_tokens.weight", {spec.vocab, h}, split_kind::replicated, init_kind::embedding);
    // OPT's learned positions are offset by 2 (a fairseq legacy).
    add("embed_positions.weight", {spec.max_positions + 2, h}, split_kind::replicated,
        init_kind::embedding);
  }
  auto [begin, end] = stage_layers(spec, par.pp, shard.pp_rank);
  for (auto i = begin; i < end; ++i) {
    auto p = fmt::format("layers.{}.", i);
    add(p + "self_attn_layer_norm.weight", {h}, split_kind::replicated, init_kind::norm_weight);
    add(p + "self_attn_layer_norm.bias", {h}, split_kind::replicated, init_kind::bias);
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      add(p + "self_attn." + proj + ".weight", {h, h}, split_kind::dim0, init_kind::weight);
      add(p + "self_attn." + proj + ".bias", {h}, split_kind::dim0, init_kind::bias);
    }
    add(p + "self_attn.out_proj.weight", {h, h}, split_kind::dim1, init_kind::weight);
    add(p + "self_attn.out_proj.bias", {h}, split_kind::replicated, init_kind::bias);
    add(p + "final_layer_norm.weight", {h}, split_kind::replicated, init_kind::norm_weight);
    add(p + "final_layer_norm.bias", {h}, split_kind::replicated, init_kind::bias);
    add(p + "fc1.weight", {spec.ffn, h}, split_kind::dim0, init_kind::weight);
    add(p + "fc1.bias", {spec.ffn}, split_kind::dim0, init_kind::bias);
    add(p + "fc2.weight", {h, spec.ffn}, split_kind::dim1, init_kind::weight);
    add(p + "fc2.bias", {h}, split_kind::replicated, init_kind::bias);
  }
  if (last) {
    add("final_layer_norm.weight", {h}, split_kind::replicated, init_kind::norm_weight);
    add("final_layer_norm.bias", {h}, split_kind::replicated, init_kind::bias);
    // The LM head is tied to the token embedding; a last stage that is not also the
    // first holds its own copy (same name, so the same seeded or file values).
    if (!first)
      add("embed_tokens.weight", {spec.vocab, h}, split_kind::replicated, init_kind::embedding);
  }
  return out;
}

caf::expected<gpu::tensor_table> shard_layout(const opt_spec& spec, gpu::dtype type,
                                              const parallel_config& par,
                                              const shard_index& shard) {
  if (auto err = validate(spec, par)) return err;
  if (shard.tp_rank < 0 || shard.tp_rank >= par.tp || shard.pp_rank < 0 || shard.pp_rank >= par.pp)
    return make_error(ec::invalid_request,
                      fmt::format("shard (tp rank {}, stage {}) is outside tp={} x pp={}",
                                  shard.tp_rank, shard.pp_rank, par.tp, par.pp));
  gpu::tensor_table table;
  for (auto& p : shard_params(spec, par, shard))
    if (auto err = table.add(p.name, type, p.shard_shape)) return err;
  return table;
}

caf::expected<uint64_t> shard_bytes(const opt_spec& spec, gpu::dtype type,
                                    const parallel_config& par, const shard_index& shard) {
  auto t = shard_layout(spec, type, par, shard);
  if (!t) return std::move(t.error());
  return t->total_bytes();
}

uint64_t parameter_count(const opt_spec& spec) {
  uint64_t n = 0;
  for (auto& p : shard_params(spec, {1, 1}, {0, 0})) {
    uint64_t k = 1;
    for (auto d : p.full_shape) k *= static_cast<uint64_t>(d);
    n += k;
  }
  return n;
}

}  // namespace computron::models
