// Gpu-let streams behind the device interface: a GPU's are green contexts (tagged [cuda]:
// run where a GPU is), an emulated device has none and needs none.
#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "gpu/backends.hpp"
#include "tests/support/devices.hpp"

using namespace computron;

TEST_CASE("an emulated device splits into gpu-lets without streams", "[gpulets]") {
  auto dev = test::emulated(0);
  CHECK_FALSE(dev->check_gpulets());
  auto s = dev->gpulet_stream({50, 50}, 0);
  REQUIRE(s);
  CHECK(*s == nullptr);
}

TEST_CASE("a GPU's gpu-lets are green contexts: side by side, kept, the whole GPU its own",
          "[cuda][gpulets]") {
  auto dev = test::cuda(0);
  auto missing = dev->check_gpulets();
  INFO(render(missing));
  REQUIRE_FALSE(missing);
  auto first = dev->gpulet_stream({50, 50}, 0);
  auto second = dev->gpulet_stream({50, 50}, 1);
  INFO((first ? std::string{} : render(first.error())));
  INFO((second ? std::string{} : render(second.error())));
  REQUIRE(first);
  REQUIRE(second);
  CHECK(*first != nullptr);
  CHECK(*second != nullptr);
  CHECK(*first != *second);
  // The same gpu-let again: the same stream (its green context is kept).
  auto again = dev->gpulet_stream({50, 50}, 0);
  REQUIRE(again);
  CHECK(*again == *first);
  // A 30/70 split: other green contexts.
  auto small = dev->gpulet_stream({30, 70}, 0);
  auto large = dev->gpulet_stream({30, 70}, 1);
  REQUIRE(small);
  REQUIRE(large);
  CHECK(*small != *first);
  CHECK(*large != *small);
  // Three lanes, and a partition that leaves SMs idle.
  for (size_t lane = 0; lane < 3; ++lane) CHECK(dev->gpulet_stream({20, 40, 40}, lane));
  CHECK(dev->gpulet_stream({40}, 0));
  // The whole GPU: its default stream.
  auto whole = dev->gpulet_stream({100}, 0);
  REQUIRE(whole);
  CHECK(*whole == nullptr);
  // Fewer SMs than the smallest green context, shares outside 1..100 or past 100 in all,
  // and a lane the partition lacks: refused.
  auto tiny = dev->gpulet_stream({1, 99}, 0);
  REQUIRE_FALSE(tiny);
  CHECK_THAT(render(tiny.error()), Catch::Contains("SMs"));
  CHECK_FALSE(dev->gpulet_stream({0, 100}, 1));
  CHECK_FALSE(dev->gpulet_stream({60, 60}, 0));
  CHECK_FALSE(dev->gpulet_stream({50, 50}, 2));
}
