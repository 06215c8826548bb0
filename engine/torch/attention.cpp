// A decoder stage's attention over its KV blocks: a prefill over the step's own keys, and
// an extend step (decode, a later chunk) either in place, reading each row's blocks where
// they lie through engine/paged_attention (the host build on the CPU, the CUDA kernel on a
// GPU), or over the rows' blocks gathered per layer (long chunks on the CPU, where BLAS
// beats the host loops, and the path the in-place one is checked against).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <limits>
#include <stdexcept>

#include "engine/paged_attention.hpp"
#include "engine/torch/decoder_block.hpp"
#include "engine/torch/kv_blocks.hpp"
#include "engine/torch/torch_interop.hpp"
#ifdef COMPUTRON_WITH_CUDA_KERNELS
#include "engine/cuda/paged_attention.hpp"
#endif

namespace computron::models {

namespace {

/// A group's queries in one host call up to which the in-place loops beat a gather and
/// two BLAS products on the CPU: a decode step's group, a short chunk's. (A long chunk's
/// queries make the products compute-bound, where BLAS is many times faster than the
/// loops.)
constexpr int64_t host_max_queries = 64;

engine::element_type element_of(gpu::dtype t) {
  if (t == gpu::dtype::bf16) return engine::element_type::bf16;
  if (t == gpu::dtype::f16) return engine::element_type::f16;
  if (t == gpu::dtype::f32) return engine::element_type::f32;
  throw std::invalid_argument(fmt::format("paged attention in {}", gpu::to_string(t)));
}

}  // namespace

bool detail::stage_state::in_place(int64_t t) const {
  const auto queries = local_heads / local_kv_heads * t;
  switch (paged) {
    case paged_kernel::host:
      return queries <= host_max_queries;
    case paged_kernel::cuda:
#ifdef COMPUTRON_WITH_CUDA_KERNELS
      return engine::cuda::paged_attention_fits(queries, head_dim, kv_block_tokens);
#else
      return false;
#endif
    case paged_kernel::none:
      break;
  }
  return false;
}

at::Tensor detail::stage_state::attend_in_place(const at::Tensor& q, int64_t layer,
                                                const kv_step& kv) const {
  const auto b = q.size(0), t = q.size(2);
  // [b, heads, t, d]: at t == 1 the blocks' transposed view is contiguous already.
  auto queries = q.contiguous();
  auto out = at::empty({b, t, local_heads * head_dim}, q.options());
  engine::paged_attention_args a;
  a.type = element_of(type);
  a.rows = static_cast<int32_t>(b);
  a.columns = static_cast<int32_t>(t);
  a.heads = static_cast<int32_t>(local_heads);
  a.kv_heads = static_cast<int32_t>(local_kv_heads);
  a.head_dim = static_cast<int32_t>(head_dim);
  a.block_tokens = static_cast<int32_t>(kv_block_tokens);
  a.table_width = static_cast<int32_t>(kv.read_blocks);
  a.max_positions = static_cast<int32_t>(kv.read_positions);
  a.queries = queries.const_data_ptr();
  a.out = out.data_ptr();
  a.chunks = static_cast<int32_t>(kv.chunks.size());
  if (kv.chunk_table != nullptr) {
    // A graph's step: the chunks as the pool's table holds them at the replay, and splits
    // that follow each row's reach (the bucket's split count is fixed at its capture).
    a.chunk_table = kv.chunk_table + layer * engine::paged_max_chunks;
    a.splits_by_reach = true;
  } else {
    for (size_t c = 0; c < kv.chunks.size(); ++c) {
      auto& chunk = a.chunk[c];
      chunk.keys = kv.pool->layer_data(kv.chunks[c], layer, 0, chunk.head_stride);
      chunk.values = kv.pool->layer_data(kv.chunks[c], layer, 1, chunk.head_stride);
    }
  }
  if (paged == paged_kernel::host) {
    a.table = kv.table.data();
    a.limits = kv.limits.data();
    if (auto why = engine::paged_attention_host_refusal(a))
      throw std::invalid_argument(fmt::format("paged attention: {}", why));
    // Each (row, kv head) apart: libtorch's intra-op threads take ranges of them.
    at::parallel_for(0, b * local_kv_heads, 1, [&](int64_t begin, int64_t end) {
      engine::paged_attention_host(a, begin, end);
    });
    return out;
  }
#ifdef COMPUTRON_WITH_CUDA_KERNELS
  a.table = kv.on_device.const_data_ptr<int64_t>();
  a.limits = a.table + kv.table.size();
  auto stream = enter_cuda_device(q.device());
  const auto splits = engine::cuda::paged_attention_splits(a);
  const auto bytes = engine::cuda::paged_attention_workspace_bytes(a, splits);
  at::Tensor workspace;
  if (bytes > 0)
    workspace =
        at::empty({static_cast<int64_t>(bytes / sizeof(float))}, q.options().dtype(at::kFloat));
  if (auto why = engine::cuda::paged_attention_launch(
          a, splits, workspace.defined() ? workspace.data_ptr() : nullptr, stream))
    throw std::runtime_error(fmt::format("paged attention kernel: {}", why));
  return out;
#else
  throw std::logic_error("paged attention on CUDA in a build without the kernel");
#endif
}

at::Tensor detail::stage_state::attend(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, int64_t i, const kv_step& kv) const {
  const auto b = q.size(0);
  const auto t = q.size(2);
  const auto groups = local_heads / local_kv_heads;
  const auto layer = i - layer_begin;
  if (k.defined() && kv.in_place && write_in_place(k, v, kv, layer)) {
    // The keys and values went into the blocks by slot (what a graph's step needs: no
    // per-step index tensors).
  } else if (k.defined()) {
    if (kv.chunk_table != nullptr)
      throw std::logic_error("attend: a graph's step without the fused KV write");
    kv.write(layer, k, v);
  } else if (!kv.in_place)
    throw std::logic_error("attend: no keys, and a step that does not read its blocks in place");
  if (kv.in_place) return attend_in_place(q, layer, kv);
  constexpr auto hidden = -std::numeric_limits<float>::infinity();
  if (kv.prefill) {
    // The cache was empty: the step's keys are all the keys (left-padded rows, `visible`
    // leaves the padding out). libtorch's fused attention: no [b, heads, t, t] scores in memory,
    // the softmax in f32 inside the kernel whatever the weights are, and grouped queries
    // reading their kv head without a copy (enable_gqa). The queries come scaled.
    return at::scaled_dot_product_attention(q, k, v, kv.visible, 0.0, false, 1.0, groups > 1)
        .transpose(1, 2)
        .reshape({b, t, local_heads * head_dim});
  }
  // Extend (decode, a later prefill chunk): the rows' blocks gathered, [kv heads, b,
  // positions, d], each row from position 0, each query blocked past its own position.
  // Each key/value head's queries (its `groups` heads' t columns, in order) form one
  // matrix, so grouped heads read the keys once instead of a copy per query head; the
  // products and the f32 softmax are the unbatched forward's.
  auto [keys, values] = kv.gather(layer);
  auto qg = q.reshape({b, local_kv_heads, groups * t, head_dim}).transpose(0, 1);
  auto scores = at::matmul(qg, keys.transpose(-1, -2)).to(at::kFloat);
  // The mask is [1, b, 1, t, positions]: the same for every head of a group.
  scores.view({local_kv_heads, b, groups, t, keys.size(2)}).masked_fill_(kv.blocked, hidden);
  auto probs = at::softmax(scores, -1).to(q.scalar_type());
  // [kv heads, b, groups x t, d] -> [b, t, heads x d], head = kv head x groups + group.
  return at::matmul(probs, values)
      .view({local_kv_heads, b, groups, t, head_dim})
      .permute({1, 3, 0, 2, 4})
      .reshape({b, t, local_heads * head_dim});
}

}  // namespace computron::models
