#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>

#include "gpu/weight_store.hpp"
#include "models/decoder_spec.hpp"
#include "models/safetensors.hpp"

/// Checkpoints of whole (unsharded) models, as our own safetensors file or as a
/// Hugging Face model folder, seen under one naming (ours: `layers.0.fc1.weight`).
/// Everything stays in the mmap'd files: filling a shard reads only its own slices.
namespace computron::models {

struct gguf_tensors;

/// The tensors of one model, from one or several mapped safetensors files. Move-only.
class checkpoint {
 public:
  /// Opens `path`: one safetensors file (our format, or a single-file Hugging Face
  /// checkpoint), a GGUF file (dequantized to f32, under a Hugging Face folder's names), or
  /// a folder holding `model.safetensors.index.json` and the shards it
  /// names, or `model.safetensors`. Names lose a `model.decoder.` or `decoder.` prefix (OPT,
  /// whose tied `lm_head.weight` is dropped: the head reads the token embedding) or a
  /// `model.` prefix (the Llama family, whose `lm_head.weight` stays). A folder with only
  /// `pytorch_model.bin` is refused saying how to convert it. Errors, each
  /// naming the file: a missing or truncated shard, an index that is not JSON or names a
  /// tensor its shard lacks, two tensors with the same name.
  static caf::expected<checkpoint> open(const std::string& path);

  /// The tensor under our name, or null.
  const safetensor* find(std::string_view name) const;
  size_t tensor_count() const { return tensors_.size(); }
  size_t file_count() const { return files_.size(); }
  /// Dtype of the floating-point tensors (the first one found); f32 when there is none.
  gpu::dtype dtype() const { return dtype_; }
  /// The file or folder it was opened from (for errors).
  const std::string& source() const { return source_; }

 private:
  checkpoint() = default;
  static caf::expected<checkpoint> open_files(const std::string& path);
  std::string source_;
  /// Names came with OPT's `model.decoder.` prefix (its lm_head is a tied copy).
  bool opt_style_ = false;
  caf::error add_file(const std::string& path);
  std::vector<std::unique_ptr<safetensors_file>> files_;
  /// A GGUF file's tensors, dequantized (models/gguf_model.hpp); null otherwise.
  std::shared_ptr<const gguf_tensors> gguf_;
  std::map<std::string, const safetensor*, std::less<>> tensors_;
  gpu::dtype dtype_ = gpu::dtype::f32;
};

/// What a Hugging Face folder's config.json declares.
struct hf_model_config {
  /// Shape; `name` is the folder's `_name_or_path` or its model_type.
  decoder_spec spec;
  /// The checkpoint's dtype (`torch_dtype`, or `dtype` in newer files): "f16", "bf16",
  /// "f32"; empty when it says none.
  std::string dtype;
};

using hf_opt_config = hf_model_config;

/// True when `folder` holds a Hugging Face model: a config.json with `architectures` or
/// `model_type` (our own config.json has neither).
bool is_hf_folder(const std::string& folder);

/// Reads `folder`/config.json of an OPT model. Errors name the field: not an OPT model
/// (`architectures`/`model_type`), a missing or non-positive dimension, and what the
/// forward does not implement: `do_layer_norm_before: false` (post-LayerNorm, OPT-350m),
/// `word_embed_proj_dim` other than `hidden_size` (OPT-350m's projections), an
/// `activation_function` other than relu, `enable_bias: false`,
/// `layer_norm_elementwise_affine: false`.
caf::expected<hf_opt_config> read_hf_opt_config(const std::string& folder);

/// Reads `folder`/config.json of a Llama-family model (`model_type` llama, mistral,
/// qwen2, qwen3 or their *ForCausalLM architectures). Errors name the field and value:
/// a missing or non-positive dimension, `hidden_act` other than silu, `mlp_bias: true`,
/// `rope_scaling` (or transformers 5's `rope_parameters`) of a type other than linear or
/// llama3, a bad dtype. A sliding window (Mistral v0.1; Qwen's `use_sliding_window`)
/// shorter than `max_position_embeddings` caps the model's positions at the window, so
/// attention never needs it.
caf::expected<hf_model_config> read_hf_llama_config(const std::string& folder);

/// Reads any served family's config.json (OPT or the Llama family, by `model_type` and
/// `architectures`); an unknown one is refused naming both and the served ones.
caf::expected<hf_model_config> read_hf_config(const std::string& folder);

/// Checks that a Hugging Face folder holds weights we read (model.safetensors, or the
/// index), without mapping them; a folder with only pytorch_model.bin is refused saying
/// how to convert it.
caf::error check_checkpoint_files(const std::string& folder);

/// Writes a Hugging Face-format folder of any family from seeded weights (tests,
/// benchmarks): a config.json, `files` safetensors shards named
/// model-0000k-of-0000n.safetensors with model.safetensors.index.json (or
/// model.safetensors when `files` is 1); OPT's tensor names under `model.decoder.` with a
/// tied `lm_head.weight`, the Llama family's under `model.` with `lm_head.weight` when
/// untied. The same weights as fill_seeded with `seed` writes.
caf::error write_hf_opt_folder(const std::string& folder, const opt_spec& spec, gpu::dtype type,
                               uint64_t seed, int files);

}  // namespace computron::models
