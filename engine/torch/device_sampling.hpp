#pragma once

// Sampling where the logits lie (the GPU on CUDA): greedy, temperature, top_k, top_p and
// min_p with each row's own seeded number, so that only token ids leave the device.
// Internal: include it only from the .cpp files that already pay for torch.
#include <ATen/core/Tensor.h>

#include <vector>

#include "models/sampling.hpp"

namespace computron::models::detail {

/// One token per row of `logits` [n, vocab] (f32, f16 or bf16, on any device), drawn on
/// that device with row i's `draws[i]` (sampler::next_device_draw), as [n, 1, 2] f32
/// (logit, id) pairs on the same device: the one candidate that the row's host sampler
/// then draws from, which advances its stream exactly as drawing from the whole row would.
/// The steps are the host sampler's (models/sampling.cpp), in the same order and in double:
/// a stable sort (equal logits: lower id first), temperature, top_k, min_p (a prefix of the
/// sorted row), top_p over what is kept, then the first candidate whose running sum passes
/// uniform x total. Greedy rows take the first maximum. A row of -inf gives its first id and
/// uses no number, as the host's does. Differences from the host: the order of additions
/// (a device sums in parallel; the host subtracts one probability at a time), so that a
/// number within a rounding error of a boundary between two tokens may pick the other one;
/// and NaN logits (a broken model's), which rank as -inf here while the host's sort has no
/// defined order for them. Rows are drawn in groups of at most about 2M logits, so that the
/// working tensors (double precision, as the host's) stay near 64 MB.
at::Tensor draw_on_device(const at::Tensor& logits, const std::vector<device_draw>& draws);

}  // namespace computron::models::detail
