#pragma once

// The KV block store of one decoder stage and the block tables of a batch's sequences.
// A block holds kv_block_tokens positions of keys and values for every layer of the stage
// and its local key/value heads (kv_block_bytes); blocks live in chunks of device memory
// that a pool takes through the stage's allocator and gives back once none of their blocks
// is held. A kv_cache is a list of rows, each a block table and a length, so that rows
// leave and join a batch without a KV byte being copied. Internal: include it only from the
// .cpp files that already pay for torch (kv_blocks.cpp, kv_cache.cpp, decoder_stage.cpp,
// chunked_prefill.cpp).
#include <ATen/core/Tensor.h>
#include <caf/expected.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/paged_attention.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "models/decoder_spec.hpp"

namespace computron::models::detail {

/// Where a block lives: its chunk's slot in the high 32 bits, its index in the chunk in
/// the low 32. Stable while the block is held (chunks never move).
using block_id = int64_t;
inline int32_t chunk_of(block_id b) {
  return static_cast<int32_t>(b >> 32);
}
inline int64_t index_in_chunk(block_id b) {
  return b & 0xffffffffLL;
}
inline block_id make_block_id(int32_t chunk, int64_t index) {
  return (static_cast<int64_t>(chunk) << 32) | index;
}

/// One stage's KV blocks. A chunk is one tensor [layers, 2 (keys, values), kv heads,
/// blocks, kv_block_tokens, head dim]: the heads outermost, so that gathering a batch's
/// blocks of one layer gives [kv heads, rows x blocks, tokens, head dim] contiguous, which
/// attention reads as [kv heads, rows, positions, head dim] without a second copy.
/// Thread-safe (a cache may be dropped on another thread than the stage's caller).
class kv_block_pool {
 public:
  /// `name` prefixes errors ("opt-125m stage 0 tp rank 1"). `options` are the stage's
  /// (dtype and device), used where opts.allocate is empty.
  kv_block_pool(std::string name, int64_t layers, int64_t kv_heads, int64_t head_dim,
                at::TensorOptions options, kv_pool_options opts);
  ~kv_block_pool();
  kv_block_pool(const kv_block_pool&) = delete;
  kv_block_pool& operator=(const kv_block_pool&) = delete;

  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  const at::TensorOptions& options() const { return options_; }

  /// `n` free blocks, each held once, from the lowest chunks first (so that later chunks
  /// drain and go back). When the free blocks do not suffice, one chunk is allocated for
  /// the rest: as many blocks as are allocated already (doubling, so a batch's gather
  /// touches few chunks), or failing that as many as needed. Errors:
  /// out_of_device_memory with the numbers when no chunk can be had; nothing is taken then.
  caf::expected<std::vector<block_id>> take(int64_t n);
  /// One more holder of `b` (a row copied by keep_rows shares its blocks).
  void share(block_id b);
  /// One holder fewer; at none the block is free, and a chunk none of whose blocks is held
  /// is given back at once.
  void release(block_id b);
  /// Holders of `b` (a row writes into a block only while it is the only holder).
  int32_t holders(block_id b) const;

  /// Keys (`kind` 0) or values (1) of stage-relative layer `layer` in chunk `chunk`:
  /// [kv heads, blocks, kv_block_tokens, head dim], a view.
  at::Tensor layer_view(int32_t chunk, int64_t layer, int kind) const;
  /// layer_view's first element, and its stride between kv heads (elements), without
  /// making a tensor: what in-place attention reads (engine/paged_attention.hpp).
  const void* layer_data(int32_t chunk, int64_t layer, int kind, int64_t& head_stride) const;
  /// Sets every position of these blocks to zero: a block a step does not fill must hold
  /// finite values past its row's length, because masked positions still meet a zero
  /// probability in probs x values (0 x NaN is NaN).
  void zero(const std::vector<block_id>& blocks);
  /// Copies block `from` into block `to` (every layer, keys and values): a row that shared
  /// its last, partly filled block gets its own before writing into it.
  void copy(block_id from, block_id to);

  kv_pool_stats stats() const;
  /// Every chunk slot's keys and values of every layer as the kernels read them through a
  /// table (paged_attention_args::chunk_table): [layers, engine::paged_max_chunks], slot
  /// order, null for a slot with no chunk or past paged_max_chunks. What a graph's step
  /// reads: a graph keeps the table's address, and the pool's chunks come and go.
  std::vector<engine::paged_kv_chunk> chunk_table() const;
  /// Changes whenever a chunk comes or goes (chunk_table's contents with it).
  uint64_t chunk_version() const;
  /// One past the highest slot a live chunk holds or the next new chunk would take (the
  /// first given back, else the next): a step whose chunks all lie below a table's
  /// paged_max_chunks entries stays below them when it adds a chunk.
  int32_t slot_bound() const;
  int64_t layers() const { return layers_; }
  /// The blocks a new chunk may hold beyond what the next takes need (-1: no bound; grow):
  /// the step's batch holds them in the ledger and its rows do not. After a chunk is added,
  /// the pool's free blocks are at most these, so its pages stay within what the ledger
  /// holds for the model's batches.
  void set_spare(int64_t blocks);

 private:
  struct chunk {
    at::Tensor data;
    std::vector<int32_t> holders;  // per block
    std::vector<int64_t> free;     // indices of unheld blocks, taken from the back
    int64_t held = 0;              // blocks with holders
    uint64_t device_bytes = 0;     // whole pages of the device
  };
  caf::error grow(int64_t need);
  caf::expected<at::Tensor> allocate_chunk(int64_t blocks);
  chunk& at_(block_id b) const;

  std::string name_;
  int64_t layers_, kv_heads_, head_dim_;
  at::TensorOptions options_;
  kv_pool_options opts_;
  uint64_t block_bytes_;
  mutable std::mutex mtx_;
  std::vector<std::unique_ptr<chunk>> chunks_;  // by slot; null: a slot given back
  int64_t allocated_ = 0;
  int64_t held_ = 0;
  uint64_t device_bytes_ = 0;
  int64_t spare_ = -1;
  uint64_t version_ = 0;
};

/// What one step does with the blocks, planned by the cache (kv_cache.cpp) before the
/// layers run and used by every layer's attention (stage_state::attend).
struct kv_step {
  const kv_block_pool* pool = nullptr;
  /// Prefill: the cache was empty, so the step's own keys are all the keys; attention
  /// reads them directly (as the unbatched forward does) and the blocks only store them.
  /// Extend (decode, a later chunk of a chunked prefill): attention reads the rows'
  /// blocks gathered, the step's new positions already written into them.
  bool prefill = false;
  int64_t rows = 0;
  /// Extend in place (engine/paged_attention.hpp): attention reads each row's blocks
  /// where they lie, through `table` and `limits`, and nothing is gathered (`reads` and
  /// `blocked` stay empty). plan_extend sets it where it was asked to and the step's
  /// blocks lie in at most engine::paged_max_chunks chunks.
  bool in_place = false;
  /// The pool's chunk slots the step reads; `table` names them by their place here.
  std::vector<int32_t> chunks;
  /// [rows, read_blocks]: (place in `chunks` << 32) | block index in the chunk, row r's
  /// blocks in position order (past its last, 0: never read). [rows x t]: the positions
  /// query column j of row r sees (0 where the row holds none). Host lists; `on_device`
  /// holds both (table first) on the pool's device where that is not the CPU.
  std::vector<int64_t> table;
  std::vector<int64_t> limits;
  /// In place: per query column (rows x t), (place in `chunks` << 32) | slot (block index
  /// in the chunk x kv_block_tokens + offset) where the column's key and value go, -1 where
  /// it writes none (padding). The rotary embedding writes them there in its own call
  /// (engine/rope.hpp), so `write` has nothing left to copy.
  std::vector<int64_t> slots;
  /// On a GPU: table, limits and slots, in that order, on the pool's device.
  at::Tensor on_device;
  /// Prefill: where a query may look, [b, 1, t, t] (causal, padding).
  at::Tensor visible;
  /// Extend, gathered: where a query may not look, [1, b, 1, t, read_positions] (a query
  /// head's group broadcast): the gathered positions
  /// past the query's own (its row's cached length before the step plus its index among
  /// the row's new tokens), and for a padding column every position but the row's first.
  at::Tensor blocked;
  /// One chunk's share of a copy: `from` indexes the source, `into` the destination;
  /// an undefined one means every element in order.
  struct part {
    int32_t chunk = 0;
    at::Tensor into;
    at::Tensor from;
  };
  /// Writes: `into` slots of the chunk (block index x kv_block_tokens + offset), `from`
  /// positions of the step's keys flattened as row x t + column.
  std::vector<part> writes;
  /// Reads (extend): `from` block indices in the chunk; `into` (where several chunks hold
  /// the batch's blocks) places in the gathered list viewed as [kv heads x rows x
  /// read_blocks] slices of one block each.
  std::vector<part> reads;
  int64_t read_blocks = 0;
  /// A graph's step (engine/torch/decode_graphs.cpp): the table's chunks are the pool's
  /// slots, read through a table in memory, [layers, engine::paged_max_chunks] of them
  /// (kv_block_pool::chunk_table; device memory on a GPU), not passed as arguments; the
  /// splits of attention follow each row's reach. Null: the chunks of `chunks` are passed.
  const engine::paged_kv_chunk* chunk_table = nullptr;
  /// Positions attention reads of the gathered blocks: the longest row's length (the
  /// last block's unused tail is left out rather than masked).
  int64_t read_positions = 0;

  /// Stores the step's keys and values [b, kv heads, t, head dim] of stage-relative
  /// layer `layer` in the rows' blocks.
  void write(int64_t layer, const at::Tensor& k, const at::Tensor& v) const;
  /// The rows' keys and values of `layer`, [kv heads, b, read_positions, head dim] each;
  /// positions past a row's length are `blocked`.
  std::pair<at::Tensor, at::Tensor> gather(int64_t layer) const;
};

/// kv_cache's state: the pool its blocks come from and each row's block table.
struct kv_cache_rows {
  struct row {
    std::vector<block_id> blocks;  // kv_blocks_for(length) of them, in position order
    int64_t length = 0;            // positions held (the row's tokens so far)
    int64_t adapter = 0;           // the LoRA adapter the row runs with (0: the base)
  };
  std::shared_ptr<kv_block_pool> pool;
  std::vector<row> rows;

  kv_cache_rows() = default;
  kv_cache_rows(kv_cache_rows&& o) noexcept;
  kv_cache_rows& operator=(kv_cache_rows&& o) noexcept;
  kv_cache_rows(const kv_cache_rows&) = delete;
  kv_cache_rows& operator=(const kv_cache_rows&) = delete;
  ~kv_cache_rows();
  /// Gives every row's blocks back; the cache is empty after.
  void clear();
};

/// Prefill's step: `cache` is emptied and given the blocks of prompts of `lengths`,
/// left-padded to `t` columns (row i's tokens in columns t - lengths[i] .. t - 1).
/// `visible` is the prefill mask (kv_step::visible). Errors: the pool's (nothing is held then).
caf::expected<kv_step> plan_prefill(kv_cache_rows& cache, std::shared_ptr<kv_block_pool> pool,
                                    const std::vector<int64_t>& lengths, int64_t t,
                                    at::Tensor visible);
/// A step over a cache that holds rows already: row i gets `added[i]` >= 0 new positions
/// written from its length on (new blocks where they cross a block boundary, a private
/// copy of a shared, partly filled last block before writing into it), then every row's
/// blocks are gathered. The step's columns are left-padded to `t` (row i's new tokens in
/// columns t - added[i] .. t - 1). A row with no position yet reads another row's first
/// block as padding (finite, masked). Rows' lengths grow by `added`. At least one row
/// must add a position. Errors: the pool's (nothing changed then).
/// `in_place`: plan for attention that reads the blocks where they lie (kv_step::in_place)
/// instead of a gather.
caf::expected<kv_step> plan_extend(kv_cache_rows& cache, const std::vector<int64_t>& added,
                                   int64_t t, bool in_place = false);
/// Decode's blocks without a plan (a graph's step, whose table is the rows' block ids,
/// engine/graph_inputs.hpp): each row holds what its next position needs, as plan_extend
/// takes it, and its length grows by one. Errors: the pool's (nothing changed then).
caf::error extend_rows_by_one(kv_cache_rows& cache);
/// Decode's step: plan_extend with one new position per row.
caf::expected<kv_step> plan_decode(kv_cache_rows& cache, bool in_place = false);

}  // namespace computron::models::detail

namespace computron::models {
/// kv_cache's state is its rows' block tables (kv_cache.cpp keeps, joins and plans them;
/// decoder_stage.cpp runs the steps).
struct kv_cache::impl : detail::kv_cache_rows {};
}  // namespace computron::models
