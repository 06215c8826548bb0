#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "gpu/backends.hpp"

using namespace computron;

TEST_CASE("emulated devices are opened as asked", "[backends]") {
  gpu::device_options o;
  o.kind = "emulated";
  o.count = 3;
  o.emulated_capacity_bytes = 64ull << 20;
  o.emulated_link_gbps = 1.5;
  auto devs = gpu::open_devices(o);
  REQUIRE(devs);
  REQUIRE(devs->size() == 3);
  for (int i = 0; i < 3; ++i) {
    auto& info = (*devs)[static_cast<size_t>(i)]->info();
    CHECK(info.kind == gpu::device_kind::emulated);
    CHECK(info.ordinal == i);
    CHECK(info.name == "emulated:" + std::to_string(i));
    CHECK(info.capacity_bytes == (64ull << 20));
    CHECK(info.link_gbps == 1.5);
  }
}

TEST_CASE("auto picks emulated devices when no GPU is usable", "[backends]") {
  if (gpu::cuda_device_count() > 0) {
    WARN("a GPU is present: auto picks CUDA, covered by the [cuda] tests");
    return;
  }
  gpu::device_options o;
  o.count = 2;
  auto devs = gpu::open_devices(o);
  REQUIRE(devs);
  CHECK(devs->size() == 2);
  CHECK((*devs)[0]->info().kind == gpu::device_kind::emulated);
  o.kind = "cuda";
  auto cuda = gpu::open_devices(o);
  REQUIRE_FALSE(cuda);
  CHECK(is(cuda.error(), ec::unavailable));
  CHECK_THAT(render(cuda.error()), Catch::Contains("CUDA devices requested"));
}

TEST_CASE("bad device options get clear errors", "[backends]") {
  gpu::device_options o;
  o.kind = "tpu";
  auto bad = gpu::open_devices(o);
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), ec::invalid_configuration));
  CHECK_THAT(render(bad.error()), Catch::Contains("unknown device kind 'tpu'"));
  o.kind = "emulated";
  o.count = -1;
  CHECK(is(gpu::open_devices(o).error(), ec::invalid_configuration));
  o.count = 1;
  o.emulated_link_gbps = 0;
  CHECK(is(gpu::open_devices(o).error(), ec::invalid_configuration));
}
