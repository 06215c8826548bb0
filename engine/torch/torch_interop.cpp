#include "engine/torch/torch_interop.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/error.hpp"
#include "common/log.hpp"

#ifdef COMPUTRON_TORCH_CUDA
#include <mutex>
#include <set>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace computron::models::detail {

at::Tensor device_view(void* data, at::IntArrayRef shape, const at::TensorOptions& options) {
  return at::for_blob(data, shape).options(options).target_device(options.device()).make_tensor();
}

caf::error compute_error(const std::string& what, const std::exception& e) {
  std::string msg = e.what();
  if (msg.find("out of memory") != std::string::npos)
    return make_error(ec::out_of_device_memory,
                      fmt::format("{} ran out of device memory for activations (a smaller batch or "
                                  "a larger devices.reserved_mb workspace helps): {}",
                                  what, msg.substr(0, msg.find('\n'))));
  return make_error(ec::device_error, fmt::format("{} failed: {}", what, msg));
}

caf::error cap_cuda_workspace(const gpu::device& dev) {
#ifdef COMPUTRON_TORCH_CUDA
  static std::mutex mtx;
  static std::set<int> capped;
  std::lock_guard<std::mutex> guard{mtx};
  auto ordinal = dev.info().ordinal;
  if (!capped.insert(ordinal).second) return {};
  try {
    // The caching allocator sets itself up at its first allocation; the cap needs it.
    (void)at::empty({1},
                    at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(ordinal)));
    auto total = static_cast<double>(at::cuda::getDeviceProperties(ordinal)->totalGlobalMem);
    auto fraction = 1.0 - static_cast<double>(dev.capacity_bytes()) / total;
    fraction = std::clamp(fraction, 0.01, 1.0);
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                       static_cast<c10::DeviceIndex>(ordinal));
    log::info("{}: libtorch's allocator capped at {:.1f} GiB (weights arena {:.1f} GiB)",
              dev.info().name, fraction * total / (1ull << 30),
              static_cast<double>(dev.capacity_bytes()) / (1ull << 30));
  } catch (const std::exception& e) {
    // The cap is a safety net, not a condition for serving: say so and go on.
    log::warn("{}: libtorch's allocator not capped to the workspace: {}", dev.info().name,
              std::string{e.what()}.substr(0, 200));
  }
#else
  (void)dev;
#endif
  return {};
}

}  // namespace computron::models::detail

namespace computron::models {

namespace {
/// Whether this thread's compute runs on a stream use_compute_stream installed (a
/// gpu-let's green context, or a plain stream of the pool) rather than the default one.
thread_local bool external_stream = false;
}  // namespace

bool detail::on_external_compute_stream() {
  return external_stream;
}

caf::error use_compute_stream(const gpu::device& dev, void* stream) {
  if (dev.info().kind != gpu::device_kind::cuda) return {};
#ifdef COMPUTRON_TORCH_CUDA
  try {
    auto index = static_cast<c10::DeviceIndex>(dev.info().ordinal);
    external_stream = stream != nullptr;
    // The current stream is per thread: the lane's thread keeps it for its next steps.
    c10::cuda::setCurrentCUDAStream(
        stream == nullptr
            ? c10::cuda::getDefaultCUDAStream(index)
            : c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), index));
  } catch (const std::exception& e) {
    return make_error(ec::device_error, fmt::format("compute stream on {}: {}", dev.info().name,
                                                    std::string{e.what()}.substr(0, 200)));
  }
  return {};
#else
  // The default stream is all a build without CUDA libtorch has.
  if (stream == nullptr) return {};
  return make_error(ec::device_error,
                    "compute streams on " + dev.info().name + " need a CUDA libtorch");
#endif
}

caf::expected<void*> plain_compute_stream(const gpu::device& dev) {
  if (dev.info().kind != gpu::device_kind::cuda) return nullptr;
#ifdef COMPUTRON_TORCH_CUDA
  try {
    auto s = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(dev.info().ordinal));
    return static_cast<void*>(s.stream());
  } catch (const std::exception& e) {
    return make_error(ec::device_error, fmt::format("a stream on {}: {}", dev.info().name,
                                                    std::string{e.what()}.substr(0, 200)));
  }
#else
  return make_error(ec::device_error, "streams on " + dev.info().name + " need a CUDA libtorch");
#endif
}

}  // namespace computron::models

namespace computron::models::detail {

void finish_compute(at::Device device) noexcept {
#ifdef COMPUTRON_TORCH_CUDA
  if (!device.is_cuda()) return;
  try {
    c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
  } catch (const std::exception& e) {
    log::warn("waiting for the compute on {}: {}", device.str(),
              std::string{e.what()}.substr(0, 200));
  }
#else
  (void)device;
#endif
}

void* enter_cuda_device(at::Device device) {
#ifdef COMPUTRON_TORCH_CUDA
  c10::cuda::set_device(device.index());
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(device.index()).stream());
#else
  (void)device;
  return nullptr;
#endif
}

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
