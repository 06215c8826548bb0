// OPT's layout and split rules (the decoder of the original Computron).
#include <fmt/format.h>

#include "common/error.hpp"
#include "models/decoder_spec.hpp"

namespace computron::models::detail {

caf::error opt_validate(const decoder_spec& spec, const parallel_config& par) {
  auto bad = [&](std::string why) {
    return make_error(ec::invalid_configuration, fmt::format("{} cannot be split tp={} x pp={}: {}",
                                                             spec.name, par.tp, par.pp, why));
  };
  if (spec.hidden % spec.heads != 0) return bad("hidden size is not a multiple of the heads");
  if (spec.heads % par.tp != 0) return bad(fmt::format("{} heads do not divide by tp", spec.heads));
  if (spec.ffn % par.tp != 0)
    return bad(fmt::format("FFN size {} does not divide by tp", spec.ffn));
  return {};
}

void opt_params(const decoder_spec& spec, const parallel_config& par, const shard_index& shard,
                const param_adder& add) {
  auto h = spec.hidden;
  bool first = shard.pp_rank == 0;
  bool last = shard.pp_rank == par.pp - 1;
  if (first) {
    add("embed_tokens.weight", {spec.vocab, h}, split_kind::vocab, init_kind::embedding);
    // OPT's learned positions are offset by 2 (a fairseq legacy). Cut by hidden column:
    // each rank adds its columns before the embedding's all-reduce (engine/torch/opt_block.cpp).
    add("embed_positions.weight", {spec.max_positions + 2, h}, split_kind::dim1,
        init_kind::embedding);
  }
  auto [begin, end] = stage_layers(spec, par.pp, shard.pp_rank);
  for (auto i = begin; i < end; ++i) {
    auto p = fmt::format("layers.{}.", i);
    add(p + "self_attn_layer_norm.weight", {h}, split_kind::replicated, init_kind::norm_weight);
    add(p + "self_attn_layer_norm.bias", {h}, split_kind::replicated, init_kind::bias);
    // q, k and v weights side by side, then their biases: each three are one tensor in
    // place (stage_state::fused), so that the forward makes one product of them.
    for (const char* proj : {"q_proj", "k_proj", "v_proj"})
      add(p + "self_attn." + proj + ".weight", {h, h}, split_kind::dim0, init_kind::weight, 1,
          proj[0] != 'q');
    for (const char* proj : {"q_proj", "k_proj", "v_proj"})
      add(p + "self_attn." + proj + ".bias", {h}, split_kind::dim0, init_kind::bias, 1,
          proj[0] != 'q');
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
    // first holds its own copy (same name, so the same seeded or file values), cut by
    // vocabulary as the embedding is.
    if (!first)
      add("embed_tokens.weight", {spec.vocab, h}, split_kind::vocab, init_kind::embedding);
  }
}

}  // namespace computron::models::detail
