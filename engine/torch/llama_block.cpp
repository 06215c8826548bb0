// The Llama family's block (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3) as Hugging Face's
// transformers computes it: RMSNorm in f32 then back to the weights' dtype, rotary
// embeddings by rotate-half (with linear or llama3 frequency scaling), grouped-query
// attention, Qwen3's per-head q/k norms before the rotation, the SwiGLU MLP, and a tied or
// untied head.
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "engine/torch/decoder_block.hpp"

namespace computron::models::detail {

namespace {

/// Hugging Face's inverse frequencies of the rotary embedding, scaling included.
std::vector<float> inverse_frequencies(const decoder_spec& spec) {
  const auto d = spec.head_size();
  const auto& r = spec.rope;
  std::vector<float> out;
  for (int64_t i = 0; i < d; i += 2) {
    double f = 1.0 / std::pow(r.theta, static_cast<double>(i) / static_cast<double>(d));
    if (r.scaling == "linear") {
      f /= r.factor;
    } else if (r.scaling == "llama3") {
      // transformers' _compute_llama3_parameters: long wavelengths slow down by `factor`,
      // short ones stay, the band between is interpolated.
      const double pi = 3.14159265358979323846;
      auto old_len = static_cast<double>(r.original_max_positions);
      auto low_wavelen = old_len / r.low_freq_factor;
      auto high_wavelen = old_len / r.high_freq_factor;
      auto wavelen = 2 * pi / f;
      auto scaled = wavelen > low_wavelen ? f / r.factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        auto smooth =
            (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        scaled = (1 - smooth) * scaled / r.factor + smooth * scaled;
      }
      f = scaled;
    }
    out.push_back(static_cast<float>(f));
  }
  return out;
}

at::Tensor rotate_half(const at::Tensor& x) {
  auto half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

class llama_block final : public decoder_block {
 public:
  explicit llama_block(const stage_state& s) {
    auto f = inverse_frequencies(s.spec);
    inv_freq_ = at::tensor(f, at::kFloat).to(s.options.device());
  }

  caf::expected<at::Tensor> embed(const stage_state& s, const at::Tensor& ids,
                                  const at::Tensor&) const override {
    auto x = s.vocab_lookup("embed_tokens.weight", ids);
    if (auto err = s.all_reduce(x)) return err;
    return x;
  }

  caf::expected<at::Tensor> layer(const stage_state& s, int64_t i, at::Tensor x,
                                  const at::Tensor& positions, const kv_step& kv) const override {
    auto p = fmt::format("layers.{}.", i);
    auto a = p + "self_attn.";
    const auto& spec = s.spec;
    auto b = x.size(0);
    auto t = x.size(1);
    auto residual = x;
    auto h = s.rms_norm(x, s.param(p + "input_layernorm.weight"), spec.norm_eps);
    // q, k and v in one product over their weights side by side (and biases, Qwen2's).
    auto qkv =
        spec.qkv_bias
            ? s.project_fused(h, i, {"q_proj", "k_proj", "v_proj"},
                              {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                              {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"})
            : s.project_fused(h, i, {"q_proj", "k_proj", "v_proj"},
                              {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"});
    auto q = qkv[0].view({b, t, s.local_heads, s.head_dim});
    auto k = qkv[1].view({b, t, s.local_kv_heads, s.head_dim});
    auto v_rows = qkv[2].view({b, t, s.local_kv_heads, s.head_dim});
    auto v = v_rows.transpose(1, 2);
    if (spec.qk_norm) {
      q = s.rms_norm(q, s.param(a + "q_norm.weight"), spec.norm_eps);
      k = s.rms_norm(k, s.param(a + "k_norm.weight"), spec.norm_eps);
    }
    const double q_scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    if (auto rotated =
            s.fused_rope(q, k, positions, inv_freq_, q_scale, v_rows, &kv, i - s.layer_begin)) {
      // One call: both rotated, q scaled, each head major as attention reads them; on an
      // in-place step the keys and values written into the blocks too (k undefined).
      q = std::move(rotated->first);
      k = std::move(rotated->second);
    } else {
      q = q.transpose(1, 2);
      k = k.transpose(1, 2);
      const auto& [cos, sin] = rotary(positions, q.scalar_type());
      q = q * cos + rotate_half(q) * sin;
      k = k * cos + rotate_half(k) * sin;
      q = q * q_scale;
    }
    auto o = s.attend(q, k, v, i, kv);
    // Row-parallel: the adapter's delta is a partial sum like the base's, so it joins the
    // all-reduce; o_proj's bias is added once, after it.
    o = s.project(o, i, "o_proj", s.param(a + "o_proj.weight"));
    if (auto err = s.all_reduce(o)) return err;
    // The residual add (and o_proj's bias) and the next norm in one call.
    std::tie(x, h) =
        s.add_rms_norm(residual, o, spec.o_bias ? s.param(a + "o_proj.bias") : at::Tensor{},
                       s.param(p + "post_attention_layernorm.weight"), spec.norm_eps);
    auto gate_up = s.project_fused(h, i, {"gate_proj", "up_proj"},
                                   {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
    h = s.project(at::silu(gate_up[0]) * gate_up[1], i, "down_proj",
                  s.param(p + "mlp.down_proj.weight"));
    if (auto err = s.all_reduce(h)) return err;
    return x + h;
  }

  at::Tensor head(const stage_state& s, const at::Tensor& last) const override {
    auto normed = s.rms_norm(last, s.param("norm.weight"), s.spec.norm_eps);
    auto w = s.spec.tied_embeddings ? s.param("embed_tokens.weight") : s.param("lm_head.weight");
    return at::matmul(normed, w.t()).to(at::kFloat);
  }

 private:
  /// cos and sin of the step's positions [b, 1, t, d], in f32 as transformers computes
  /// them, then in the activations' dtype. Every layer of a step reads the same positions
  /// tensor, so they are computed once per step: the cache holds that tensor, so its
  /// identity cannot be reused by another while it is cached. A stage has one caller at a
  /// time (decoder_stage), so the cache needs no lock.
  const std::pair<at::Tensor, at::Tensor>& rotary(const at::Tensor& positions,
                                                  at::ScalarType type) const {
    if (!cached_positions_.defined() || !cached_positions_.is_same(positions) ||
        rotary_.first.scalar_type() != type) {
      auto angles = positions.to(at::kFloat).unsqueeze(-1) * inv_freq_;
      auto emb = at::cat({angles, angles}, -1).unsqueeze(1);
      rotary_ = {emb.cos().to(type), emb.sin().to(type)};
      cached_positions_ = positions;
    }
    return rotary_;
  }

  at::Tensor inv_freq_;
  mutable at::Tensor cached_positions_;
  mutable std::pair<at::Tensor, at::Tensor> rotary_;
};

}  // namespace

std::unique_ptr<decoder_block> make_llama_block(const stage_state& s) {
  return std::make_unique<llama_block>(s);
}

}  // namespace computron::models::detail
