#pragma once

// Conversions between the weight store's types and libtorch's. Internal: include it only
// from .cpp files that already pay for torch; public headers stay torch-free.
#include <ATen/core/Tensor.h>
#include <caf/expected.hpp>

#include <exception>
#include <string>

#include "engine/torch/decoder_stage.hpp"
#include "gpu/weight_store.hpp"

namespace computron::models::detail {

/// A tensor over `data` on `options`' device, without asking the driver where `data` lives:
/// at::from_blob would (cudaPointerGetAttributes), and a shard's reserved range has no pages
/// mapped before its first load, which is when the decoder's CUDA graphs are captured.
at::Tensor device_view(void* data, at::IntArrayRef shape, const at::TensorOptions& options);

/// The libtorch scalar type of a stored dtype.
at::ScalarType to_torch(gpu::dtype t);

/// The stored dtype of a libtorch scalar type; `invalid_request` naming `what` for types
/// the weight store has no name for.
caf::expected<gpu::dtype> from_torch(at::ScalarType t, const std::string& what);

/// A host copy of `t` (from any device), contiguous.
caf::expected<host_tensor> to_host(const at::Tensor& t);

/// A tensor on `device` holding `h`'s values (copied). Errors: bytes that disagree with
/// dtype x shape.
caf::expected<at::Tensor> from_host(const host_tensor& h, at::Device device);

/// A failure thrown by libtorch during a forward step, as an error: running out of
/// device memory (the workspace is too small for this batch) is `out_of_device_memory`
/// with a hint, anything else `device_error`; `what` names the step.
caf::error compute_error(const std::string& what, const std::exception& e);

/// Caps libtorch's CUDA caching allocator on `dev`'s GPU to the memory the weights' arena
/// left (the workspace), once per GPU, so compute can never take the weights' memory and
/// an oversized batch fails with an error instead of starving loads. A no-op without a
/// CUDA libtorch.
caf::error cap_cuda_workspace(const gpu::device& dev);

/// Waits until the compute queued on `device` finished (the current CUDA stream there);
/// a no-op on the CPU. Device memory that kernels may still read (a KV chunk) is given
/// back only after it. Never throws: a failure is logged, the caller goes on.
void finish_compute(at::Device device) noexcept;

/// For a kernel of our own on `device`'s GPU: makes it the thread's current CUDA device
/// and returns its current stream (a cudaStream_t), where libtorch's ops queue. nullptr
/// without a CUDA libtorch. Throws libtorch's errors (the caller's step catches them).
void* enter_cuda_device(at::Device device);

/// Whether the calling thread computes on a stream use_compute_stream installed (a
/// gpu-let's green context): a CUDA graph captured on the whole device does not replay
/// into one (decode_graphs.cpp decodes eagerly there).
bool on_external_compute_stream();

}  // namespace computron::models::detail
