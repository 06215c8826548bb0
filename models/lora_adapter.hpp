#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/expected.hpp>
#include <nlohmann/json_fwd.hpp>

#include "gpu/weight_store.hpp"
#include "models/decoder_spec.hpp"

/// LoRA adapters as PEFT saves them (a folder with adapter_config.json and
/// adapter_model.safetensors), read without torch, checked against the base model's shape
/// and converted into the layout the forward pass will run: per adapted projection an A
/// [r x in] and a B [out x r] with the scale folded into B, then cut per tensor-parallel
/// rank the way the base weight it adapts is cut (models/decoder_spec.hpp).
/// What the forward does not implement is refused here, naming the field or tensor.
namespace computron::models {

/// adapter_config.json, the fields that change what the adapter computes. Other fields
/// (dropout, init_lora_weights, task_type, ...) only matter while training.
struct lora_config {
  /// `r`: the rank of every pair.
  int64_t rank = 0;
  /// `lora_alpha`.
  double alpha = 0;
  /// `use_rslora`: scale alpha / sqrt(r) instead of alpha / r.
  bool use_rslora = false;
  /// `base_model_name_or_path`, for display: the base is checked by shapes, not by name.
  std::string base_model;
  /// `target_modules` as a list (PEFT matches a module whose path equals an entry or ends
  /// with "." + entry) ...
  std::vector<std::string> target_modules;
  /// ... or as a string: a regular expression matched against the whole module path
  /// (Python's re.fullmatch; ECMAScript syntax here, which covers what adapters use).
  std::string target_regex;
  /// `target_modules: "all-linear"`: every linear layer but the output head.
  bool all_linear = false;
  /// `exclude_modules`, the same two forms (empty: nothing excluded).
  std::vector<std::string> exclude_modules;
  std::string exclude_regex;
  /// `layers_to_transform` (empty: every layer); PEFT applies it to list matches only.
  std::vector<int64_t> layers_to_transform;

  /// What B is multiplied by: alpha / r, or alpha / sqrt(r) with use_rslora.
  double scale() const;
};

/// Reads adapter_config.json's object. Errors (invalid_configuration, naming the field):
/// peft_type other than LORA, a missing or non-positive r, use_dora, a non-empty
/// modules_to_save, rank_pattern or alpha_pattern, bias other than "none", lora_bias,
/// use_qalora, layer_replication, target_parameters, trainable_token_indices,
/// alora_invocation_tokens, layers_pattern other than "layers", a target_modules that is
/// neither a list of strings nor a string, a regular expression that does not compile.
/// fan_in_fan_out is accepted and has no effect, as in PEFT: it only concerns Conv1D
/// bases (GPT-2), PEFT turns it off for nn.Linear, and every supported family's
/// projections are nn.Linear, so A and B are stored [r x in] and [out x r] either way.
caf::expected<lora_config> parse_lora_config(const nlohmann::json& j);

/// Limits the server sets on adapters it accepts.
struct lora_limits {
  /// The largest r accepted (the forward's kernels and the KV key space are sized by it).
  int64_t max_rank = 64;
};

/// One adapted projection, whole (not cut for tensor parallelism).
struct lora_module {
  int64_t layer = 0;
  /// The projection's module name in Hugging Face's model: "q_proj", ..., "down_proj";
  /// OPT's "out_proj", "fc1", "fc2".
  std::string proj;
  /// The base tensor it adapts, as shard_params names it ("layers.3.self_attn.q_proj.weight").
  std::string base_param;
  /// Input and output features of the base projection (its weight is [out x in]).
  int64_t in = 0;
  int64_t out = 0;
  /// A [rank x in], row-major, as trained.
  std::vector<float> a;
  /// B [out x rank], row-major, times lora_config::scale().
  std::vector<float> b;
};

/// A whole adapter, converted to f32 with the scale folded in. f32 on the host because
/// it is exact for every source dtype (F32, F16, BF16) and the fold rounds once; the
/// per-rank cut converts to the dtype the forward runs in.
struct lora_adapter {
  lora_config config;
  /// The base it was checked against.
  decoder_spec base;
  /// In (layer, projection) order: layer ascending, then the family's projection order
  /// (q, k, v, o, gate, up, down; OPT: q, k, v, out, fc1, fc2).
  std::vector<lora_module> modules;
  /// SHA-256 (hex) of what the adapter computes: the family and every module's layer,
  /// projection, shape and converted f32 values. Neither the folder, its name, nor
  /// base_model_name_or_path enter it, so caches keyed by it share entries between copies
  /// of one adapter and never between two different ones.
  std::string content_hash;
};

/// Reads and converts the PEFT folder `folder` for the base `base`. Errors: those of
/// parse_lora_config; io_error for a missing or unreadable file; invalid_configuration,
/// naming the field or the tensor, for a rank over limits.max_rank, a tensor that is not a
/// lora_A/lora_B weight of a supported projection (embeddings, lm_head, DoRA magnitudes,
/// biases, unknown modules), a layer beyond the base's, a module targeted by the config
/// with no tensors or with tensors the config does not target, a pair missing its A or
/// B, a dtype other than F32/F16/BF16, a shape that does not fit the base projection or r.
caf::expected<lora_adapter> read_lora_adapter(const std::string& folder, const decoder_spec& base,
                                              const lora_limits& limits = {});

/// One tensor-parallel rank's part of an adapter in one contiguous host buffer, so that
/// loading it is one copy. Tensors are named after the base parameter with ".lora_A" and
/// ".lora_B" in place of ".weight" ("layers.3.self_attn.q_proj.lora_A") and laid out by
/// `table` (aligned as a weight shard is).
struct lora_rank_adapter {
  parallel_config par;
  shard_index shard;
  int64_t rank = 0;
  gpu::dtype type = gpu::dtype::f32;
  gpu::tensor_table table;
  std::vector<std::byte> host;
  /// The whole adapter's content_hash (one key for every rank).
  std::string content_hash;

  /// Bytes this rank holds: what the residency ledger charges for it.
  uint64_t size_bytes() const { return table.total_bytes(); }
};

/// Cuts `adapter` for `shard` of `par`, converting to `type` (f32, f16 or bf16: the
/// base's dtype). The shard holds the layers of its pipeline stage. Column-parallel
/// projections (q/k/v, gate/up, fc1: the base cuts output rows) keep A whole and take the
/// rows of B the base rank holds, key/value heads replicated where tp exceeds them as the
/// base's are; row-parallel ones (o/out_proj, down, fc2: the base cuts input columns) take
/// the columns of A the base rank holds and keep B whole. So B_rank A_rank is the part of
/// the delta B A that the rank's base weight slice covers, and the row-parallel partial
/// sums join in the all-reduce the base already does. Errors: the base does not split
/// this way (validate), a shard index out of range, a type other than f32/f16/bf16.
caf::expected<lora_rank_adapter> slice_lora_adapter(const lora_adapter& adapter,
                                                    const parallel_config& par,
                                                    const shard_index& shard,
                                                    gpu::dtype type = gpu::dtype::f32);

/// A projection of one layer.
struct lora_site {
  int64_t layer = 0;
  std::string proj;
  bool operator==(const lora_site& o) const { return layer == o.layer && proj == o.proj; }
};

/// The supported projections of `base` that PEFT would adapt under `config` (its
/// target_modules, exclude_modules and layers_to_transform, matched as PEFT matches them
/// against Hugging Face module paths), in layout order. Errors (invalid_configuration,
/// naming target_modules or exclude_modules): an entry of a target list that matches no
/// supported projection (lm_head and embeddings said as such), a regular expression that
/// does not compile, a config that targets nothing.
caf::expected<std::vector<lora_site>> lora_targets(const lora_config& config,
                                                   const decoder_spec& base);

/// The HF module path of a supported projection of `base`'s layer `layer`
/// ("model.layers.3.self_attn.q_proj"; OPT "model.decoder.layers.3.fc1"), which PEFT's
/// target_modules match against; empty for a projection the family does not have.
std::string lora_module_path(const decoder_spec& base, int64_t layer, const std::string& proj);

/// The projections of `base`'s family an adapter may target, in layout order.
const std::vector<std::string>& lora_projections(const decoder_spec& base);

namespace detail {
/// The base parameter a projection adapts ("layers.3.mlp.up_proj.weight"); empty for a
/// projection the family does not have (models/lora_config.cpp).
std::string lora_param_name(const decoder_spec& base, int64_t layer, const std::string& proj);
}  // namespace detail

}  // namespace computron::models
