#pragma once

#include <cstdint>
#include <memory>

#include "engine/backend.hpp"
#include "engine/torch/decoder_stage.hpp"

/// The decoder over libtorch ops as a backend (engine/backend.hpp): one shard's stage of
/// every family (engine/torch/decoder_stage.hpp), with its KV caches per batch, the head a
/// batch's sampling settings choose (candidates, tokens drawn on the device, or whole rows)
/// and its rows' LoRA adapters.
/// Every device runs it (CPU, emulated, CUDA); a model kind (actors/opt_engine.cpp) makes
/// one per shard.
namespace computron::engine {

struct decoder_backend_options {
  /// Where a batch whose rows need whole rows of logits only to draw from them (top_p,
  /// min_p or temperature without a small top_k, and no processor or log-probabilities)
  /// has its tokens drawn where the logits lie (engine/torch/device_sampling.hpp), so that
  /// only their ids come to the host: on a GPU (default; a CPU's logits are on the host
  /// already, and its sampler is as fast), everywhere (the tests of the device path on
  /// the CPU), or nowhere (whole rows to the host, which samples them: the same tokens).
  enum class sampling_on : uint8_t { gpu, always, never };
  sampling_on device_sampling = sampling_on::gpu;
};

std::unique_ptr<backend> make_decoder_backend(std::unique_ptr<models::decoder_stage> stage,
                                              decoder_backend_options options = {});

}  // namespace computron::engine
