#include "models/torch_interop.hpp"

#include <cstring>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/error.hpp"

namespace computron::models::detail {

at::ScalarType to_torch(gpu::dtype t) {
  switch (t) {
    case gpu::dtype::f32:
      return at::kFloat;
    case gpu::dtype::bf16:
      return at::kBFloat16;
    case gpu::dtype::f16:
      return at::kHalf;
    case gpu::dtype::i64:
      return at::kLong;
    case gpu::dtype::i32:
      return at::kInt;
    case gpu::dtype::i8:
      return at::kChar;
    case gpu::dtype::u8:
      return at::kByte;
  }
  return at::kFloat;
}

caf::expected<gpu::dtype> from_torch(at::ScalarType t, const std::string& what) {
  switch (t) {
    case at::kFloat:
      return gpu::dtype::f32;
    case at::kBFloat16:
      return gpu::dtype::bf16;
    case at::kHalf:
      return gpu::dtype::f16;
    case at::kLong:
      return gpu::dtype::i64;
    case at::kInt:
      return gpu::dtype::i32;
    case at::kChar:
      return gpu::dtype::i8;
    case at::kByte:
      return gpu::dtype::u8;
    default:
      return make_error(ec::invalid_request,
                        fmt::format("{} has dtype {}, which the weight store cannot hold", what,
                                    c10::toString(t)));
  }
}

caf::expected<host_tensor> to_host(const at::Tensor& t) {
  auto type = from_torch(t.scalar_type(), "the result");
  if (!type) return std::move(type.error());
  auto c = t.to(at::kCPU).contiguous();
  host_tensor h;
  h.type = *type;
  h.shape.assign(c.sizes().begin(), c.sizes().end());
  h.bytes.resize(static_cast<size_t>(c.nbytes()));
  std::memcpy(h.bytes.data(), c.data_ptr(), h.bytes.size());
  return h;
}

caf::expected<at::Tensor> from_host(const host_tensor& h, at::Device device) {
  uint64_t n = 1;
  for (auto d : h.shape) {
    if (d < 0) return make_error(ec::invalid_request, "a tensor dimension is negative");
    n *= static_cast<uint64_t>(d);
  }
  if (n * gpu::size_of(h.type) != h.bytes.size())
    return make_error(ec::invalid_request,
                      fmt::format("{} bytes given for a {} tensor of {} elements", h.bytes.size(),
                                  gpu::to_string(h.type), n));
  auto cpu = at::from_blob(const_cast<std::byte*>(h.bytes.data()), h.shape,
                           at::TensorOptions().dtype(to_torch(h.type)));
  return cpu.to(device, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace computron::models::detail
