#pragma once

#include "gpu/collective.hpp"

/// NCCL all-reduce for tensor-parallel groups of GPUs. Included by gpu/backends.cpp only.
namespace computron::gpu::cuda {

caf::expected<std::string> nccl_unique_id();
caf::expected<std::unique_ptr<collective>> make_nccl_collective(const std::string& unique_id,
                                                                int rank, int size, int device);

}  // namespace computron::gpu::cuda
