#pragma once

#include <memory>

#include "actors/engine.hpp"

/// The decoders as model kinds ("opt", "llama": one engine, the shape picks the family's
/// block). Lives in computron_actors_torch (it links libtorch through
/// models/decoder_stage); the header stays torch-free.
namespace computron::actors {

/// models/decoder_stage shards of any family with KV caches per batch.
std::shared_ptr<const model_kind> make_decoder_engine();

/// torch_free_engines() plus "opt" and "llama".
engine_registry all_engines();

}  // namespace computron::actors
