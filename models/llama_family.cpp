// The Llama family's layout and split rules (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3), with
// Hugging Face's tensor names under the `model.` prefix the checkpoint reader strips.
#include <fmt/format.h>

#include "common/error.hpp"
#include "models/decoder_spec.hpp"

namespace computron::models::detail {

caf::error llama_validate(const decoder_spec& spec, const parallel_config& par) {
  auto bad = [&](std::string why) {
    return make_error(ec::invalid_configuration, fmt::format("{} cannot be split tp={} x pp={}: {}",
                                                             spec.name, par.tp, par.pp, why));
  };
  auto kv = spec.kv_head_count();
  if (spec.head_dim == 0 && spec.hidden % spec.heads != 0)
    return bad(fmt::format("hidden size {} is not a multiple of the {} heads (and no head_dim)",
                           spec.hidden, spec.heads));
  if (spec.head_size() % 2 != 0)
    return bad(
        fmt::format("head_dim {} is odd (rotary embeddings rotate pairs)", spec.head_size()));
  if (kv > spec.heads || spec.heads % kv != 0)
    return bad(
        fmt::format("{} query heads are not a multiple of the {} key/value heads", spec.heads, kv));
  if (spec.heads % par.tp != 0)
    return bad(fmt::format("{} query heads do not divide by tp {}", spec.heads, par.tp));
  // Key/value heads split where tp divides them, and are replicated (each rank holds the
  // head its queries use) where tp is a multiple of them; anything else maps no rank's
  // queries onto whole key/value heads.
  if (kv % par.tp != 0 && par.tp % kv != 0)
    return bad(fmt::format(
        "{} key/value heads and tp {}: neither divides the other, so the key/value heads cannot "
        "be split or replicated across the ranks",
        kv, par.tp));
  if (spec.ffn % par.tp != 0)
    return bad(fmt::format("intermediate size {} does not divide by tp {}", spec.ffn, par.tp));
  if (!spec.rope.scaling.empty() && spec.rope.scaling != "linear" && spec.rope.scaling != "llama3")
    return bad("rope scaling '" + spec.rope.scaling + "' is not implemented");
  return {};
}

void llama_params(const decoder_spec& spec, const parallel_config& par, const shard_index& shard,
                  const param_adder& add) {
  auto h = spec.hidden;
  auto hd = spec.head_size();
  auto q_rows = spec.heads * hd;
  auto kv = spec.kv_head_count();
  auto kv_rows = kv * hd;
  // Ranks sharing one key/value slice: 1 where tp divides the kv heads.
  int kv_group = par.tp > kv ? static_cast<int>(par.tp / kv) : 1;
  bool first = shard.pp_rank == 0;
  bool last = shard.pp_rank == par.pp - 1;
  if (first) add("embed_tokens.weight", {spec.vocab, h}, split_kind::vocab, init_kind::embedding);
  auto [begin, end] = stage_layers(spec, par.pp, shard.pp_rank);
  for (auto i = begin; i < end; ++i) {
    auto p = fmt::format("layers.{}.", i);
    auto a = p + "self_attn.";
    add(p + "input_layernorm.weight", {h}, split_kind::replicated, init_kind::norm_weight);
    // q, k and v weights side by side, then their biases, and gate beside up: each is one
    // tensor in place (stage_state::fused), so that the forward makes one product of them.
    add(a + "q_proj.weight", {q_rows, h}, split_kind::dim0, init_kind::weight);
    add(a + "k_proj.weight", {kv_rows, h}, split_kind::dim0, init_kind::weight, kv_group, true);
    add(a + "v_proj.weight", {kv_rows, h}, split_kind::dim0, init_kind::weight, kv_group, true);
    if (spec.qkv_bias) {
      add(a + "q_proj.bias", {q_rows}, split_kind::dim0, init_kind::bias);
      add(a + "k_proj.bias", {kv_rows}, split_kind::dim0, init_kind::bias, kv_group, true);
      add(a + "v_proj.bias", {kv_rows}, split_kind::dim0, init_kind::bias, kv_group, true);
    }
    if (spec.qk_norm) {
      add(a + "q_norm.weight", {hd}, split_kind::replicated, init_kind::norm_weight);
      add(a + "k_norm.weight", {hd}, split_kind::replicated, init_kind::norm_weight);
    }
    add(a + "o_proj.weight", {h, q_rows}, split_kind::dim1, init_kind::weight);
    if (spec.o_bias) add(a + "o_proj.bias", {h}, split_kind::replicated, init_kind::bias);
    add(p + "post_attention_layernorm.weight", {h}, split_kind::replicated, init_kind::norm_weight);
    add(p + "mlp.gate_proj.weight", {spec.ffn, h}, split_kind::dim0, init_kind::weight);
    add(p + "mlp.up_proj.weight", {spec.ffn, h}, split_kind::dim0, init_kind::weight, 1, true);
    add(p + "mlp.down_proj.weight", {h, spec.ffn}, split_kind::dim1, init_kind::weight);
  }
  if (last) {
    add("norm.weight", {h}, split_kind::replicated, init_kind::norm_weight);
    // Vocabulary-parallel head: each rank computes the logits of its slice.
    if (!spec.tied_embeddings)
      add("lm_head.weight", {spec.vocab, h}, split_kind::vocab, init_kind::embedding);
    else if (!first)
      add("embed_tokens.weight", {spec.vocab, h}, split_kind::vocab, init_kind::embedding);
  }
}

}  // namespace computron::models::detail
