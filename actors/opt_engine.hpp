#pragma once

#include <memory>

#include "actors/engine.hpp"

/// The decoders as model kinds ("opt", "llama": one kind, the shape picks the family's
/// block). Lives in computron_actors_torch (it links libtorch through the torch backend,
/// engine/torch/); the header stays torch-free.
namespace computron::actors {

/// Decoder shards of any family, each run by the torch backend
/// (engine/torch/decoder_backend.hpp).
std::shared_ptr<const model_kind> make_decoder_engine();

/// torch_free_engines() plus "opt" and "llama".
engine_registry all_engines();

}  // namespace computron::actors
