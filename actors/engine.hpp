#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "common/error.hpp"
#include "engine/backend.hpp"
#include "engine/runner.hpp"
#include "engine/sampling.hpp"
#include "engine/toy/toy_backend.hpp"
#include "gpu/collective.hpp"
#include "gpu/weight_store.hpp"
#include "models/host_tensor.hpp"

/// Model kinds behind the shard workers. An engine knows how a kind lays out and fills one
/// shard, and makes the backend that runs it; workers and managers stay the same for every
/// kind. Torch-free: the
/// OPT engine lives in its own library (actors/opt_engine.hpp).
namespace computron::actors {

/// One shard's compute (engine/backend.hpp): a model kind makes one per shard, and the
/// shard's runner (engine/runner.hpp) drives it.
using computron::engine::backend;

/// Sampling on the host (engine/sampling.hpp), as the runner and the manager's checks use it.
using computron::engine::candidates_of;
using computron::engine::max_candidates;
using computron::engine::sample_rows;
using computron::engine::to_sampling_params;

/// A model kind.
class model_kind {
 public:
  virtual ~model_kind() = default;

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
  /// outlive the backend.
  virtual caf::expected<std::unique_ptr<backend>> make_backend(const shard_spec& s,
                                                               gpu::weight_shard& w,
                                                               gpu::collective& tp_group) const = 0;
};

/// The runner of shard `s` over the backend its kind made: the last stage's rank 0 samples;
/// its other ranks compute the same logits and answer no tokens.
std::shared_ptr<computron::engine::runner> runner_of(const shard_spec& s,
                                                     std::unique_ptr<backend> b);

/// Engines by kind name.
using engine_registry = std::map<std::string, std::shared_ptr<const model_kind>>;

/// "toy": one byte blob per shard, a few integer operations per stage and a real
/// all-reduce across tensor-parallel ranks; the output depends on the bytes on the
/// device, so a shard that was not loaded (or loaded wrong) answers differently.
/// Vocabulary 1024; for tests and overhead benchmarks.
std::shared_ptr<const model_kind> make_toy_engine();

/// The toy's stage is this many equal layers (engine/toy/toy_backend.hpp).
using computron::engine::toy_layers_per_stage;

/// The registry with every engine of this build that needs no torch ("toy").
engine_registry torch_free_engines();

/// models::host_tensor to and from its wire form.
tensor_payload to_payload(const models::host_tensor& t);
models::host_tensor from_payload(const tensor_payload& p);

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
    const model_kind& eng, const model_config& cfg, const std::vector<gpu::device_ptr>& devices,
    const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens,
    const row_sampling& sampling);

}  // namespace computron::actors
