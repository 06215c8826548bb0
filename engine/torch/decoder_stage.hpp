#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/expected.hpp>

#include "gpu/collective.hpp"
#include "gpu/weight_store.hpp"
#include "models/decoder_spec.hpp"
#include "models/host_tensor.hpp"
#include "models/sampling.hpp"

/// The decoder stage over the weight store, one core for every family (the KV cache,
/// per-layer waits for the weights' bytes, the tensor-parallel all-reduce, host tensors
/// between stages) running the family's block (engine/torch/opt_block.cpp,
/// engine/torch/llama_block.cpp). Torch stays inside the .cpp files: this header only speaks
/// bytes, so activations can cross processes as messages.
namespace computron::models {

/// Device memory for a stage's KV blocks, as its allocator hands it out.
struct kv_memory {
  /// `bytes` on the stage's device (a host address for CPU and emulated devices).
  void* data = nullptr;
  /// Holds the memory: it goes back when the last copy of `owner` is dropped.
  std::shared_ptr<void> owner;
};

/// Where a stage's KV blocks come from.
struct kv_pool_options {
  /// `bytes` of device memory on the stage's device, or an error (out_of_device_memory
  /// when there is no room). The shard worker's takes them from the shard's gpu::device,
  /// so that KV bytes share the weights' memory. Empty: libtorch allocates them with the
  /// stage's tensor options (tests, benchmarks).
  std::function<caf::expected<kv_memory>(uint64_t bytes)> allocate;
  /// Blocks of the smallest chunk the pool asks for (a chunk of 16 holds 256 positions of
  /// one row): fewer, larger chunks mean fewer allocator calls and gathers per step.
  int64_t min_chunk_blocks = 16;
  /// The device's page: allocate maps whole pages, so a chunk takes as many blocks as
  /// fill its pages (none of a page is wasted), and the pool counts its bytes in pages.
  uint64_t page_bytes = 1;
  /// Decode and short extend steps read the rows' KV blocks where they lie
  /// (engine/paged_attention.hpp: the host build on the CPU, the CUDA kernel on a GPU).
  /// False: each step gathers every row's blocks per layer (the path the in-place one is
  /// checked against).
  bool paged_attention = true;
};

/// How a stage computes what it can compute more than one way: the figures of the issue
/// "Decode near the memory floor" compare the two.
struct compute_options {
  /// RMSNorm and the residual add before it in one call (engine/norms.hpp: the host build
  /// on the CPU, the kernel on CUDA). False: libtorch ops, about nine a norm.
  bool fused_norms = true;
  /// The rotary embedding of q and k in one call (engine/rope.hpp). False: libtorch ops,
  /// about eight each.
  bool fused_rope = true;
  /// Decode steps of up to this many rows run through buffers of fixed addresses, one set
  /// per batch-size bucket (engine/graph_inputs.hpp), and on CUDA replay a graph captured
  /// over them (decoder_stage::capture_graphs). On the CPU nothing is captured: the same
  /// step runs eagerly over the same buffers, which is how the tests check what a graph
  /// computes. 0: off. Only where the step can run that way: one tensor-parallel rank
  /// (the all-reduce is not captured), in-place attention and the fused rotary build.
  int32_t graph_max_batch = 0;
};

/// What the decode graphs of a stage did (compute_options::graph_max_batch).
struct graph_stats {
  /// Buckets set up (on CUDA: captured) and their sizes.
  std::vector<int32_t> buckets;
  /// Decode steps run through a bucket (replays on CUDA), and decode steps run eagerly
  /// while graphs were on (a batch larger than every bucket, a row with an adapter, a
  /// row longer than the buckets' block table).
  uint64_t replays = 0;
  uint64_t eager_steps = 0;
  /// Why the stage serves every step eagerly (a capture failed, the weights moved), or
  /// empty.
  std::string off_because;
};

/// A stage's KV block pool, in blocks of kv_block_bytes (models/decoder_spec.hpp).
struct kv_pool_stats {
  /// Blocks the pool's chunks hold (device memory taken), and those some sequence holds.
  int64_t blocks_allocated = 0;
  int64_t blocks_in_use = 0;
  /// Chunks of device memory the blocks live in.
  int64_t chunks = 0;
  uint64_t block_bytes = 0;
  /// Bytes of device pages the chunks hold (what the device has mapped for them).
  uint64_t device_bytes = 0;
};

/// One stage's decoding state for one batch: each sequence's block table (the KV blocks of
/// the stage's pool that hold its keys and values) and length. Created empty; prefill
/// fills it (or a chunked prefill, a chunk of each prompt per step), decode extends it. A
/// sequence's blocks go back to the pool when it leaves.
class kv_cache {
 public:
  kv_cache();
  ~kv_cache();
  kv_cache(kv_cache&&) noexcept;
  kv_cache& operator=(kv_cache&&) noexcept;
  /// Cached positions of the longest sequence (0 before prefill).
  int64_t length() const;
  /// Sequences in the batch, and the positions each holds.
  int64_t rows() const;
  std::vector<int64_t> lengths() const;
  /// Each sequence's LoRA adapter id (0: the base alone), as its prefill set it; decode
  /// runs every row with its own.
  std::vector<int64_t> adapters() const;
  /// Distinct KV blocks the sequences hold: the sum of kv_blocks_for(length) over them,
  /// less the blocks repeated rows share.
  int64_t blocks() const;
  /// Keeps only these sequences (their positions in the batch, in the order they go on);
  /// the others left the batch and their blocks go back. A position may repeat: that
  /// sequence is copied (a shared prefill's rows) and shares its blocks until it writes
  /// into one. No key or value is copied. Each kept row keeps its adapter. Errors: an
  /// index outside the batch.
  caf::error keep_rows(const std::vector<int64_t>& rows);
  /// Appends `other`'s sequences after this cache's (continuous batching: rows prefilled
  /// apart join a running batch at a step boundary): their block tables move over, every
  /// row keeps its own positions and adapter. `other` is left empty. Errors: caches of different
  /// stages (their blocks live in different pools).
  caf::error append(kv_cache&& other);

 private:
  friend class decoder_stage;
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// What the last stage returns: `top` 0, every row's logits [rows, vocab] in f32; `top` k
/// >= 1, only each row's k most likely ids [rows, k, 2] in f32 as (logit, id) pairs, most
/// likely first, the lower id first among equal logits. A sampler that keeps at most k
/// tokens (greedy, top_k <= k) draws from them exactly what it draws from the whole row
/// (but on rows with NaN logits, which rank as -inf here): the vocabulary-parallel head's
/// ranks exchange k candidates each instead of their slices, and only the candidates leave
/// the device. A vocabulary of 2^24 ids or more (ids travel as floats) gives whole rows.
///
/// `draw` (with `top` 0): each row's token is drawn where the logits lie
/// (device_sampling.hpp), and the last stage returns [rows, 1, 2]: the one candidate, which
/// the row's sampler draws again from with the same number. Every rank of the stage makes
/// the same collective as for whole rows; a rank given no `draws` (one that does not
/// sample) returns an empty tensor, and `draws` of another length than the rows (some row
/// cannot be drawn on the device this step) gives whole rows, which the host samples.
struct head_output {
  int64_t top = 0;
  bool draw = false;
  const std::vector<device_draw>* draws = nullptr;
};

/// One (logit, id) per row of `logits` [rows, vocab] (f32, row-major), drawn as a last stage
/// with `head_output::draw` draws them (engine/torch/device_sampling.hpp), on the CPU or on
/// CUDA device `cuda_ordinal` (>= 0): what the tests hold against the host sampler.
caf::expected<std::vector<std::pair<float, int64_t>>> draw_tokens(
    const std::vector<float>& logits, int64_t rows, int64_t vocab,
    const std::vector<device_draw>& draws, int cuda_ordinal = -1);

/// One shard of a decoder: a tensor-parallel rank of one pipeline stage. Reads its
/// parameters in place from the weight shard's device copy (zero-copy views), layer by
/// layer as the load brings them in. Not thread-safe: one caller at a time.
class decoder_stage {
 public:
  /// Checks the shard's layout against (spec, par, shard) and the group size against tp.
  /// `tp_group` and `weights` must outlive the stage. fp16 needs a CUDA device. `kv` says
  /// where the stage's KV blocks come from.
  static caf::expected<std::unique_ptr<decoder_stage>> create(
      const decoder_spec& spec, const parallel_config& par, const shard_index& shard,
      gpu::weight_shard& weights, gpu::collective& tp_group, kv_pool_options kv = {},
      compute_options compute = {});
  ~decoder_stage();

  bool first() const;
  bool last() const;
  /// Whether the stage computes on a GPU (CUDA), not on the CPU.
  bool on_gpu() const;
  /// Calls of the fused norm and rotary builds so far (compute_options): 0 where every
  /// layer ran libtorch's ops.
  uint64_t fused_calls() const;

  /// The stage's KV block pool: blocks allocated and in use (what the ledger counts beside
  /// the weights). Thread-safe.
  kv_pool_stats kv_blocks() const;
  /// Whether a step that computes `columns` positions per row over a filled cache (1: a
  /// decode step) reads the KV blocks in place (kv_pool_options::paged_attention).
  bool reads_kv_in_place(int64_t columns) const;
  /// The blocks the next step's pool may take beyond its need (step_plan::kv_spare; -1: no
  /// bound): a new chunk of device memory is at most the step's need plus them.
  void set_kv_spare(int64_t blocks);

  /// Makes adapter `id` (> 0) available to this stage's rows: `weights` holds
  /// slice_lora_adapter's table and bytes for this stage's (par, shard) in a
  /// gpu::weight_shard of the stage's device (so loading it is one copy, like a weight
  /// shard); `rank` its r. The stage reads it in place (zero-copy views) at each step, so it
  /// must stay loaded while rows use it (a step whose adapter is not loaded fails, naming
  /// it) and outlive its attachment. Errors: invalid_request for an id <= 0 or taken, or a
  /// rank <= 0; invalid_configuration, naming the tensor, for a table whose tensors are not
  /// those of an adapter of this stage: an unknown name, a layer outside the stage, an A
  /// without its B, a shape that does not fit this rank's projection or r, a dtype other
  /// than the stage's, a shard on another device. Another tensor-parallel rank's slice of
  /// the same shapes cannot be told from this rank's: the caller pairs them.
  caf::error attach_adapter(int64_t id, gpu::weight_shard& weights, int64_t rank);
  /// Forgets adapter `id`; its weight shard may go after this returns. Rows still naming
  /// it fail their next step (invalid_request, naming the id): the stage never reads a
  /// detached adapter's memory. Errors: invalid_request for an id that is not attached.
  caf::error detach_adapter(int64_t id);
  /// Frees the adapters' matrices kept stacked for the last steps of several adapters (a
  /// copy outside the ledger's accounting): a batch ended, and the next such step stacks
  /// them again.
  void drop_adapter_stacks();
  /// Ids of the attached adapters, ascending.
  std::vector<int64_t> adapters() const;

  /// Prefill a batch of prompts (token ids of different lengths, left-padded here). The
  /// first stage reads the tokens; later stages read `hidden` from the previous stage
  /// and use the prompts only for their lengths. Returns hidden states [batch, len,
  /// hidden], or on the last stage the logits of each prompt's last token [batch, vocab]
  /// in f32. `score[i]` (a row that asks for its prompt's log-probabilities): the last
  /// stage appends the logits of prompt i's positions before its last, len_i - 1 rows in
  /// order, after the batch's rows ([batch + sum, vocab]). Identical prompts (n samples of
  /// one prompt) share one prefill where none is scored: it runs once and its cache rows
  /// and outputs are copied. Errors: empty batch or prompt, token ids outside the
  /// vocabulary, prompts longer than the positions, missing or misshapen hidden states,
  /// weights not loaded, no KV blocks to be had (out_of_device_memory; the cache is left
  /// empty). `out` (last stage): logits, or the candidates where no row is scored.
  /// `adapters[i]`: the LoRA adapter prompt i runs with (attach_adapter), 0 for the base
  /// alone; empty: every prompt on the base. Only rows with the same prompt and the same
  /// adapter share a prefill. Errors also: a size other than the batch's, an id that is not
  /// attached.
  caf::expected<host_tensor> prefill(const std::vector<std::vector<int64_t>>& prompts,
                                     const host_tensor* hidden, kv_cache& cache,
                                     const std::vector<bool>& score = {}, head_output out = {},
                                     const std::vector<int64_t>& adapters = {});

  /// One step of a chunked prefill (engine/torch/chunked_prefill.cpp): the batch's prompts are
  /// computed over several steps, so that a running batch's decode steps go between them.
  /// `prompts` are the whole prompts on every chunk; row i computes the tokens of its
  /// prefill_window(n_i, chunk, left) (common/prefill_window.hpp), so the prompts end
  /// together in the chunk with `left` 0. The first chunk (every row starts at
  /// token 0; first_prefill_chunk) starts the batch afresh, as prefill does: one row per
  /// prompt, some of which may compute no token yet. A later chunk extends the rows, each
  /// of which must hold exactly the tokens before its chunk. The step's columns are
  /// left-padded (row i's tokens end in the last column) at the tokens' real positions.
  /// The first stage reads the tokens, later stages `hidden` [b, t, hidden] as the previous
  /// stage produced it for this chunk. Returns hidden states [b, t, hidden], or on the last
  /// stage: with `left` 0 each prompt's last-token logits (or candidates, per `out`) as
  /// prefill returns them, with `left` > 0 an empty tensor (the head is skipped). No
  /// prompt log-probabilities and no shared prefill of identical prompts here: a caller
  /// that needs either prefills in one step. Errors: as prefill's, and `chunk` <= 0,
  /// `left` < 0, a chunk with no token for any row, a later chunk whose cache is another
  /// stage's, another batch's shape or holds other lengths; no KV blocks to be had
  /// (out_of_device_memory). A failed later chunk leaves the cache as it was; a first
  /// chunk that finds no KV blocks leaves it empty. `adapters` as prefill's: the first
  /// chunk sets the rows' adapters; a later chunk may pass them again (they must equal the
  /// cache's) or leave them empty.
  caf::expected<host_tensor> prefill_chunk(const std::vector<std::vector<int64_t>>& prompts,
                                           int64_t left, int64_t chunk, const host_tensor* hidden,
                                           kv_cache& cache, head_output out = {},
                                           const std::vector<int64_t>& adapters = {});

  /// One more token per sequence, using and extending the cache; each row runs with the
  /// adapter its prefill set. Errors: a cache of another stage, no KV block to be had
  /// (out_of_device_memory; the cache is unchanged), a row's adapter no longer attached.
  caf::expected<host_tensor> decode(const std::vector<int64_t>& tokens, const host_tensor* hidden,
                                    kv_cache& cache, head_output out = {});

  /// Sets up the decode graphs (compute_options::graph_max_batch), largest bucket first,
  /// sharing one memory pool: on CUDA each is captured, which launches nothing, so it may
  /// run before the weights are loaded (registration's warm-up); the weights' addresses
  /// are reserved once, so a graph stays valid across evictions and reloads. A capture
  /// that fails leaves the stage serving eagerly, with the reason in graphs() and the log
  /// (once); that is not an error. Errors: none today (a no-op where graphs are off).
  caf::error capture_graphs();
  graph_stats graphs() const;

  /// Where the forward pass reads parameter `name` from (tests: weights are not copied).
  caf::expected<const void*> parameter_address(const std::string& name);

 private:
  /// prefill() without sharing: every row computed.
  caf::expected<host_tensor> prefill_rows(const std::vector<std::vector<int64_t>>& prompts,
                                          const host_tensor* hidden, kv_cache& cache,
                                          const std::vector<bool>& score, head_output out,
                                          const std::vector<int64_t>& adapters);
  struct impl;
  explicit decoder_stage(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Whether a chunk of a chunked prefill (decoder_stage::prefill_chunk) is the batch's
/// first: `left` + `chunk` tokens cover the longest prompt, so every row starts at token 0.
bool first_prefill_chunk(const std::vector<std::vector<int64_t>>& prompts, int64_t left,
                         int64_t chunk);

struct generate_options {
  int64_t max_tokens = 1;
  sampling_params sampling;
  /// Per prompt, the LoRA adapter it runs with (decoder_stage::prefill); empty: the base.
  std::vector<int64_t> adapters;
};

/// Runs a chain of stages (one per pipeline stage, all of one tensor-parallel rank):
/// prefill, then max_tokens - 1 decode steps, sampling each sequence with its own seeded
/// sampler (seed + sequence index). Returns the generated ids per prompt.
caf::expected<std::vector<std::vector<int64_t>>> generate(
    const std::vector<decoder_stage*>& stages, const std::vector<std::vector<int64_t>>& prompts,
    const generate_options& opts);

/// Intra-op threads of the CPU compute (libtorch's pool; process-wide). 0 leaves it.
void set_compute_threads(int threads);

/// Makes the calling thread's compute on `dev` run on `stream` (a native stream of the
/// device, gpu::device::gpulet_stream: a gpu-let's green context), or on the device's
/// default stream when it is null, for every step that follows on this thread. A no-op
/// on devices without streams (the emulated device) and without a CUDA libtorch.
caf::error use_compute_stream(const gpu::device& dev, void* stream);

/// A plain stream of `dev` (libtorch's pool: every SM, no green context) for
/// use_compute_stream: what gpu-lets are compared with (`computron bench colocate`).
/// Null on devices without streams.
caf::expected<void*> plain_compute_stream(const gpu::device& dev);

/// The last-token logits of a prefill through the chain ([batch, vocab], f32).
caf::expected<host_tensor> prefill_logits(const std::vector<decoder_stage*>& stages,
                                          const std::vector<std::vector<int64_t>>& prompts);

}  // namespace computron::models
