#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "models/checkpoint.hpp"
#include "models/safetensors.hpp"

/// A GGUF file (common/gguf.hpp) as a Llama-family model: its shape from the metadata, and
/// its tensors under the names a Hugging Face folder gives them, dequantized to f32 once,
/// so that registration, the pinned host copy and the swap path treat it as any other
/// checkpoint.
namespace computron::models {

/// Whether `path` is a regular file that starts with GGUF's magic.
bool is_gguf_file(const std::string& path);

/// The shape a GGUF file declares (general.architecture llama, mistral, qwen2 or qwen3,
/// and that architecture's keys), its dtype "f32" (what dequantizing gives). Errors name
/// the file and the key: another architecture, a missing or non-positive dimension, rope
/// scaling other than linear, per-layer head counts.
caf::expected<hf_model_config> read_gguf_config(const std::string& path);

/// The tensors of a GGUF file, dequantized, under our names (a Hugging Face Llama-family
/// folder's without `model.`: `embed_tokens.weight`, `layers.0.self_attn.q_proj.weight`,
/// ...), in PyTorch's shape order. llama.cpp's converter reorders the rows of each head of a
/// llama-architecture file's q and k projections for its rotary layout; they come back in
/// Hugging Face's order, as transformers' GGUF loader puts them. Errors name the tensor: a
/// type that cannot be dequantized (with the types that can), a name no Llama-family
/// tensor has.
struct gguf_tensors {
  std::vector<safetensor> tensors;
  std::vector<std::vector<float>> storage;
};
caf::expected<std::shared_ptr<const gguf_tensors>> read_gguf_tensors(const std::string& path);

}  // namespace computron::models
