#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend.hpp"
#include "gpu/collective.hpp"
#include "gpu/weight_store.hpp"

/// The toy backend: one byte blob per shard, a few integer operations per stage and a real
/// all-reduce across tensor-parallel ranks. The output depends on the bytes on the device,
/// so a shard that was not loaded (or loaded wrong) answers differently. Vocabulary 1024;
/// for tests and overhead benchmarks (the "toy" model kind, actors/engine.hpp).
namespace computron::engine {

inline constexpr int64_t toy_vocab = 1024;

/// The toy's stage is this many equal layers: layer i waits for the first (i+1)/n of the
/// shard's bytes, then computes 1/n of the stage's compute time, so compute overlaps a
/// load as the decoder's per-layer waits do.
inline constexpr int toy_layers_per_stage = 8;

/// What a toy shard is: its model's name (errors), its pipeline stage of `stages`, and the
/// model's compute time per step over all its stages.
struct toy_shard {
  std::string model;
  int32_t stage = 0;
  int32_t stages = 1;
  double compute_ms = 0;
};

/// The backend over the shard's weights and its tensor-parallel group; both outlive it.
std::unique_ptr<backend> make_toy_backend(toy_shard s, gpu::weight_shard& w, gpu::collective& g);

}  // namespace computron::engine
