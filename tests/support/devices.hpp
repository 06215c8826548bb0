#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "gpu/device.hpp"

/// Device factories for tests that run on every backend (the ggml idea: the same checks
/// on the emulated device and, where a GPU is, on CUDA).
namespace computron::test {

/// Opens device `index` of one backend; fails the test when it cannot.
using device_factory = std::function<gpu::device_ptr(int index)>;

/// Emulated devices with 256 MiB of memory and a 4 GB/s link.
gpu::device_ptr emulated(int index);

/// CUDA device `index`; fails the running test when there is none.
gpu::device_ptr cuda(int index);

/// Number of devices the backend of `factory` can open (2 for emulated).
int available(const device_factory& factory);

/// `n` deterministic random bytes.
std::vector<std::byte> random_bytes(uint64_t n, uint64_t seed);

}  // namespace computron::test

/// Defines one test case per backend from a function taking a device_factory.
#define COMPUTRON_CONFORMANCE(title, fn)                      \
  TEST_CASE(title " (emulated)", "[conformance][emulated]") { \
    fn(computron::test::emulated);                            \
  }                                                           \
  TEST_CASE(title " (cuda)", "[conformance][cuda]") {         \
    fn(computron::test::cuda);                                \
  }
