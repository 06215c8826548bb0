#pragma once

// Attention of a step's queries over KV blocks where they lie: no copy of a row's history.
// The arguments and the index math are shared by the host build (paged_attention.cpp, the
// CPU's path and the reference the CUDA kernel is tested against) and the CUDA kernel
// (cuda/paged_attention.cu), so that what the host tests check is what the GPU computes.
//
// The layout is the KV block pool's (engine/torch/kv_blocks.hpp): one tensor per chunk, [layers,
// 2 (keys, values), kv heads, blocks, block tokens, head dim]. A call is one layer: for each
// chunk the step reads, its keys and values of that layer ([kv heads, blocks, block tokens,
// head dim]). Each row's block table names, in position order, the blocks that hold its
// positions; position p is token p % block_tokens of table entry p / block_tokens.
//
// Per (row, kv head), the queries of the kv head's group (heads / kv_heads query heads x the
// step's columns) read each key and value once, and keep a running softmax in f32 (the
// maximum, the sum of exponentials, the weighted values), block by block. A long history may
// be split in ranges of whole blocks, computed apart and merged (split-K). The queries come
// scaled (as the gather path's matmul takes them); the output is in the queries' type.
//
// Torch-free and CUDA-free: it is included by plain C++ and by nvcc.
#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define COMPUTRON_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define COMPUTRON_HOST_DEVICE inline
#endif

namespace computron::engine {

/// Element type of queries, keys, values and output (all the same).
enum class element_type : uint8_t { f32, bf16, f16 };

/// Chunks one call reads at most (a pool's chunks double in size, so a batch touches few).
inline constexpr int32_t paged_max_chunks = 32;

/// One chunk's keys and values of the call's layer, [kv heads, blocks, block tokens, head
/// dim] each, contiguous.
struct paged_kv_chunk {
  const void* keys = nullptr;
  const void* values = nullptr;
  /// Elements from one kv head to the next: the chunk's blocks x block tokens x head dim.
  int64_t head_stride = 0;
};

struct paged_attention_args {
  element_type type = element_type::f32;
  int32_t rows = 0;
  /// The step's query columns per row (1 for decode, a chunk's window otherwise).
  int32_t columns = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_tokens = 0;
  /// Entries per row of `table`.
  int32_t table_width = 0;
  /// The largest of `limits`: how far the longest row reads (for choosing splits).
  int32_t max_positions = 0;
  /// [rows, heads, columns, head dim], contiguous, already scaled.
  const void* queries = nullptr;
  /// [rows, columns, heads x head dim], contiguous: head h of column c of row r at
  /// ((r x columns + c) x heads + h) x head_dim.
  void* out = nullptr;
  /// [rows, table_width]: (chunk << 32) | block index within the chunk; chunk indexes
  /// `chunk` below. Entries past a row's last block are never read.
  const int64_t* table = nullptr;
  /// [rows x columns]: positions query column c of row r sees (0 .. limit - 1). 0: none;
  /// the output is zeros there (a padding column of a row that holds nothing yet).
  const int64_t* limits = nullptr;
  /// Chunks the table's entries may name (0 .. chunks - 1).
  int32_t chunks = 0;
  paged_kv_chunk chunk[paged_max_chunks];
  /// Where set, chunk c is chunk_table[c] ([chunks], in the memory the build runs in:
  /// device memory for CUDA, host memory for the host build) and `chunk` is unused. A
  /// captured CUDA graph keeps the arguments it was launched with, and the chunks a batch
  /// reads change from step to step: a table in memory is read again at every replay.
  const paged_kv_chunk* chunk_table = nullptr;
  /// Split each (row, kv head) item's own reach (the largest of its columns' limits, at
  /// most max_positions) into the splits, rather than max_positions. A graph captured with
  /// max_positions at the table's capacity (table_width x block_tokens) and a fixed split
  /// count then stays balanced at every context; without it, its splits past the rows'
  /// real histories would read nothing while the first did all the work.
  bool splits_by_reach = false;
};

/// Query heads per kv head.
COMPUTRON_HOST_DEVICE int32_t paged_groups(const paged_attention_args& a) {
  return a.heads / a.kv_heads;
}
/// Queries one (row, kv head) serves: its group's heads x the step's columns. Query q is
/// group member q / columns (query head kv_head x groups + q / columns), column q % columns.
COMPUTRON_HOST_DEVICE int32_t paged_queries(const paged_attention_args& a) {
  return paged_groups(a) * a.columns;
}
COMPUTRON_HOST_DEVICE int64_t paged_query_offset(const paged_attention_args& a, int32_t row,
                                                 int32_t head, int32_t column) {
  return ((static_cast<int64_t>(row) * a.heads + head) * a.columns + column) * a.head_dim;
}
COMPUTRON_HOST_DEVICE int64_t paged_out_offset(const paged_attention_args& a, int32_t row,
                                               int32_t head, int32_t column) {
  return ((static_cast<int64_t>(row) * a.columns + column) * a.heads + head) * a.head_dim;
}
/// The table entry of block `block` of row `row`.
COMPUTRON_HOST_DEVICE int64_t paged_entry(const paged_attention_args& a, int32_t row,
                                          int64_t block) {
  return a.table[static_cast<int64_t>(row) * a.table_width + block];
}
COMPUTRON_HOST_DEVICE int32_t paged_entry_chunk(int64_t entry) {
  return static_cast<int32_t>(entry >> 32);
}
/// Chunk `c`'s keys and values: from the table where the call has one, else inline.
COMPUTRON_HOST_DEVICE const paged_kv_chunk& paged_chunk(const paged_attention_args& a, int32_t c) {
  return a.chunk_table != nullptr ? a.chunk_table[c] : a.chunk[c];
}
/// Element offset, in its chunk's keys or values, of token `token` of the block `entry`
/// names, for kv head `kv_head`.
COMPUTRON_HOST_DEVICE int64_t paged_kv_offset(const paged_attention_args& a, int64_t entry,
                                              int32_t kv_head, int32_t token) {
  const auto& c = paged_chunk(a, paged_entry_chunk(entry));
  return kv_head * c.head_stride +
         ((entry & 0xffffffffLL) * a.block_tokens + token) * static_cast<int64_t>(a.head_dim);
}

/// Positions [begin, end) that split `split` of `splits` reads for an item whose columns
/// reach `reach` (the largest of their limits): whole blocks, the longest row's history
/// (max_positions), or with splits_by_reach the item's own reach, divided as evenly as
/// blocks allow (an empty range where blocks run out; its partial has sum 0, which the
/// merge skips). The caller still stops each range at `reach`.
COMPUTRON_HOST_DEVICE void paged_split_range(const paged_attention_args& a, int32_t split,
                                             int32_t splits, int64_t reach, int64_t& begin,
                                             int64_t& end) {
  int64_t span = a.max_positions;
  if (a.splits_by_reach && reach < span) span = reach > 0 ? reach : 0;
  const int64_t blocks = (span + a.block_tokens - 1) / a.block_tokens;
  const int64_t per = (blocks + splits - 1) / splits;
  begin = split * per * a.block_tokens;
  end = begin + per * a.block_tokens;
  if (end > span) end = span;
  if (begin > end) begin = end;
}

/// A query's running softmax over a range of positions: the largest score seen (`max`,
/// -infinity before any), the sum of exp(score - max) (`sum`), and the values weighted
/// the same way (kept beside it, head_dim of them).
struct paged_partial {
  float max;
  float sum;
};

/// Merges a partial (m2, s2, acc2) into (m1, s1, acc1): the factors to scale each side's
/// weighted values by, so that both are relative to the larger maximum. A side that saw
/// no position (sum 0) gets factor 0.
COMPUTRON_HOST_DEVICE void paged_merge_factors(paged_partial& into, paged_partial other,
                                               float& scale_into, float& scale_other) {
  if (other.sum == 0.0f) {
    scale_into = 1.0f;
    scale_other = 0.0f;
    return;
  }
  if (into.sum == 0.0f) {
    scale_into = 0.0f;
    scale_other = 1.0f;
    into = other;
    return;
  }
  const float m = into.max > other.max ? into.max : other.max;
  scale_into = expf(into.max - m);
  scale_other = expf(other.max - m);
  into.sum = into.sum * scale_into + other.sum * scale_other;
  into.max = m;
}

/// Why a call cannot run (nullptr: it can): shapes, the table and the chunks. Checked on
/// the host before either build runs. With a chunk_table only the chunk count is checked:
/// the table may lie in device memory, which the host cannot read.
const char* paged_attention_refusal(const paged_attention_args& a);

/// paged_attention_refusal, and f16, which the host build does not read (CPUs run f32 and
/// bf16; f16 is the GPU's).
const char* paged_attention_host_refusal(const paged_attention_args& a);

/// The host build over (row, kv head) items [begin, end) of rows x kv_heads, each
/// independent (a caller runs ranges on several threads), in `splits` ranges merged
/// (split-K, as the CUDA kernel does; 1 on the CPU's path). Call it only with arguments
/// paged_attention_host_refusal accepts.
void paged_attention_host(const paged_attention_args& a, int64_t begin, int64_t end,
                          int32_t splits = 1);

}  // namespace computron::engine
