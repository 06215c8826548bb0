#include "tests/support/devices.hpp"

#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "common/random.hpp"
#include "gpu/backends.hpp"
#include "gpu/emulated_device.hpp"

namespace computron::test {

gpu::device_ptr emulated(int index) {
  gpu::emulated_device_options o;
  o.ordinal = index;
  o.capacity_bytes = 256ull << 20;
  o.link_gbps = 4.0;
  auto dev = gpu::emulated_device::make(o);
  REQUIRE(dev);
  return *dev;
}

gpu::device_ptr cuda(int index) {
  gpu::device_options o;
  o.kind = "cuda";
  o.count = index + 1;
  // 1 GiB of pages, not the whole device: the conformance tests size host buffers by the
  // capacity (a whole H200 would need about 135 GiB of host memory), and each open creates
  // and releases every page (2 MiB each).
  o.cuda_capacity_bytes = 1ull << 30;
  auto devs = gpu::open_devices(o);
  if (!devs) FAIL("no CUDA device: " << render(devs.error()));
  return (*devs)[static_cast<size_t>(index)];
}

int available(const device_factory& factory) {
  if (factory.target<gpu::device_ptr (*)(int)>() &&
      *factory.target<gpu::device_ptr (*)(int)>() == &emulated)
    return 2;
  return gpu::cuda_device_count();
}

std::vector<std::byte> random_bytes(uint64_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  fill_random_bytes(out.data(), n, seed);
  return out;
}

}  // namespace computron::test
