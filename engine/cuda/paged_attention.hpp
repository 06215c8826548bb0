#pragma once

// The CUDA build of engine/paged_attention.hpp: one thread block per (row, kv head, split),
// the group's queries and running softmax in shared memory, each block's keys and values
// read from global memory once for all of them; a second kernel merges the splits
// (split-K). Declared without CUDA's headers: `stream` is a cudaStream_t.
#include <cstddef>
#include <cstdint>

#include "engine/paged_attention.hpp"

namespace computron::engine::cuda {

/// Queries x head dim one thread block holds (its queries and their weighted values in
/// shared memory): a decode step's group (8 query heads x 128) fits many times over; a
/// long chunk does not, and its caller gathers instead.
inline constexpr int64_t paged_max_query_elements = 4096;

/// Whether the kernel's thread block holds a call of `queries` per (row, kv head) (a
/// group's heads x the step's columns) at this head dim and block size on the current
/// device: within paged_max_query_elements, and its shared memory within what the device
/// lets one block opt in to. A caller that gets false gathers instead.
bool paged_attention_fits(int64_t queries, int64_t head_dim, int64_t block_tokens);

/// Whether the kernel takes these arguments (nullptr: yes; else why not).
const char* paged_attention_unfit(const paged_attention_args& a);

/// Splits of the longest row's history: enough thread blocks to fill the current device's
/// multiprocessors twice, no split under 256 positions, at most 32.
int32_t paged_attention_splits(const paged_attention_args& a);

/// Bytes of device memory the splits' partial results take (0 for one split).
size_t paged_attention_workspace_bytes(const paged_attention_args& a, int32_t splits);

/// Queues the kernel (and the merge where splits > 1) on `stream`. `workspace` holds
/// paged_attention_workspace_bytes. A chunk_table, where set, is device memory the kernel
/// reads when it runs (at every replay of a graph that captured it). Returns nullptr, or
/// CUDA's error string.
const char* paged_attention_launch(const paged_attention_args& a, int32_t splits, void* workspace,
                                   void* stream);

}  // namespace computron::engine::cuda
