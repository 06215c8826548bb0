#pragma once

// What a captured decode step reads, laid out once per batch-size bucket. A CUDA graph
// keeps the addresses and the argument values it was captured with, so everything that
// changes from step to step (which blocks each row holds, how far it reads, where its new
// key goes, its position and token) goes through buffers of a fixed size that the step
// overwrites before each replay. Rows are padded to the bucket: a padding row reads no
// position (limit 0, so attention gives zeros) and writes no key (slot -1).
//
// Torch-free and CUDA-free: the decoder's graphs (engine/torch/decode_graphs.cpp) fill
// these on the host and copy them to the device in one piece; the tests check the layout
// on the CPU.
#include <cstdint>
#include <vector>

namespace computron::engine {

/// The largest bucket a model may capture (config: cuda_graph_max_batch).
inline constexpr int32_t graph_max_bucket = 256;

/// Batch sizes a graph is captured for: 1, 2, 4, 8, then steps of 8 up to `max_batch`
/// (itself the last, where it is not a multiple of 8). Empty for max_batch <= 0; at most
/// graph_max_bucket.
std::vector<int32_t> graph_buckets(int32_t max_batch);

/// The smallest of `buckets` (ascending) that holds `rows`; 0 where none does.
int32_t graph_bucket_for(const std::vector<int32_t>& buckets, int64_t rows);

/// One row of a decode step as the KV cache holds it after the step planned its blocks:
/// its block ids ((chunk slot << 32) | index in the chunk, in position order) and its
/// length counting the new token, whose position is length - 1.
struct graph_row {
  const std::vector<int64_t>* blocks = nullptr;
  int64_t length = 0;
  int64_t token = 0;
};

/// A bucket's inputs, in the order of its one device buffer: the block table [bucket,
/// width] (block ids as the pool names them, so a table entry's chunk is the pool's slot;
/// 0 past a row's blocks), the limits [bucket] (positions each row reads: its length; 0
/// for padding), the slots [bucket] ((chunk slot << 32) | block index x block tokens +
/// offset of the new key; -1 for padding), the positions [bucket] (length - 1; 0 for
/// padding) and the tokens [bucket] (`pad_token` for padding).
struct graph_inputs {
  int32_t bucket = 0;
  int32_t width = 0;
  std::vector<int64_t> all;

  int64_t table_at() const { return 0; }
  int64_t limits_at() const { return static_cast<int64_t>(bucket) * width; }
  int64_t slots_at() const { return limits_at() + bucket; }
  int64_t positions_at() const { return slots_at() + bucket; }
  int64_t tokens_at() const { return positions_at() + bucket; }
  int64_t size() const { return tokens_at() + bucket; }
};

/// Sizes `in` for `bucket` rows of `width` table entries (every element zero).
void shape_graph_inputs(graph_inputs& in, int32_t bucket, int32_t width);

/// Fills `in` (shaped for its bucket) with `rows`. Returns nullptr, or why the step cannot
/// replay the bucket's graph (and runs eagerly): more rows than the bucket, a row with no
/// position or more blocks than the width, a block in a chunk slot at or past `max_chunks`
/// (what the graph's chunk table holds), a row whose blocks do not cover its length.
const char* fill_graph_inputs(graph_inputs& in, const std::vector<graph_row>& rows,
                              int32_t block_tokens, int32_t max_chunks, int64_t pad_token);

}  // namespace computron::engine
