#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "common/error.hpp"
#include "gpu/collective.hpp"
#include "gpu/weight_store.hpp"
#include "models/decoder_stage.hpp"

/// Model kinds behind the shard workers. An engine knows how a kind lays out, fills and
/// runs one shard; workers and managers stay the same for every kind. Torch-free: the
/// OPT engine lives in its own library (actors/opt_engine.hpp).
namespace computron::actors {

/// One shard's compute for one worker. Not thread-safe: its worker's compute lane is
/// the only caller.
class shard_program {
 public:
  virtual ~shard_program() = default;

  /// Runs `req` on this shard. `hidden` is the previous stage's output (null on the
  /// first stage). Returns hidden states for the next stage, or on the last stage the
  /// logits of each sequence's next token, [batch, vocab] f32.
  virtual caf::expected<models::host_tensor> run(const step_request& req,
                                                 const models::host_tensor* hidden) = 0;

  /// Forgets a batch's caches.
  virtual void end_batch(uint64_t batch_id) = 0;

  /// Bytes of device pages its KV pool holds now (0: none, or no pool).
  virtual uint64_t kv_device_bytes() const { return 0; }

  /// Appends batch `from`'s rows (just prefilled) after batch `into`'s, whose next step
  /// then runs them all; `from` is gone. Continuous batching: requests join a running
  /// batch at a step boundary. Stateless programs have nothing to join.
  virtual caf::error join_batch(uint64_t from, uint64_t into) { return {}; }

  /// Makes LoRA adapter `name` (its shard for this program's shard, as the engine laid it
  /// out and filled it) available to the rows that name it (step_request::adapters). The
  /// program keeps `weights` alive while bound; the same shard again is a no-op, another
  /// one under the name replaces it (the old one's rows fail clearly, none reads freed
  /// memory). Errors: kinds without adapters, a shard that is not an adapter of this one.
  virtual caf::error bind_adapter(const std::string& name,
                                  std::shared_ptr<gpu::weight_shard> weights) {
    return make_error(ec::invalid_request, "this model kind runs no LoRA adapters (" + name + ")");
  }

  /// Forgets adapter `name` (unregistered); unknown names are ignored.
  virtual void unbind_adapter(const std::string& name) {}
};

/// A model kind.
class engine {
 public:
  virtual ~engine() = default;

  /// Checks what this kind needs of a config (spec known, dtype, tp/pp split). `placed`
  /// holds the kind of the device of each shard (cfg.devices order): a dtype is valid
  /// only where every one of them can run it.
  virtual caf::error validate(const model_config& cfg,
                              const std::vector<gpu::device_kind>& placed) const = 0;

  /// Vocabulary size and longest sequence (prompt plus generated tokens).
  virtual int64_t vocab(const model_config& cfg) const = 0;
  virtual int64_t max_positions(const model_config& cfg) const = 0;

  /// The shard's tensor table.
  virtual caf::expected<gpu::tensor_table> layout(const shard_spec& s) const = 0;

  /// Bytes of the model's weights as one checkpoint holds them (every parameter once),
  /// which its shards' bytes on the devices are reported against; 0 where unknown.
  virtual uint64_t weight_bytes(const model_config&) const { return 0; }

  /// Bytes of one KV block of the shard (models::kv_block_bytes): what the ledger counts
  /// per block beside the weights. 0: the kind keeps no KV in blocks (nothing counted).
  virtual uint64_t kv_block_bytes(const shard_spec&) const { return 0; }

  /// Writes the shard's weights into its host copy (seeded or from the checkpoint).
  virtual caf::error fill(const shard_spec& s, gpu::weight_shard& w) const = 0;

  /// Pays the first-use costs of compute on `dev` for this shard's shape and dtype (CUDA
  /// context, cuBLAS handles, first kernels) off the request path; a no-op where there
  /// are none, and once per device, shape and dtype. Called on the thread that will run
  /// the shard's forward steps, since libtorch's cuBLAS handles are per thread.
  virtual caf::error warm_up(const shard_spec&, const gpu::device_ptr&) const { return {}; }

  /// Makes the calling thread's compute on `dev` run on `stream` (a gpu-let's, from
  /// gpu::device::gpulet_stream; null: the device's default stream) for the steps that
  /// follow on it. The worker calls it on a GPU's compute lane before each step; a no-op
  /// for kinds that launch no device work.
  virtual caf::error use_stream(const gpu::device_ptr& dev, void* stream) const { return {}; }

  /// The shard's compute over its (loaded) weights and its tensor-parallel group; both
  /// outlive the program.
  virtual caf::expected<std::unique_ptr<shard_program>> make_program(
      const shard_spec& s, gpu::weight_shard& w, gpu::collective& tp_group) const = 0;
};

/// Engines by kind name.
using engine_registry = std::map<std::string, std::shared_ptr<const engine>>;

/// "toy": one byte blob per shard, a few integer operations per stage and a real
/// all-reduce across tensor-parallel ranks; the output depends on the bytes on the
/// device, so a shard that was not loaded (or loaded wrong) answers differently.
/// Vocabulary 1024; for tests and overhead benchmarks.
std::shared_ptr<const engine> make_toy_engine();

/// The toy's stage is this many equal layers: layer i waits for the first (i+1)/n of the
/// shard's bytes, then computes 1/n of the stage's toy_compute_ms, so compute overlaps a
/// load as the OPT forward's per-layer waits do.
inline constexpr int toy_layers_per_stage = 8;

/// The registry with every engine of this build that needs no torch ("toy").
engine_registry torch_free_engines();

/// models::host_tensor to and from its wire form.
tensor_payload to_payload(const models::host_tensor& t);
models::host_tensor from_payload(const tensor_payload& p);

/// A row's sampling settings as the sampler takes them.
models::sampling_params to_sampling_params(const row_sampling& s);

/// How many of its row's most likely ids a row's token is drawn from, when they are all it
/// needs: 1 when greedy, k for top_k k (up to max_candidates), with no processor (bias,
/// penalties, min_tokens suppression) and no log-probabilities; 0 when it needs the whole
/// row. A batch whose every row needs candidates takes only the largest number of them
/// from the last stage (models::head_output).
int64_t candidates_of(const row_sampling& s);
inline constexpr int64_t max_candidates = 256;

/// Picks one token per row from last-stage logits [rows, vocab] f32 with one sampler
/// per row (created from `sampling` and the rows' `prompts` at the first step, the prompt
/// being what the repetition penalty counts as seen; kept across steps, when `sampling`
/// may be empty). Where a row asks
/// for log-probabilities, `logprobs` (when given) gets one entry per row. Logits with more
/// rows than the batch (a prefill where rows asked for their prompt's log-probabilities:
/// each such row's positions before its last follow the batch, decoder_stage::prefill) also
/// fill `prompt_logprobs`, one list per row; a model kind that gives only the batch's rows
/// leaves them empty. Non-finite log-probabilities become -9999. Candidates [rows, k, 2]
/// (logit, id) instead of logits (a batch whose rows need no more, candidates_of) are what
/// each row's sampler draws from, exactly as from the whole row.
caf::expected<std::vector<int64_t>> sample_rows(
    const models::host_tensor& logits, std::vector<models::sampler>& samplers,
    const std::vector<row_sampling>& sampling, const std::vector<std::vector<int64_t>>& prompts,
    std::vector<token_logprobs>* logprobs = nullptr,
    std::vector<std::vector<token_logprobs>>* prompt_logprobs = nullptr);

/// Checks a model config against the engines: kind known, devices distinct and among
/// `device_kinds` (the kind of every device, by global index), one per shard; then the
/// engine's own checks with the kinds of the devices the model is placed on.
caf::error validate_model(const engine_registry& engines, const model_config& cfg,
                          const std::vector<gpu::device_kind>& device_kinds);

/// Whether every device kind in `placed` can run weights of `dtype` ("f32", "bf16",
/// "f16"): f16 needs CUDA (libtorch's CPU fp16 matmul is slow or missing).
bool dtype_runs_on(const std::string& dtype, const std::vector<gpu::device_kind>& placed);

/// Settles what a config leaves to its placement: dtype "auto" becomes the checkpoint's
/// dtype (cfg.checkpoint_dtype) where every placed device runs it, else bf16, and the log
/// says which and why. Other configs are returned unchanged.
/// `quiet`: no log line (serve sizes its devices from the resolved layouts before the
/// registry resolves and logs the same).
model_config resolve_dtype(model_config cfg, const std::vector<gpu::device_kind>& device_kinds,
                           bool quiet = false);

/// Runs a model without actors: every shard on its device, stages in order, tensor-
/// parallel ranks in threads. The reference the served outputs are compared with
/// (`computron generate`). `devices` are indexed by model_config::devices.
caf::expected<std::vector<std::vector<int64_t>>> direct_generate(
    const engine& eng, const model_config& cfg, const std::vector<gpu::device_ptr>& devices,
    const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens,
    const row_sampling& sampling);

}  // namespace computron::actors
