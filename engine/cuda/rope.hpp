#pragma once

// The CUDA build of engine/rope.hpp: one thread block per (row, column), its threads over
// the column's query and key heads' elements. Declared without CUDA's headers: `stream` is
// a cudaStream_t.
#include "engine/rope.hpp"

namespace computron::engine::cuda {

/// Queues the rotation (with rotate false, the KV write alone) on `stream`. A cache_table,
/// where set, is device memory the kernel reads when it runs (at every replay of a graph
/// that captured it). Returns nullptr, or why not (a refusal, or CUDA's error string).
const char* rope_launch(const rope_args& a, void* stream);

}  // namespace computron::engine::cuda
