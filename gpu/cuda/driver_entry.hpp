#pragma once

// Driver calls through the runtime rather than linked, so that no binary depends on
// libcuda.so.1 (CI's machines have no driver). CUDA-only: include from gpu/cuda/ only.
#include <algorithm>
#include <string>

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace computron::gpu::cuda {

/// The ABI version to ask the driver for: the build's CUDA, or the driver's where that is
/// older (a newer toolkit than the driver asks for versions the driver does not know); 0
/// when the runtime finds no driver.
inline int driver_abi_version() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return std::min(CUDA_VERSION, driver);
}

/// Looks up driver call `name` at ABI `version` into `fn`: empty on success, else why not.
template <class F>
std::string driver_entry(const char* name, F& fn, int version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  auto status = cudaGetDriverEntryPointByVersion(name, &p, static_cast<unsigned>(version),
                                                 cudaEnableDefault, &found);
  if (status == cudaSuccess && found == cudaDriverEntryPointSuccess && p != nullptr) {
    fn = reinterpret_cast<F>(p);
    return {};
  }
  cudaGetLastError();
  return found == cudaDriverEntryPointVersionNotSufficent
             ? "the driver is older than the CUDA this build needs"
         : found == cudaDriverEntryPointSymbolNotFound ? "the driver has no such call"
         : status != cudaSuccess                       ? cudaGetErrorString(status)
                                                       : "not found";
}

}  // namespace computron::gpu::cuda
