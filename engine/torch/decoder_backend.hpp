#pragma once

#include <memory>

#include "engine/backend.hpp"
#include "engine/torch/decoder_stage.hpp"

/// The decoder over libtorch ops as a backend (engine/backend.hpp): one shard's stage of
/// every family (engine/torch/decoder_stage.hpp), with its KV caches per batch, the head a
/// batch's sampling settings choose (candidates or whole rows) and its rows' LoRA adapters.
/// Every device runs it (CPU, emulated, CUDA); a model kind (actors/opt_engine.cpp) makes
/// one per shard.
namespace computron::engine {

std::unique_ptr<backend> make_decoder_backend(std::unique_ptr<models::decoder_stage> stage);

}  // namespace computron::engine
