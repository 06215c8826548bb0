#pragma once

// Conversions between the weight store's types and libtorch's. Internal: include it only
// from .cpp files that already pay for torch; public headers stay torch-free.
#include <ATen/core/Tensor.h>
#include <caf/expected.hpp>

#include "gpu/weight_store.hpp"
#include "models/opt_model.hpp"

namespace computron::models::detail {

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

}  // namespace computron::models::detail
