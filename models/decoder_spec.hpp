#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <caf/expected.hpp>
#include <nlohmann/json_fwd.hpp>

#include "gpu/weight_store.hpp"
#include "sched/kv_blocks.hpp"

/// Decoder shapes of every family (OPT; the Llama family: Llama, Mistral, Qwen2, Qwen3),
/// how they split over tensor x pipeline parallel ranks, and the parameter layout of every
/// shard. Torch-free: sizes are known without allocating. A family adds a layout and a
/// validation here (models/opt_family.cpp, models/llama_family.cpp), a block in the
/// forward (models/*_block.cpp) and catalogue entries; nothing above models/ knows families.
namespace computron::models {

/// Which block a decoder is made of.
enum class model_family : uint8_t {
  /// OPT: learned positions, LayerNorm, ReLU MLP, biases everywhere, tied head.
  opt,
  /// Llama, Mistral, Qwen2, Qwen3: RMSNorm, SwiGLU MLP, rotary positions, grouped-query
  /// attention; optional q/k/v biases (Qwen2), q/k norms (Qwen3), tied or untied head.
  llama,
};

/// "opt" or "llama" (the model kind of model_config).
const char* to_string(model_family f);

/// Rotary embeddings as Hugging Face computes them (rotate-half).
struct rope_config {
  double theta = 10000.0;
  /// "" (none), "linear" or "llama3" (Llama 3.1+); others are refused when read.
  std::string scaling;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
};

/// The shape of a decoder. The constructor takes OPT's whole shape, so an OPT entry reads
/// `{"opt-125m", 768, 12, 12, 3072, 50272, 2048}`; other families set the fields after.
struct decoder_spec {
  decoder_spec() = default;
  decoder_spec(std::string name_, int64_t hidden_, int64_t layers_, int64_t heads_, int64_t ffn_,
               int64_t vocab_ = 50272, int64_t max_positions_ = 2048)
      : name(std::move(name_)),
        hidden(hidden_),
        layers(layers_),
        heads(heads_),
        ffn(ffn_),
        vocab(vocab_),
        max_positions(max_positions_) {}

  std::string name;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t ffn = 0;
  int64_t vocab = 50272;
  int64_t max_positions = 2048;
  model_family family = model_family::opt;
  /// Key/value heads (grouped-query attention); 0: as many as query heads.
  int64_t kv_heads = 0;
  /// Width of one head; 0: hidden / heads.
  int64_t head_dim = 0;
  /// RMSNorm's epsilon (Llama family; OPT's LayerNorm uses 1e-5).
  double norm_eps = 1e-5;
  rope_config rope;
  /// Biases on the q/k/v projections (Qwen2; `attention_bias` elsewhere).
  bool qkv_bias = false;
  /// A bias on the output projection (`attention_bias` in Llama and Qwen3, never Qwen2).
  bool o_bias = false;
  /// Qwen3's per-head RMSNorm on queries and keys before the rotation.
  bool qk_norm = false;
  /// The LM head reads the token embedding (OPT, Llama 3.2 1B/3B, small Qwen2.5).
  bool tied_embeddings = true;
  /// Hugging Face's model_type ("llama", "mistral", "qwen2", "qwen3"; "opt"), for display.
  std::string model_type;

  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : (heads > 0 ? hidden / heads : 0); }
};

/// OPT's name for the shape, kept for callers that only know OPT.
using opt_spec = decoder_spec;

/// The catalogue: opt-125m ... opt-175b, llama-3.2-1b, llama-3.1-8b, qwen2.5-0.5b,
/// qwen2.5-7b, qwen3-0.6b, mistral-7b, plus tiny shapes for tests (opt-tiny, opt-mini,
/// llama-tiny, llama-mini).
const std::vector<decoder_spec>& catalogue();

/// A catalogue entry by name; `unknown_model` with the known names otherwise.
caf::expected<decoder_spec> find_spec(std::string_view name);

/// A shape as a JSON object (every field; how a shape outside the catalogue travels in a
/// model's configuration) and back. Errors name the field.
nlohmann::json to_json(const decoder_spec& spec);
caf::expected<decoder_spec> spec_from_json(const nlohmann::json& j);

/// How a model is split: tp ranks per stage, pp stages.
struct parallel_config {
  int tp = 1;
  int pp = 1;
};

/// One shard: its tensor-parallel rank and pipeline stage.
struct shard_index {
  int tp_rank = 0;
  int pp_rank = 0;
};

/// Checks that `spec` splits `par` ways (the family's rules: heads, key/value heads and
/// FFN against tp, at least one layer per stage). Errors name the numbers.
caf::error validate(const decoder_spec& spec, const parallel_config& par);

/// Half-open range of decoder layers held by pipeline stage `pp_rank` (contiguous; the
/// first stages take one extra layer when the count does not divide).
std::pair<int64_t, int64_t> stage_layers(const decoder_spec& spec, int pp, int pp_rank);

/// How a parameter is cut across tensor-parallel ranks (Megatron):
/// dim0 = column-parallel (QKV, fc1, gate/up: output rows and their bias),
/// dim1 = row-parallel (out_proj, fc2, down: input columns; bias added once after the
/// all-reduce; OPT's learned positions, by hidden column),
/// vocab = vocabulary-parallel (token embedding and LM head: rows cut in tp slices of
/// ceil(vocab / tp) rows, the rows past the vocabulary zero padding that no lookup reads
/// and no logit shows), replicated = norms and the biases added after an all-reduce.
enum class split_kind : uint8_t { replicated, dim0, dim1, vocab };

/// Vocabulary rows each tensor-parallel rank holds: ceil(vocab / tp), so that rank r holds
/// ids [r * rows, (r + 1) * rows) and the last rank's rows past the vocabulary are padding.
inline int64_t vocab_rows(int64_t vocab, int tp) {
  return tp > 0 ? (vocab + tp - 1) / tp : vocab;
}

/// How seeded initialisation draws a parameter's values.
enum class init_kind : uint8_t { weight, embedding, norm_weight, bias };

/// One parameter of a shard: its full (unsharded) shape and how this shard cuts it.
struct param_spec {
  std::string name;
  std::vector<int64_t> full_shape;
  split_kind split = split_kind::replicated;
  init_kind init = init_kind::weight;
  /// This shard's shape (full_shape cut by `split`).
  std::vector<int64_t> shard_shape;
  /// Ranks that hold the same slice: 1, or tp / kv_heads for key/value projections when
  /// tp exceeds the key/value heads (each rank holds the one head its queries use).
  int group = 1;
  /// Laid out right after the parameter before it, with no padding (tensor_table::add):
  /// the second and third of q, k, v and the second of gate, up, which the forward reads as
  /// one tensor with the first.
  bool packed = false;
};

/// Index of the slice rank `tp_rank` holds, and how many slices there are.
inline int slice_of(const param_spec& p, int tp_rank) {
  return tp_rank / p.group;
}
inline int slice_count(const param_spec& p, int tp) {
  return tp / p.group;
}

/// The parameters held by `shard`, in buffer order. Stage 0 holds the embeddings; the
/// last stage holds the final norm and the LM head (a copy of the token embedding when
/// tied and not also the first stage). Every tensor-parallel rank holds its slice of the
/// embeddings and the head, so no weight byte sits on two ranks of a stage but norms,
/// biases added after an all-reduce, and key/value heads replicated where tp exceeds them
/// (a tied head's last-stage copy, sliced the same way, repeats the first stage's).
std::vector<param_spec> shard_params(const decoder_spec& spec, const parallel_config& par,
                                     const shard_index& shard);

/// The shard's tensor table in `type` (errors: see validate, a bad shard index).
caf::expected<gpu::tensor_table> shard_layout(const decoder_spec& spec, gpu::dtype type,
                                              const parallel_config& par, const shard_index& shard);

/// The KV block size and the blocks a sequence holds (sched/kv_blocks.hpp: the ledger
/// counts KV in the same blocks).
using sched::kv_block_tokens;
using sched::kv_blocks_for;

/// Key/value heads one tensor-parallel rank caches: its share, or the one head its
/// queries use where tp exceeds the key/value heads (replicated).
int64_t local_kv_heads(const decoder_spec& spec, const parallel_config& par);

/// Bytes of one KV block of `shard`: kv_block_tokens positions of keys and values for
/// every layer of its stage and its local key/value heads, in `type`. What the ledger
/// counts per block on the shard's device beside the weights.
uint64_t kv_block_bytes(const decoder_spec& spec, gpu::dtype type, const parallel_config& par,
                        const shard_index& shard);

/// Bytes of one shard's buffer, computed without allocating.
caf::expected<uint64_t> shard_bytes(const decoder_spec& spec, gpu::dtype type,
                                    const parallel_config& par, const shard_index& shard);

/// Parameters of the whole (unsharded) model.
uint64_t parameter_count(const decoder_spec& spec);

/// Bytes of the checkpoint in `type`: the whole model's parameters, the tied head once.
uint64_t weight_bytes(const decoder_spec& spec, gpu::dtype type);

/// Bytes `shard` held when every rank kept the whole token embedding, LM head and
/// positions (the layout before vocabulary-parallel embeddings), for the swap benchmark's
/// before-and-after comparison; never allocated.
caf::expected<uint64_t> replicated_vocab_shard_bytes(const decoder_spec& spec, gpu::dtype type,
                                                     const parallel_config& par,
                                                     const shard_index& shard);

namespace detail {
/// The families' own layouts and rules (models/opt_family.cpp, models/llama_family.cpp).
/// `add(name, full_shape, split, init, group)` appends one parameter.
struct param_adder {
  const parallel_config& par;
  std::vector<param_spec>& out;
  void operator()(std::string name, std::vector<int64_t> shape, split_kind split, init_kind init,
                  int group = 1, bool packed = false) const;
};
void opt_params(const decoder_spec& spec, const parallel_config& par, const shard_index& shard,
                const param_adder& add);
void llama_params(const decoder_spec& spec, const parallel_config& par, const shard_index& shard,
                  const param_adder& add);
caf::error opt_validate(const decoder_spec& spec, const parallel_config& par);
caf::error llama_validate(const decoder_spec& spec, const parallel_config& par);
}  // namespace detail

}  // namespace computron::models
