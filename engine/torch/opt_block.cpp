// OPT's block: learned positions (offset by 2), pre-LayerNorm, biases everywhere, ReLU
// MLP, the head tied to the token embedding. The op order is the original forward's, so
// its outputs stay bit for bit.
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

#include "engine/torch/decoder_block.hpp"

namespace computron::models::detail {

namespace {

class opt_block final : public decoder_block {
 public:
  caf::expected<at::Tensor> embed(const stage_state& s, const at::Tensor& ids,
                                  const at::Tensor& positions) const override {
    // OPT's learned positions start at 2 (a fairseq legacy).
    auto pos = at::embedding(s.param("embed_positions.weight"), positions + 2);
    if (s.par.tp == 1) return at::embedding(s.param("embed_tokens.weight"), ids) + pos;
    // Each rank holds a slice of the vocabulary and of the positions' columns: its token
    // rows plus its position columns, summed by one all-reduce. Each element is then one
    // token value plus one position value (the rest are zeros), rounded once to the
    // dtype, as the unsharded sum is.
    auto x = s.vocab_lookup("embed_tokens.weight", ids);
    auto cols = pos.size(-1);
    x.narrow(-1, s.shard.tp_rank * cols, cols).add_(pos);
    if (auto err = s.all_reduce(x)) return err;
    return x;
  }

  caf::expected<at::Tensor> layer(const stage_state& s, int64_t i, at::Tensor x, const at::Tensor&,
                                  const kv_step& kv) const override {
    auto p = fmt::format("layers.{}.", i);
    auto h_dim = s.spec.hidden;
    auto b = x.size(0);
    auto t = x.size(1);
    auto residual = x;
    auto h = at::layer_norm(x, {h_dim}, s.param(p + "self_attn_layer_norm.weight"),
                            s.param(p + "self_attn_layer_norm.bias"), 1e-5);
    auto scaling = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    auto split = [&](const at::Tensor& y) {
      return y.view({b, t, s.local_heads, s.head_dim}).transpose(1, 2);
    };
    // Column-parallel projections with their bias slices; the adapter's delta (if a row
    // has one) joins each before q's scaling, as PEFT wraps q_proj itself.
    auto linear = [&](const at::Tensor& in, const std::string& m, const char* proj) {
      auto bias = s.param(p + m + ".bias");
      return s.project(in, i, proj, s.param(p + m + ".weight"), &bias);
    };
    // q, k and v in one product over their weights (and biases) side by side.
    auto a = p + "self_attn.";
    auto qkv = s.project_fused(h, i, {"q_proj", "k_proj", "v_proj"},
                               {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                               {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"});
    auto q = split(qkv[0] * scaling);
    auto k = split(qkv[1]);
    auto v = split(qkv[2]);
    auto o = s.attend(q, k, v, i, kv);
    // Row-parallel: the delta is a partial sum like the base's and joins the all-reduce;
    // the bias is added once, after it.
    o = s.project(o, i, "out_proj", s.param(p + "self_attn.out_proj.weight"));
    if (auto err = s.all_reduce(o)) return err;
    x = residual + o + s.param(p + "self_attn.out_proj.bias");
    h = at::layer_norm(x, {h_dim}, s.param(p + "final_layer_norm.weight"),
                       s.param(p + "final_layer_norm.bias"), 1e-5);
    h = at::relu(linear(h, "fc1", "fc1"));
    h = s.project(h, i, "fc2", s.param(p + "fc2.weight"));
    if (auto err = s.all_reduce(h)) return err;
    return x + h + s.param(p + "fc2.bias");
  }

  at::Tensor head(const stage_state& s, const at::Tensor& last) const override {
    auto normed = at::layer_norm(last, {s.spec.hidden}, s.param("final_layer_norm.weight"),
                                 s.param("final_layer_norm.bias"), 1e-5);
    return at::matmul(normed, s.param("embed_tokens.weight").t()).to(at::kFloat);
  }
};

}  // namespace

std::unique_ptr<decoder_block> make_opt_block(const stage_state&) {
  return std::make_unique<opt_block>();
}

}  // namespace computron::models::detail
