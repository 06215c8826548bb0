#pragma once

// What a family's block sees of the decoder stage core, and the blocks the core runs.
// Internal: include it only from the .cpp files that already pay for torch.
#include <ATen/core/Tensor.h>

#include <caf/expected.hpp>

#include <cstddef>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/torch/decoder_stage.hpp"
#include "gpu/collective.hpp"
#include "gpu/weight_store.hpp"
#include "models/decoder_spec.hpp"

namespace computron::models::detail {

/// What a step does with the KV blocks (engine/torch/kv_blocks.hpp).
struct kv_step;

/// One LoRA adapter's rows of a step: the rows (batch positions) that run with it and its
/// per-rank matrices, viewed in place in its weight shard (engine/torch/lora_forward.cpp).
struct lora_group {
  /// The rows, on the device; undefined when the adapter runs every row of the step.
  at::Tensor rows;
  /// Per (stage-relative layer x projection of stage_state::lora_projs): A [r x in] and B
  /// [out x r] (the scale folded in), in the stage's dtype; undefined where the adapter
  /// leaves the projection alone.
  const std::vector<std::pair<at::Tensor, at::Tensor>>* pairs = nullptr;
};

/// A step's adapters' matrices side by side, for the one pass over several adapters:
/// per (stage-relative layer x projection), the A of every group adapting it stacked
/// [sum r x in] and their B [out x sum r], in the groups' order. Kept by the stage while
/// the same adapters run in the same order (decode steps of one batch), so that a step
/// does not copy them again per projection.
struct lora_stacks {
  /// Per group: its adapter's id and where its bytes lay when stacked.
  std::vector<std::pair<int64_t, const std::byte*>> key;
  std::vector<std::pair<at::Tensor, at::Tensor>> sites;
};

/// Site `at`'s A of every group that adapts it stacked, and their B side by side, in the
/// groups' order; undefined when none does (engine/torch/lora_forward.cpp).
std::pair<at::Tensor, at::Tensor> stack_site(const std::vector<lora_group>& groups, size_t site);

/// A step's rows grouped by adapter, computed once per step (not per projection); base-only
/// rows are in no group. A step without adapter rows has no lora_batch at all.
struct lora_batch {
  std::vector<lora_group> groups;
  /// The groups' matrices stacked (several groups, and small enough to keep); null: each
  /// projection stacks them itself.
  std::shared_ptr<const lora_stacks> stacks{};
  /// Steps of several adapters add their deltas in one pass per projection (lora_forward's
  /// project): per set of groups adapting it (a bit per group), which columns of the
  /// concatenated x A^T each row drops (another adapter's), built at the first projection
  /// that needs it.
  mutable std::map<uint64_t, at::Tensor> masks{};
};

/// The stage's state that blocks read: shape, split, where the weights are, the group.
struct stage_state {
  decoder_spec spec;
  parallel_config par;
  shard_index shard;
  gpu::weight_shard* weights = nullptr;
  gpu::collective* tp = nullptr;
  gpu::dtype type = gpu::dtype::f32;
  at::TensorOptions options;
  int64_t layer_begin = 0;
  int64_t layer_end = 0;
  /// Query heads and key/value heads this rank computes, and their width.
  int64_t local_heads = 0;
  int64_t local_kv_heads = 0;
  int64_t head_dim = 0;
  /// Device address of the shard for the call in progress.
  std::byte* base = nullptr;
  /// The vocabulary slice of this rank's embedding and head: ids [vocab_begin,
  /// vocab_begin + vocab_rows) (models::vocab_rows; the last rank's may pass the end).
  int64_t vocab_begin = 0;
  int64_t vocab_rows = 0;
  /// The projections an adapter may adapt (lora_projections), whose order indexes
  /// lora_group::pairs.
  std::vector<std::string> lora_projs;
  /// The step in progress's adapter rows; null when no row of the step has an adapter.
  const lora_batch* lora = nullptr;
  /// Where an extend step's attention reads the KV blocks in place
  /// (engine/paged_attention.hpp): nowhere (every step gathers), the host build (a stage
  /// on the CPU or an emulated device) or the CUDA kernel.
  enum class paged_kernel : uint8_t { none, host, cuda };
  paged_kernel paged = paged_kernel::none;
  /// Where RMSNorm and its residual add run as one call (engine/norms.hpp), with the same
  /// choice of builds; none: as libtorch ops (compute_options::fused_norms false, or f16 on
  /// the CPU).
  paged_kernel norms = paged_kernel::none;
  /// Likewise the rotary embedding of q and k in one call (engine/rope.hpp).
  paged_kernel rope = paged_kernel::none;
  /// Calls of the fused builds so far (tests: the fused path ran, not the ops' fallback).
  mutable uint64_t fused_calls = 0;

  bool first() const { return shard.pp_rank == 0; }
  bool last() const { return shard.pp_rank == par.pp - 1; }

  /// A zero-copy view of parameter `name` in the shard's device copy.
  at::Tensor param(const std::string& name) const;
  /// Parameters `names` as one tensor in place, concatenated along their first dimension
  /// ([q; k; v] of a layer's projections, [gate; up]): a view where they lie side by side
  /// in the shard with no gap and agree in their other dimensions (the families lay them
  /// out so), else an undefined tensor and the caller projects them one by one.
  at::Tensor fused(std::initializer_list<std::string> names) const;
  /// A projection of layer `i` (absolute index): at::linear(x, w, bias) over x [b, t, in],
  /// plus, for the rows whose adapter adapts (i, proj) (proj one of lora_projs: "q_proj",
  /// "fc2", ...), their LoRA delta (x A^T) B^T, one adapter's rows together. A
  /// row-parallel projection's delta is this rank's partial sum like the base's: call it
  /// before the all-reduce, and pass no bias that the all-reduce would count tp times
  /// (such a bias is added after it). Without adapter rows, the plain linear.
  at::Tensor project(const at::Tensor& x, int64_t i, const char* proj, const at::Tensor& w,
                     const at::Tensor* bias = nullptr) const;
  /// project's adapter part alone: adds the LoRA delta of (i, proj) for the step's adapter
  /// rows to `y`, the base projection of x (or a view of one: a slice of a fused product),
  /// in place. Nothing without adapter rows.
  void add_lora(at::Tensor& y, const at::Tensor& x, int64_t i, const char* proj) const;
  /// Projections of layer `i` that share their input: one product over their weights
  /// fused in place (`weights`, and `biases` if any, as fused() gives them), split into
  /// each projection's output of `rows`, each with its LoRA delta (`projs`). Falls back to
  /// one product each where the weights are not side by side.
  std::vector<at::Tensor> project_fused(const at::Tensor& x, int64_t i,
                                        std::initializer_list<const char*> projs,
                                        std::initializer_list<std::string> weights,
                                        std::initializer_list<std::string> biases = {}) const;
  /// Sums `t` over the tensor-parallel group (in f32, whatever t's dtype).
  caf::error all_reduce(at::Tensor& t) const;
  /// The rows of vocabulary-parallel table `name` for token ids [b, t]: the ids this rank
  /// holds, zeros for the others, so that the group's all-reduce completes the lookup
  /// (Megatron's VocabParallelEmbedding). At tp 1, the plain lookup.
  at::Tensor vocab_lookup(const std::string& name, const at::Tensor& ids) const;
  /// Logits [n, vocab] in f32 from this rank's slice [n, vocab_rows] (its columns of the
  /// head): each rank writes its columns, the all-reduce sums them (adding zeros is
  /// exact), the padding is cut off. At tp 1, `local` as it is.
  caf::expected<at::Tensor> gather_vocab(const at::Tensor& local) const;
  /// Each row's `k` most likely ids of the whole vocabulary [n, k, 2] (f32 (logit, id), on
  /// the host; see head_output) from this rank's slice, without gathering it: each rank's k
  /// best, one all-reduce of n x tp x k pairs, the k best of those. Ties go to the lower id,
  /// as a stable sort of the gathered logits orders them; padding is never a candidate.
  /// `local` is the head's own output: its NaN become -inf in place.
  caf::expected<at::Tensor> top_vocab(const at::Tensor& local, int64_t k) const;
  /// Attention of this rank's heads in layer `i` (absolute index): `q` [b, heads, t, d]
  /// already scaled, `k` and `v` [b, kv heads, t, d] of the step's positions, which go into
  /// the rows' KV blocks (keys and values are cached per key/value head; grouped queries
  /// share them). Returns [b, t, heads x d]. Softmax runs in f32. `k` undefined: the step's
  /// keys and values are in the blocks already (fused_rope wrote them; in-place steps only).
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t i,
                    const kv_step& kv) const;
  /// Whether an extend step of `t` columns reads its blocks in place (plan_extend's
  /// `in_place`): on the CPU while a group's queries are few enough that the host loops beat
  /// a gather and BLAS (decode, short chunks); on a GPU while the kernel holds them.
  bool in_place(int64_t t) const;
  /// attend's extend step in place: `q` [b, heads, t, d], stage-relative `layer`.
  at::Tensor attend_in_place(const at::Tensor& q, int64_t layer, const kv_step& kv) const;
  /// transformers' RMSNorm of `x` [..., width]: the mean square in f32, the normalised row
  /// rounded to x's dtype, then times `weight` (engine/torch/fused_ops.cpp).
  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) const;
  /// The residual stream after a block's output and the next norm of it, in one call where
  /// a build of engine/norms.hpp runs: {x + delta (+ bias, where defined), rms_norm of
  /// that}, rounded as the ops `x + delta`, `+ bias` and rms_norm round.
  std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                 const at::Tensor& bias, const at::Tensor& weight,
                                                 double eps) const;
  /// The rotary embedding of a step's queries `q` [b, t, heads, d] and keys `k` [b, t, kv
  /// heads, d] (views of the projection's output, each head's d elements contiguous) at
  /// `positions` [b, t] (int64, on the device) with `inv_freq` [d / 2] (f32, on the
  /// device), q times `q_scale`: {q [b, heads, t, d], k [b, kv heads, t, d]}, contiguous, in
  /// one call where a build of engine/rope.hpp runs; nullopt where none does (the caller
  /// computes the ops). On an in-place step (`kv`, stage-relative `layer`) the same call
  /// writes the rotated keys and the values `v` [b, t, kv heads, d] (laid out as `k`) into
  /// the rows' blocks, and the k it returns is undefined: nothing is left for attend's
  /// write, and attention reads the blocks.
  /// An in-place step's keys `k` and values `v` [b, kv heads, t, d] of stage-relative
  /// `layer` written into the rows' blocks by slot in one call (engine/rope.hpp's write
  /// without rotation: OPT's keys), where a build runs; false where none does (the caller
  /// writes them with kv_step::write).
  bool write_in_place(const at::Tensor& k, const at::Tensor& v, const kv_step& kv,
                      int64_t layer) const;
  std::optional<std::pair<at::Tensor, at::Tensor>> fused_rope(
      const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions,
      const at::Tensor& inv_freq, double q_scale, const at::Tensor& v = {},
      const kv_step* kv = nullptr, int64_t layer = 0) const;
};

/// A family's decoder: token embedding, one layer, the head. Stateless apart from what
/// it precomputes at creation (the rotary frequencies).
class decoder_block {
 public:
  virtual ~decoder_block() = default;
  /// Hidden states [b, t, hidden] of token ids [b, t] at `positions` [b, t] (0-based real
  /// positions; padding at 0).
  virtual caf::expected<at::Tensor> embed(const stage_state& s, const at::Tensor& ids,
                                          const at::Tensor& positions) const = 0;
  /// Layer `i` (absolute index) over `x` [b, t, hidden] at `positions` [b, t]; its
  /// attention reads and extends the cache as `kv` plans (stage_state::attend).
  virtual caf::expected<at::Tensor> layer(const stage_state& s, int64_t i, at::Tensor x,
                                          const at::Tensor& positions, const kv_step& kv) const = 0;
  /// This rank's logits [b, vocab_rows] in f32 of the last hidden states [b, hidden]: its
  /// slice of the vocabulary-parallel head (the core gathers them or takes their best).
  virtual at::Tensor head(const stage_state& s, const at::Tensor& last) const = 0;
};

std::unique_ptr<decoder_block> make_opt_block(const stage_state& s);
std::unique_ptr<decoder_block> make_llama_block(const stage_state& s);

}  // namespace computron::models::detail
