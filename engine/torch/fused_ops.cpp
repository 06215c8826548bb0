// A layer's RMSNorm and the residual add before it, and the rotary embedding of its
// queries and keys, each in one call where a build of engine/norms.hpp or engine/rope.hpp
// runs on the stage's device (the host build on the CPU, the kernels on CUDA), else as
// libtorch ops; both round as the unfused ops do.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include "engine/norms.hpp"
#include "engine/rope.hpp"
#include "engine/torch/decoder_block.hpp"
#include "engine/torch/kv_blocks.hpp"
#include "engine/torch/torch_interop.hpp"
#ifdef COMPUTRON_WITH_CUDA_KERNELS
#include "engine/cuda/norms.hpp"
#include "engine/cuda/rope.hpp"
#endif

namespace computron::models {

namespace {

/// transformers' RMSNorm as libtorch ops: the mean square in f32, the weight applied in
/// the input dtype.
at::Tensor rms_norm_ops(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto f = x.to(at::kFloat);
  auto var = f.pow(2).mean(-1, true);
  return weight * (f * at::rsqrt(var + eps)).to(x.scalar_type());
}

std::optional<engine::element_type> element_of(at::ScalarType t) {
  if (t == at::kFloat) return engine::element_type::f32;
  if (t == at::kBFloat16) return engine::element_type::bf16;
  if (t == at::kHalf) return engine::element_type::f16;
  return std::nullopt;
}

/// The call's arguments where a build takes x, delta, bias and weight as they are (one
/// dtype, a weight of x's width); nullopt: the ops instead.
std::optional<engine::rms_norm_args> norm_args(const at::Tensor& x, const at::Tensor& delta,
                                               const at::Tensor& bias, const at::Tensor& weight,
                                               double eps) {
  auto type = element_of(x.scalar_type());
  // What the builds refuse (engine/norms.hpp) is computed by the ops instead.
  if (!type || x.dim() < 1 || x.numel() == 0 || !(static_cast<float>(eps) > 0) ||
      x.size(-1) > (int64_t{1} << 30) || weight.scalar_type() != x.scalar_type() ||
      weight.dim() != 1 || weight.size(0) != x.size(-1) || !weight.is_contiguous())
    return std::nullopt;
  if (delta.defined() && (delta.sizes() != x.sizes() || delta.scalar_type() != x.scalar_type()))
    return std::nullopt;
  if (bias.defined() && (!delta.defined() || bias.scalar_type() != x.scalar_type() ||
                         bias.dim() != 1 || bias.size(0) != x.size(-1) || !bias.is_contiguous()))
    return std::nullopt;
  engine::rms_norm_args a;
  a.type = *type;
  a.width = x.size(-1);
  a.rows = x.numel() / a.width;
  a.weight = weight.const_data_ptr();
  a.bias = bias.defined() ? bias.const_data_ptr() : nullptr;
  a.eps = static_cast<float>(eps);
  return a;
}

}  // namespace

namespace detail {

namespace {

/// Runs `a` (its pointers set) with the stage's build.
void run_norm(const stage_state& s, const engine::rms_norm_args& a, const at::Tensor& x) {
  if (s.norms == stage_state::paged_kernel::host) {
    if (auto why = engine::rms_norm_host_refusal(a))
      throw std::invalid_argument(fmt::format("rms norm: {}", why));
    // Rows apart: libtorch's intra-op threads take ranges of them.
    const int64_t grain = std::max<int64_t>(1, 16384 / a.width);
    at::parallel_for(0, a.rows, grain,
                     [&](int64_t begin, int64_t end) { engine::rms_norm_host(a, begin, end); });
    return;
  }
#ifdef COMPUTRON_WITH_CUDA_KERNELS
  auto stream = enter_cuda_device(x.device());
  if (auto why = engine::cuda::rms_norm_launch(a, stream))
    throw std::runtime_error(fmt::format("rms norm kernel: {}", why));
#else
  throw std::logic_error("rms norm on CUDA in a build without the kernel");
#endif
}

/// The KV write's part of a rotary call: where each item's key and value go (the step's
/// slots) and the chunks they name (passed, or a graph's table of the pool's chunks).
void aim_kv_write(const stage_state& s, engine::rope_args& a, const kv_step& kv, int64_t layer) {
  a.cache_chunks = static_cast<int32_t>(kv.chunks.size());
  if (kv.chunk_table != nullptr) {
    a.cache_table = kv.chunk_table + layer * engine::paged_max_chunks;
  } else {
    for (size_t c = 0; c < kv.chunks.size(); ++c) {
      auto& chunk = a.cache[c];
      // The pool's memory is the step's to write here, as kv_step::write writes it.
      chunk.keys =
          const_cast<void*>(kv.pool->layer_data(kv.chunks[c], layer, 0, chunk.head_stride));
      chunk.values =
          const_cast<void*>(kv.pool->layer_data(kv.chunks[c], layer, 1, chunk.head_stride));
    }
  }
  a.cache_slots = s.rope == stage_state::paged_kernel::host
                      ? kv.slots.data()
                      : kv.on_device.const_data_ptr<int64_t>() + kv.table.size() + kv.limits.size();
}

/// Runs a rotary call (its pointers set) with the stage's build; false where none runs.
bool run_rope(const stage_state& s, const engine::rope_args& a) {
  if (s.rope == stage_state::paged_kernel::host) {
    if (auto why = engine::rope_host_refusal(a))
      throw std::invalid_argument(fmt::format("rope: {}", why));
    const int64_t grain =
        std::max<int64_t>(1, 64 / std::max<int64_t>(1, a.heads > 0 ? a.heads : a.kv_heads));
    at::parallel_for(0, a.rows * a.columns, grain,
                     [&](int64_t begin, int64_t end) { engine::rope_host(a, begin, end); });
    ++s.fused_calls;
    return true;
  }
#ifdef COMPUTRON_WITH_CUDA_KERNELS
  auto stream = enter_cuda_device(s.options.device());
  if (auto why = engine::cuda::rope_launch(a, stream))
    throw std::runtime_error(fmt::format("rope kernel: {}", why));
  ++s.fused_calls;
  return true;
#else
  return false;
#endif
}

bool has_build(stage_state::paged_kernel k) {
#ifdef COMPUTRON_WITH_CUDA_KERNELS
  return k != stage_state::paged_kernel::none;
#else
  return k == stage_state::paged_kernel::host;
#endif
}

}  // namespace

at::Tensor stage_state::rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) const {
  auto a = has_build(norms) ? norm_args(x, {}, {}, weight, eps) : std::nullopt;
  if (!a) return rms_norm_ops(x, weight, eps);
  auto in = x.contiguous();
  auto out = at::empty_like(in);
  a->x = in.const_data_ptr();
  a->out = out.data_ptr();
  run_norm(*this, *a, in);
  ++fused_calls;
  return out;
}

std::pair<at::Tensor, at::Tensor> stage_state::add_rms_norm(const at::Tensor& x,
                                                            const at::Tensor& delta,
                                                            const at::Tensor& bias,
                                                            const at::Tensor& weight,
                                                            double eps) const {
  auto a = has_build(norms) ? norm_args(x, delta, bias, weight, eps) : std::nullopt;
  if (!a) {
    auto sum = x + delta;
    if (bias.defined()) sum = sum + bias;
    return {sum, rms_norm_ops(sum, weight, eps)};
  }
  auto in = x.contiguous();
  auto d = delta.contiguous();
  auto sum = at::empty_like(in);
  auto out = at::empty_like(in);
  a->x = in.const_data_ptr();
  a->delta = d.const_data_ptr();
  a->sum = sum.data_ptr();
  a->out = out.data_ptr();
  run_norm(*this, *a, in);
  ++fused_calls;
  return {sum, out};
}

std::optional<std::pair<at::Tensor, at::Tensor>> stage_state::fused_rope(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions,
    const at::Tensor& inv_freq, double q_scale, const at::Tensor& v, const kv_step* kv,
    int64_t layer) const {
  auto type = element_of(q.scalar_type());
  if (!has_build(rope) || !type || q.dim() != 4 || k.dim() != 4 || q.size(3) % 2 != 0 ||
      q.size(3) > 4096 || k.scalar_type() != q.scalar_type() || q.size(3) != k.size(3) ||
      q.size(0) != k.size(0) || q.size(1) != k.size(1) || q.stride(3) != 1 || k.stride(3) != 1 ||
      q.stride(2) != q.size(3) || k.stride(2) != k.size(3) ||
      inv_freq.scalar_type() != at::kFloat || inv_freq.numel() * 2 != q.size(3) ||
      positions.scalar_type() != at::kLong || positions.numel() != q.size(0) * q.size(1))
    return std::nullopt;
  const auto b = q.size(0), t = q.size(1), d = q.size(3);
  auto pos = positions.contiguous();
  auto freq = inv_freq.contiguous();
  // An in-place step's keys and values go into the blocks in this call (the values as
  // they are, laid out as the keys), and no head-major copy of the keys is made.
  const bool into_blocks =
      kv != nullptr && kv->in_place && v.defined() && kv->pool->options().dtype() == k.dtype() &&
      kv->pool->options().device() == k.device() && v.sizes() == k.sizes() &&
      v.scalar_type() == k.scalar_type() && v.stride(3) == 1 && v.stride(2) == d &&
      static_cast<int64_t>(kv->slots.size()) == b * t && !kv->chunks.empty() &&
      static_cast<int64_t>(kv->chunks.size()) <= engine::paged_max_chunks;
  auto q_out = at::empty({b, q.size(2), t, d}, q.options());
  auto k_out = into_blocks ? at::Tensor{} : at::empty({b, k.size(2), t, d}, k.options());
  engine::rope_args a;
  a.type = *type;
  a.rows = b;
  a.columns = t;
  a.heads = q.size(2);
  a.kv_heads = k.size(2);
  a.head_dim = d;
  a.q = q.const_data_ptr();
  a.q_row_stride = q.stride(0);
  a.q_column_stride = q.stride(1);
  a.k = k.const_data_ptr();
  a.k_row_stride = k.stride(0);
  a.k_column_stride = k.stride(1);
  a.positions = pos.const_data_ptr<int64_t>();
  a.inv_freq = freq.const_data_ptr<float>();
  a.q_scale = q_scale;
  a.q_out = q_out.data_ptr();
  a.k_out = into_blocks ? nullptr : k_out.data_ptr();
  if (into_blocks) {
    a.v = v.const_data_ptr();
    a.v_row_stride = v.stride(0);
    a.v_column_stride = v.stride(1);
    aim_kv_write(*this, a, *kv, layer);
  }
  if (!run_rope(*this, a)) return std::nullopt;
  return std::make_pair(q_out, k_out);
}

bool stage_state::write_in_place(const at::Tensor& k, const at::Tensor& v, const kv_step& kv,
                                 int64_t layer) const {
  // [b, kv heads, t, d] views whose heads' d elements lie side by side (a head-major view
  // of the projection's output).
  auto type = element_of(k.scalar_type());
  if (!has_build(rope) || !type || !kv.in_place || k.dim() != 4 || v.sizes() != k.sizes() ||
      v.scalar_type() != k.scalar_type() || k.stride(3) != 1 || v.stride(3) != 1 ||
      k.stride(1) != k.size(3) || v.stride(1) != v.size(3) ||
      kv.pool->options().dtype() != k.dtype() || kv.pool->options().device() != k.device() ||
      static_cast<int64_t>(kv.slots.size()) != k.size(0) * k.size(2) || kv.chunks.empty() ||
      static_cast<int64_t>(kv.chunks.size()) > engine::paged_max_chunks)
    return false;
  engine::rope_args a;
  a.type = *type;
  a.rotate = false;
  a.rows = k.size(0);
  a.columns = k.size(2);
  a.heads = 0;
  a.kv_heads = k.size(1);
  a.head_dim = k.size(3);
  a.k = k.const_data_ptr();
  a.k_row_stride = k.stride(0);
  a.k_column_stride = k.stride(2);
  a.v = v.const_data_ptr();
  a.v_row_stride = v.stride(0);
  a.v_column_stride = v.stride(2);
  aim_kv_write(*this, a, kv, layer);
  return run_rope(*this, a);
}

}  // namespace detail

}  // namespace computron::models
