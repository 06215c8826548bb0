#pragma once

#include <memory>
#include <vector>

#include "gpu/device.hpp"

/// The CUDA backend. Only gpu/backends.cpp includes this header, and only when the build
/// found nvcc (COMPUTRON_WITH_CUDA): the one place where CUDA is switched on.
namespace computron::gpu::cuda {

/// Number of usable CUDA devices; an error (with the driver's message) when the driver
/// or the GPUs are missing, which the caller takes as "use emulated devices".
caf::expected<int> device_count();

/// "CUDA runtime 13.0, NCCL 2.28.9" for the start-up log line.
std::string version_string();

/// Opens GPU `ordinal`: a dedicated non-blocking copy stream, and the weights' memory
/// reserved at once (free memory at open minus `reserved_bytes`, the activation workspace
/// and the CUDA context's own needs; at most `capacity_bytes` when that is not 0), which
/// loads and evictions then sub-allocate without calling cudaMalloc or cudaFree.
caf::expected<device_ptr> open(int ordinal, uint64_t reserved_bytes, uint64_t capacity_bytes = 0);

}  // namespace computron::gpu::cuda
