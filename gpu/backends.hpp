#pragma once

#include <string>
#include <vector>

#include "gpu/device.hpp"

namespace computron::gpu {

/// How to pick and set up this process's devices.
struct device_options {
  /// "auto" (CUDA when a GPU is usable, emulated otherwise), "emulated" or "cuda".
  std::string kind = "auto";
  /// How many devices: emulated devices to create, or the first N GPUs (0 = all GPUs;
  /// for emulated devices 0 means 1).
  int count = 0;
  /// Emulated: "device memory" per device.
  uint64_t emulated_capacity_bytes = 4ull << 30;
  /// Emulated: link rate per device, GB/s.
  double emulated_link_gbps = 2.0;
  /// Emulated: touch each device's memory at start (emulated_device_options::prefault).
  bool emulated_prefault = false;
  /// CUDA: bytes left outside the weights arena on each GPU for the CUDA context,
  /// activations and KV caches (OPT-1.3B in f16 at batch 32 x 128 tokens needs more than
  /// 1 GiB: measured on an H100).
  uint64_t cuda_reserved_bytes = 4ull << 30;
  /// CUDA: at most this many bytes of each GPU for weights (0: all but the reserve), to
  /// share a GPU or to run "only some models fit" experiments on a large one.
  uint64_t cuda_capacity_bytes = 0;
};

/// True when this build contains the CUDA backend.
bool cuda_compiled();

/// Usable GPUs: 0 without the CUDA backend, a driver or a GPU.
int cuda_device_count();

/// Opens the devices `opts` asks for. With kind "auto" and no usable GPU it logs one line
/// saying so and opens emulated devices. Errors: a bad kind or count, "cuda" without a
/// GPU or without the backend compiled in, a device that fails to open.
caf::expected<std::vector<device_ptr>> open_devices(const device_options& opts);

}  // namespace computron::gpu
