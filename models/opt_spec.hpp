#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>

#include "gpu/weight_store.hpp"

/// OPT-family shapes, how they split over tensor x pipeline parallel ranks, and the
/// parameter layout of every shard. Torch-free: sizes are known without allocating.
namespace computron::models {

/// The shape of an OPT decoder.
struct opt_spec {
  std::string name;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t ffn = 0;
  int64_t vocab = 50272;
  int64_t max_positions = 2048;
};

/// The catalogue: opt-125m ... opt-175b, plus tiny shapes for tests (opt-tiny, opt-mini).
const std::vector<opt_spec>& catalogue();

/// A catalogue entry by name; `unknown_model` with the known names otherwise.
caf::expected<opt_spec> find_spec(std::string_view name);

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

/// Checks that `spec` splits `par` ways: heads, hidden and FFN divisible by tp, at least
/// one layer per stage.
caf::error validate(const opt_spec& spec, const parallel_config& par);

/// Half-open range of decoder layers held by pipeline stage `pp_rank` (contiguous; the
/// first stages take one extra layer when the count does not divide).
std::pair<int64_t, int64_t> stage_layers(const opt_spec& spec, int pp, int pp_rank);

/// How a parameter is cut across tensor-parallel ranks (Megatron):
/// dim0 = column-parallel (QKV, fc1: output rows and their bias),
/// dim1 = row-parallel (out_proj, fc2: input columns; bias added once after all-reduce),
/// replicated = embeddings, LM head (tied to the token embedding), layer norms.
enum class split_kind : uint8_t { replicated, dim0, dim1 };

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
};

/// The parameters held by `shard`, in buffer order. Stage 0 holds the embeddings; the
/// last stage holds the final norm and the token embedding again for the tied LM head.
std::vector<param_spec> shard_params(const opt_spec& spec, const parallel_config& par,
                                     const shard_index& shard);

/// The shard's tensor table in `type` (errors: see validate, a bad shard index).
caf::expected<gpu::tensor_table> shard_layout(const opt_spec& spec, gpu::dtype type,
                                              const parallel_config& par, const shard_index& shard);

/// Bytes of one shard's buffer, computed without allocating.
caf::expected<uint64_t> shard_bytes(const opt_spec& spec, gpu::dtype type,
                                    const parallel_config& par, const shard_index& shard);

/// Parameters of the whole (unsharded) model.
uint64_t parameter_count(const opt_spec& spec);

}  // namespace computron::models
