#pragma once

#include <memory>

#include "actors/engine.hpp"

/// The OPT decoder as a model kind ("opt"). Lives in computron_actors_torch (it links
/// libtorch through models/opt_model); the header stays torch-free.
namespace computron::actors {

/// "opt": models/opt_model shards with KV caches per batch.
std::shared_ptr<const engine> make_opt_engine();

/// torch_free_engines() plus "opt".
engine_registry all_engines();

}  // namespace computron::actors
