#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/weight_store.hpp"

namespace computron::models {

/// Activations or logits between stages, as plain bytes: what crosses processes as a
/// message, and what a backend (engine/backend.hpp) returns.
struct host_tensor {
  gpu::dtype type = gpu::dtype::f32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  /// The elements as floats (f32, bf16 or f16; decoder_stage.cpp, with libtorch).
  std::vector<float> to_floats() const;
};

}  // namespace computron::models
