#pragma once

// `computron serve MODEL_DIR` without a config file: the emulated devices sized to the
// models it was given, as `vllm serve ./model` takes a GPU as it is. The built-in devices
// (four of 256 MiB) are sized for the embedded default, and a real model given alone would
// otherwise be refused as one that can never fit.
#include <string>

#include <caf/expected.hpp>

#include "actors/engine.hpp"
#include "serve/serve_config.hpp"

namespace computron::serve {

/// Where cfg.size_devices_to_models holds and the devices are emulated: each device holds
/// the largest shard of any model (its bytes from the engines' layouts, in the dtype it
/// will run in) with room beside it for KV blocks (half the shard, at least 256 MiB), and
/// there are as many devices as the widest model's tp x pp. Never smaller or fewer than
/// configured. Returns what changed, for the log (empty: nothing); an error when a
/// model's layout cannot be read (its registration will say the same).
caf::expected<std::string> size_devices_to_models(serve_config& cfg,
                                                  const actors::engine_registry& engines);

}  // namespace computron::serve
