#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <caf/error.hpp>

#include "gpu/weight_store.hpp"
#include "models/decoder_spec.hpp"

/// Filling a shard's host buffer: deterministic seeded values (no downloads anywhere) or
/// the tensors of a safetensors checkpoint, cut to the shard.
namespace computron::models {

class checkpoint;

/// Threads that fill a shard's host copy (seeded values, checkpoint slices); 0, the
/// default, uses every core. Values never depend on it.
void set_fill_threads(int threads);
int fill_threads();

/// Value of element `index` (row-major, in the unsharded tensor) of parameter `name`:
/// a function of (seed, name, index) alone, so shard k of TP=n holds exactly slice k
/// of the unsharded weights whatever the split.
float seeded_value(uint64_t seed, const std::string& name, uint64_t index, init_kind kind);

/// Index in the unsharded tensor of element `local` of this rank's slice (past the
/// tensor's end for a vocabulary slice's padding rows, which are zeros).
uint64_t global_index(const param_spec& p, int tp, int tp_rank, uint64_t local);

/// Writes seeded values for every parameter of `shard` into `host`, laid out by `table`
/// (from shard_layout with the same arguments). Equal to seeded_value element by element,
/// computed in parallel over fill_threads() (several GB/s per core for bf16).
caf::error fill_seeded(const opt_spec& spec, const parallel_config& par, const shard_index& shard,
                       const gpu::tensor_table& table, std::byte* host, uint64_t seed);

/// Copies this shard's slice of every parameter out of a full (unsharded) checkpoint,
/// straight from the mapped files into `host`, converting f32/bf16/f16 to the table's
/// dtype where they differ; in parallel over fill_threads(). Errors: a missing tensor, a
/// non-float dtype or a wrong shape (each named).
caf::error fill_from_checkpoint(const opt_spec& spec, const parallel_config& par,
                                const shard_index& shard, const gpu::tensor_table& table,
                                std::byte* host, const checkpoint& file);

/// IEEE float to bf16 / fp16 bits, round to nearest even (NaN stays NaN).
uint16_t to_bf16(float x);
uint16_t to_f16(float x);
float from_bf16(uint16_t bits);
float from_f16(uint16_t bits);

}  // namespace computron::models
