#pragma once

// Rotary position embeddings of a step's queries and keys in one call: q and k read once
// from the projection's output (a view of the fused q/k/v product), rotated by
// rotate-half at each row's positions, q scaled by 1 / sqrt(head dim), and written head
// major ([rows, heads, columns, head dim]), as attention reads them. The arithmetic is the
// unfused path's (llama_block.cpp), rounding where it rounds: cos and sin of f32 angles
// rounded to the activations' type, then q x cos and rotate_half(q) x sin each rounded,
// their sum rounded, and the scaled query rounded; cos and sin are libm's (the host) or
// CUDA's, where libtorch's vectorised ones may differ in an f32's last bit. The host build
// (rope.cpp) is the CPU's path and the reference of the CUDA build (cuda/rope.cu).
//
// With rotate = false a call is the KV write alone (a family without rotary embeddings,
// such as OPT): each item's keys and values go into its KV slots as they are.
//
// Torch-free and CUDA-free.
#include <cstdint>

#include "engine/paged_attention.hpp"

namespace computron::engine {

/// One KV pool chunk's keys and values of the call's layer, [kv heads, blocks x block
/// tokens, head dim] each (paged_kv_chunk's layout, written).
struct rope_kv_chunk {
  void* keys = nullptr;
  void* values = nullptr;
  /// Elements from one kv head to the next.
  int64_t head_stride = 0;
};

struct rope_args {
  element_type type = element_type::f32;
  int64_t rows = 0;
  int64_t columns = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  /// Queries: head h of column c of row r at r x q_row_stride + c x q_column_stride +
  /// h x head_dim (each head's head_dim elements contiguous), likewise keys.
  const void* q = nullptr;
  int64_t q_row_stride = 0;
  int64_t q_column_stride = 0;
  const void* k = nullptr;
  int64_t k_row_stride = 0;
  int64_t k_column_stride = 0;
  /// [rows, columns]: each query column's position.
  const int64_t* positions = nullptr;
  /// [head_dim / 2] f32: the rotary inverse frequencies (scaling applied).
  const float* inv_freq = nullptr;
  /// What the rotated queries are multiplied by (1 / sqrt(head dim)).
  double q_scale = 1.0;
  /// [rows, heads, columns, head dim] and [rows, kv heads, columns, head dim], contiguous.
  /// k_out may be null where the call writes the KV blocks (attention reads those).
  void* q_out = nullptr;
  void* k_out = nullptr;

  /// RoPE with the KV write: the rotated keys and the values go straight into the KV
  /// blocks, where kv_step::write would copy them after. Per item (row x columns +
  /// column), (chunk << 32) | slot, the slot being block index in the chunk x block tokens
  /// + offset, or -1 for a column that writes nothing (padding); chunk indexes `cache`.
  /// Null: no blocks written.
  const int64_t* cache_slots = nullptr;
  /// The values, laid out as the keys are.
  const void* v = nullptr;
  int64_t v_row_stride = 0;
  int64_t v_column_stride = 0;
  int32_t cache_chunks = 0;
  rope_kv_chunk cache[paged_max_chunks];
  /// Where set, chunk c of the KV write is cache_table[c] ([cache_chunks], in the memory
  /// the build runs in: device memory for CUDA), and `cache` is unused: a captured CUDA
  /// graph keeps its arguments, and the chunks a batch writes change from step to step.
  /// Its keys and values are written (const only because paged attention reads the same
  /// table; the caller owns that memory).
  const paged_kv_chunk* cache_table = nullptr;
  /// False: no rotation, the KV write alone (heads 0; q, q_out, positions and inv_freq may
  /// be null; cache_slots and v are needed). Keys go into their slots, and into k_out where
  /// it is given, as they are.
  bool rotate = true;
};

/// Chunk `c` of the KV write: from the table where the call has one, else inline.
COMPUTRON_HOST_DEVICE rope_kv_chunk rope_cache_chunk(const rope_args& a, int32_t c) {
  if (a.cache_table == nullptr) return a.cache[c];
  const paged_kv_chunk& t = a.cache_table[c];
  rope_kv_chunk out;
  out.keys = const_cast<void*>(t.keys);
  out.values = const_cast<void*>(t.values);
  out.head_stride = t.head_stride;
  return out;
}

/// Why a call cannot run (nullptr: it can). With a cache_table only the chunk count is
/// checked: the table may lie in device memory, which the host cannot read.
const char* rope_refusal(const rope_args& a);

/// rope_refusal, and f16 (the GPU's type; CPUs run f32 and bf16).
const char* rope_host_refusal(const rope_args& a);

/// The host build over (row, column) items [begin, end) of rows x columns, each
/// independent. Only with arguments rope_host_refusal accepts.
void rope_host(const rope_args& a, int64_t begin, int64_t end);

}  // namespace computron::engine
