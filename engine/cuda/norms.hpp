#pragma once

// The CUDA build of engine/norms.hpp: one thread block per row, its sum of squares reduced
// in shared memory. Declared without CUDA's headers: `stream` is a cudaStream_t.
#include "engine/norms.hpp"

namespace computron::engine::cuda {

/// Queues the fused residual add and RMSNorm on `stream`. Returns nullptr, or why not (a
/// refusal, or CUDA's error string).
const char* rms_norm_launch(const rms_norm_args& a, void* stream);

}  // namespace computron::engine::cuda
