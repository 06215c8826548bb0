#pragma once

// The decoder stage's own state, shared by the .cpp files that define its members
// (decoder_stage.cpp: creation, prefill and decode; chunked_prefill.cpp: a prefill in
// chunks): what a family's block sees (stage_state), the block, the KV pool, and the parts
// every step shares (the layers and the head, the inputs of a left-padded step).
// Internal: include it only from those .cpp files, which already pay for torch.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <caf/expected.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "engine/graph_inputs.hpp"
#include "engine/torch/decoder_block.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "engine/torch/device_sampling.hpp"
#include "engine/torch/kv_blocks.hpp"
#include "engine/torch/torch_interop.hpp"

namespace computron::models {

namespace detail {

/// Waiting for a layer's bytes: as long as a large load could possibly take.
inline constexpr auto layer_wait = std::chrono::minutes{10};

/// The padding token; padded positions are masked, the id only has to be valid (OPT's
/// pad id, inside every vocabulary).
inline constexpr int64_t pad_token = 1;

inline caf::error bad(std::string what) {
  return make_error(ec::invalid_request, std::move(what));
}

/// A left-padded step's inputs on the host, [b, t] each: row i's tokens are prompt i's
/// [begin[i], end[i]), in its last end[i] - begin[i] columns at their real positions (so
/// every row's last token is in the last column); padding is pad_token at position 0.
struct step_inputs {
  at::Tensor ids;
  at::Tensor positions;
  at::Tensor valid;  // bool: a row's own token, not padding
};
step_inputs left_padded(const std::vector<std::vector<int64_t>>& prompts,
                        const std::vector<int64_t>& begin, const std::vector<int64_t>& end,
                        int64_t t);

/// A LoRA adapter attached to a stage (decoder_stage::attach_adapter), read in place.
struct attached_adapter {
  gpu::weight_shard* weights = nullptr;
  int64_t rank = 0;
  /// Per (stage-relative layer x projection, as lora_group::pairs): the table entries of
  /// A and B, both null where the adapter leaves the projection alone.
  std::vector<std::pair<const gpu::tensor_entry*, const gpu::tensor_entry*>> entries;
  /// The views of `entries` over the shard's device copy at `bound` (made at the first
  /// step that uses the adapter, and again if the address ever changes).
  std::byte* bound = nullptr;
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
};

/// Held exclusively while a stage of CUDA device `index` captures its graphs, and shared by
/// every step on that device: while a capture is under way, libtorch's caching allocator
/// must not meet another thread's allocation that falls back to freeing cached memory (it
/// asserts that no capture is under way there).
std::shared_mutex& capture_gate(int index);

/// One batch-size bucket of a stage's decode graphs (decode_graphs.cpp): the buffers a
/// graph's step reads and writes, at addresses fixed for the stage's life.
struct graph_bucket {
  int32_t rows = 0;
  /// The step's inputs on the host (table, limits, slots, positions, tokens), then on the
  /// device in one copy (`inputs`; through pinned `staged` on a GPU).
  engine::graph_inputs host;
  at::Tensor staged;
  at::Tensor inputs;
  /// Later pipeline stages: the previous stage's states [rows, 1, hidden].
  at::Tensor hidden;
  /// The step as the layers see it: in place, over the pool's chunk table.
  kv_step kv;
  /// What the step leaves: the hidden states [rows, 1, hidden], or on the last stage this
  /// rank's logits [rows, vocab_rows] in f32.
  at::Tensor out;
  /// The captured graph (CUDA; decode_graphs.cpp's type), null where nothing is captured,
  /// and the event of the last copy out of `staged`.
  std::shared_ptr<void> graph;
  std::shared_ptr<void> copied;
};

/// A stage's decode graphs (compute_options::graph_max_batch).
struct graph_state {
  /// Block table entries per row: the positions a bucket's rows may reach, in blocks.
  int32_t width = 0;
  std::vector<graph_bucket> buckets;  // ascending sizes
  /// kv_block_pool::chunk_table where the kernels read it (the device on a GPU), as
  /// int64 triples, and the pool's chunk_version it holds.
  at::Tensor chunk_table;
  uint64_t chunk_version = ~uint64_t{0};
  bool ready = false;
  /// The log said once that the pool's chunks lie past the chunk table.
  bool told_slots = false;
  graph_stats stats;
};

}  // namespace detail

struct decoder_stage::impl : detail::stage_state {
  std::unique_ptr<detail::decoder_block> block;
  /// The stage's KV blocks; caches hold it too, so a cache may outlive the stage.
  std::shared_ptr<detail::kv_block_pool> kv_pool;
  /// Bytes of the shard that must be on the device before layer i (relative index) runs;
  /// the embeddings come first, the final norm and LM head last.
  std::vector<uint64_t> layer_ready_bytes;
  /// Attached LoRA adapters by id (engine/torch/lora_forward.cpp).
  std::map<int64_t, detail::attached_adapter> adapters;
  /// The last steps' adapters stacked (lora_batch::stacks), reused while they run in the
  /// same order; dropped when an adapter is detached (its id may come back with new bytes).
  std::shared_ptr<const detail::lora_stacks> lora_stacked;
  /// The decode graphs; null where they are off (compute_options::graph_max_batch).
  std::unique_ptr<detail::graph_state> graphs;

  /// Refuses a step's adapter ids for a batch of `rows` prompts: a size other than the
  /// batch's (empty is every row on the base), a negative id, an id not attached.
  caf::error check_adapters(const std::vector<int64_t>& ids, size_t rows) const;
  /// The step's rows grouped by adapter (`ids[i]`: row i's, 0 the base; empty: every row
  /// on the base), their views bound and their row indices on the device in one copy. No
  /// group (and no allocation) when no row has an adapter. Errors: an adapter not attached
  /// any more, or not loaded.
  caf::expected<detail::lora_batch> lora_rows(const std::vector<int64_t>& ids);
  /// lora_rows of the adapters the cache's rows run with (decode, a later prefill chunk);
  /// nothing allocated when every row is on the base.
  caf::expected<detail::lora_batch> lora_rows(const detail::kv_cache_rows& cache);

  caf::error bind() {
    auto p = weights->device_data();
    if (!p)
      return with_context(p.error(), fmt::format("{} stage {} tp rank {}: weights are not loaded",
                                                 spec.name, shard.pp_rank, shard.tp_rank));
    base = *p;
    return {};
  }

  caf::error wait_for(uint64_t bytes) { return weights->wait_bytes(bytes, detail::layer_wait); }

  /// A step's share of its device's capture gate (none off CUDA).
  std::shared_lock<std::shared_mutex> step_gate() const {
    if (!options.device().is_cuda()) return {};
    return std::shared_lock<std::shared_mutex>{detail::capture_gate(options.device().index())};
  }

  /// The decode graphs (decode_graphs.cpp). setup_graphs makes the buckets' buffers and, on
  /// CUDA, captures each; graph_decode runs a decode step through a bucket, or returns
  /// nullopt where the step runs eagerly (and nothing changed).
  caf::error setup_graphs();
  std::optional<caf::expected<host_tensor>> graph_decode(const std::vector<int64_t>& tokens,
                                                         const host_tensor* hidden,
                                                         detail::kv_cache_rows& cache,
                                                         head_output out);
  /// A graph's step over bucket `g`'s buffers: what a capture records and the CPU runs.
  caf::expected<at::Tensor> graph_forward(detail::graph_bucket& g);
  /// Turns the graphs off for good: every step eagerly from now on, `why` said once.
  void graphs_off(std::string why);

  /// Shared by every step once inputs are tensors: the layers, then either the hidden
  /// states or the last position's logits.
  /// `scored`: prefill rows (with their prompt lengths) whose every position before the
  /// last also gets logits, appended after the batch's rows. `logits` false (a chunk of a
  /// chunked prefill before its last): the last stage skips the head and returns an empty
  /// tensor.
  /// `lora`: the step's adapter rows (lora_rows), which the blocks' projections read.
  caf::expected<host_tensor> run(at::Tensor x, const at::Tensor& positions,
                                 const detail::kv_step& kv, const detail::lora_batch& lora,
                                 head_output out,
                                 const std::vector<std::pair<int64_t, int64_t>>& scored = {},
                                 bool logits = true) {
    // The blocks see the step's groups only while its layers run.
    struct lora_scope {
      detail::stage_state& s;
      ~lora_scope() { s.lora = nullptr; }
    } scope{*this};
    this->lora = lora.groups.empty() ? nullptr : &lora;
    for (auto i = layer_begin; i < layer_end; ++i) {
      auto li = static_cast<size_t>(i - layer_begin);
      if (auto err = wait_for(layer_ready_bytes[li])) return err;
      auto y = block->layer(*this, i, x, positions, kv);
      if (!y) return std::move(y.error());
      x = std::move(*y);
    }
    if (!last()) return detail::to_host(x);
    if (!logits) return host_tensor{};
    if (auto err = weights->wait_loaded(detail::layer_wait)) return err;
    auto last_tok = x.select(1, x.size(1) - 1);  // left padding: the last token is last
    at::Tensor rows = last_tok;
    if (!scored.empty()) {
      // The prompt's log-probabilities (echo with logprobs): only the rows that ask pay
      // for their positions' logits.
      std::vector<at::Tensor> parts{last_tok};
      const auto t = x.size(1);
      for (auto [row, len] : scored)
        if (len > 1) parts.push_back(x.select(0, row).narrow(0, t - len, len - 1));
      rows = at::cat(parts, 0);
    }
    return head_result(block->head(*this, rows), out, !scored.empty());
  }

  /// The last stage's answer from this rank's logits `local` [n, vocab_rows] (f32): whole
  /// rows, their best candidates, or tokens drawn on the device, as `out` asks (no
  /// candidates and no draws where rows are `scored`).
  caf::expected<host_tensor> head_result(at::Tensor local, head_output out, bool scored) {
    if (out.draw && out.top == 0 && !scored) {
      auto full = gather_vocab(local);  // every rank: the whole rows' collective
      if (!full) return std::move(full.error());
      if (out.draws == nullptr) return host_tensor{};
      // Ids travel as floats, exact up to 2^24: a larger vocabulary gives its whole rows.
      if (static_cast<int64_t>(out.draws->size()) != full->size(0) ||
          spec.vocab >= (int64_t{1} << 24))
        return detail::to_host(*full);
      return detail::to_host(detail::draw_on_device(*full, *out.draws));
    }
    auto result = out.top > 0 && !scored ? top_vocab(local, out.top) : gather_vocab(local);
    if (!result) return std::move(result.error());
    return detail::to_host(*result);
  }

  /// The first stage's input: the embedded tokens, once the embeddings are on the device.
  caf::expected<at::Tensor> embed_first(const at::Tensor& ids, const at::Tensor& positions) {
    if (auto err =
            wait_for(layer_ready_bytes.empty() ? weights->size_bytes() : layer_ready_bytes.front()))
      return err;
    return block->embed(*this, ids, positions);
  }

  caf::expected<at::Tensor> hidden_input(const host_tensor* hidden, int64_t b, int64_t t) {
    if (hidden == nullptr)
      return detail::bad("a later pipeline stage needs the previous stage's hidden states");
    std::vector<int64_t> want{b, t, spec.hidden};
    if (hidden->type != type || hidden->shape != want)
      return detail::bad(fmt::format("hidden states must be {} [{}, {}, {}]", gpu::to_string(type),
                                     b, t, spec.hidden));
    return detail::from_host(*hidden, options.device());
  }

  /// A step's input on this stage: the first stage embeds `in`'s tokens at their
  /// positions (`dev_pos`, on the device), a later one takes the previous stage's states.
  caf::expected<at::Tensor> step_input(const detail::step_inputs& in, const at::Tensor& dev_pos,
                                       const host_tensor* hidden, int64_t b, int64_t t) {
    if (first()) return embed_first(in.ids.to(options.device()), dev_pos);
    return hidden_input(hidden, b, t);
  }

  caf::error check_tokens(const std::vector<int64_t>& ids) const {
    for (auto id : ids)
      if (id < 0 || id >= spec.vocab)
        return detail::bad(fmt::format("token id {} is outside the vocabulary of {} ({} ids)", id,
                                       spec.name, spec.vocab));
    return {};
  }

  /// Prefill's mask [b, 1, t, t] on the stage's device from the step's `valid` columns
  /// [b, t], true where a query may look (as scaled_dot_product_attention takes it): query
  /// i sees key j when j <= i and j is not padding; a padding query sees itself, so that
  /// no softmax row is empty.
  at::Tensor prefill_visible(const at::Tensor& valid) const {
    const auto t = valid.size(1);
    auto key_valid = valid.to(options.device());
    auto causal =
        at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(options.device())).tril();
    auto eye = at::eye(t, at::TensorOptions().dtype(at::kBool).device(options.device()));
    auto allowed = (causal.unsqueeze(0) & key_valid.unsqueeze(1)) | eye.unsqueeze(0);
    return allowed.unsqueeze(1);
  }
};

}  // namespace computron::models
