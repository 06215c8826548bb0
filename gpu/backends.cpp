// The one place where the CUDA backend is switched on: only this file sees
// COMPUTRON_WITH_CUDA, and nothing else includes gpu/cuda/.
#include "gpu/backends.hpp"

#include "gpu/collective.hpp"

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/emulated_device.hpp"

#ifdef COMPUTRON_WITH_CUDA
#include "gpu/cuda/cuda_device.hpp"
#include "gpu/cuda/nccl_collective.hpp"
#endif

namespace computron::gpu {

namespace {

#ifdef COMPUTRON_WITH_CUDA
constexpr bool with_cuda = true;
#else
constexpr bool with_cuda = false;
#endif

caf::expected<int> probe_cuda() {
#ifdef COMPUTRON_WITH_CUDA
  return cuda::device_count();
#else
  return make_error(ec::unavailable, "this build has no CUDA backend (nvcc was not found)");
#endif
}

caf::expected<std::vector<device_ptr>> open_cuda(const device_options& opts, int available) {
  std::vector<device_ptr> out;
#ifdef COMPUTRON_WITH_CUDA
  int n = opts.count == 0 ? available : opts.count;
  if (n > available)
    return make_error(ec::invalid_configuration,
                      fmt::format("{} CUDA devices requested, {} present", n, available));
  log::info("using {} CUDA device(s): {}", n, cuda::version_string());
  for (int i = 0; i < n; ++i) {
    auto dev = cuda::open(i, opts.cuda_reserved_bytes, opts.cuda_capacity_bytes);
    if (!dev) return std::move(dev.error());
    log::info("{}: {:.1f} GiB usable", (*dev)->info().name,
              static_cast<double>((*dev)->capacity_bytes()) / (1ull << 30));
    out.push_back(std::move(*dev));
  }
#endif
  return out;
}

caf::expected<std::vector<device_ptr>> open_emulated(const device_options& opts) {
  std::vector<device_ptr> out;
  int n = opts.count == 0 ? 1 : opts.count;
  for (int i = 0; i < n; ++i) {
    emulated_device_options eo;
    eo.ordinal = i;
    eo.capacity_bytes = opts.emulated_capacity_bytes;
    eo.link_gbps = opts.emulated_link_gbps;
    eo.prefault = opts.emulated_prefault;
    auto dev = emulated_device::make(eo);
    if (!dev) return std::move(dev.error());
    out.push_back(std::move(*dev));
  }
  return out;
}

}  // namespace

bool cuda_compiled() {
  return with_cuda;
}

int cuda_device_count() {
  auto n = probe_cuda();
  return n ? *n : 0;
}

caf::expected<std::vector<device_ptr>> open_devices(const device_options& opts) {
  if (opts.count < 0 || opts.count > 1024)
    return make_error(ec::invalid_configuration,
                      fmt::format("device count must be in [0, 1024], got {}", opts.count));
  if (opts.kind == "emulated") return open_emulated(opts);
  if (opts.kind != "auto" && opts.kind != "cuda")
    return make_error(ec::invalid_configuration,
                      fmt::format("unknown device kind '{}' (auto, emulated, cuda)", opts.kind));
  auto n = probe_cuda();
  if (n && *n > 0) return open_cuda(opts, *n);
  auto why = n ? std::string{"no GPU present"} : render(n.error());
  if (opts.kind == "cuda")
    return make_error(ec::unavailable, fmt::format("CUDA devices requested: {}", why));
  log::info("no usable CUDA device ({}): using {} emulated device(s) at {} GB/s", why,
            opts.count == 0 ? 1 : opts.count, opts.emulated_link_gbps);
  return open_emulated(opts);
}

caf::expected<std::string> nccl_unique_id() {
#ifdef COMPUTRON_WITH_CUDA
  return cuda::nccl_unique_id();
#else
  return make_error(ec::unavailable, "this build has no CUDA backend: no NCCL");
#endif
}

caf::expected<std::unique_ptr<collective>> make_nccl_collective(const std::string& unique_id,
                                                                int rank, int size, int device) {
#ifdef COMPUTRON_WITH_CUDA
  return cuda::make_nccl_collective(unique_id, rank, size, device);
#else
  return make_error(ec::unavailable, "this build has no CUDA backend: no NCCL");
#endif
}

}  // namespace computron::gpu
