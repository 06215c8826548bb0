#include <catch2/catch.hpp>

#include <cstring>

#include "common/error.hpp"
#include "gpu/weight_store.hpp"
#include "tests/support/devices.hpp"

using namespace computron;
using gpu::dtype;
using gpu::tensor_table;

TEST_CASE("a tensor table packs tensors in order on aligned offsets", "[weight_store]") {
  tensor_table t;
  REQUIRE_FALSE(t.add("embed", dtype::bf16, {10, 3}));  // 60 bytes
  REQUIRE_FALSE(t.add("bias", dtype::f32, {5}));        // 20 bytes
  REQUIRE_FALSE(t.add("scalar", dtype::i64, {}));       // a 0-d tensor: 8 bytes
  REQUIRE(t.entries().size() == 3);
  CHECK(t.entries()[0].offset_bytes == 0);
  CHECK(t.entries()[0].size_bytes == 60);
  CHECK(t.entries()[1].offset_bytes == 256);
  CHECK(t.entries()[1].size_bytes == 20);
  CHECK(t.entries()[2].offset_bytes == 512);
  CHECK(t.total_bytes() == 520);
  REQUIRE(t.find("bias") != nullptr);
  CHECK(t.find("bias")->shape == std::vector<int64_t>{5});
  CHECK(t.find("nope") == nullptr);
}

TEST_CASE("a tensor table refuses bad tensors with clear errors", "[weight_store]") {
  tensor_table t;
  REQUIRE_FALSE(t.add("w", dtype::f32, {4}));
  auto dup = t.add("w", dtype::f32, {4});
  CHECK(is(dup, ec::invalid_request));
  CHECK_THAT(render(dup), Catch::Contains("duplicate tensor 'w'"));
  CHECK(is(t.add("", dtype::f32, {1}), ec::invalid_request));
  auto neg = t.add("n", dtype::f32, {3, -1});
  CHECK_THAT(render(neg), Catch::Contains("negative dimension"));
  CHECK(is(t.add("huge", dtype::f32, {1ll << 40, 1ll << 40}), ec::invalid_request));
  CHECK(t.entries().size() == 1);  // nothing refused was added
  CHECK(t.total_bytes() == 16);
}

TEST_CASE("dtypes and residency states have names", "[weight_store]") {
  CHECK(std::string{to_string(dtype::bf16)} == "bf16");
  CHECK(gpu::size_of(dtype::bf16) == 2);
  CHECK(gpu::size_of(dtype::i64) == 8);
  CHECK(std::string{to_string(gpu::residency::evicting)} == "evicting");
}

TEST_CASE("a weight shard needs bytes and a device", "[weight_store]") {
  auto empty = gpu::weight_shard::create(test::emulated(0), tensor_table{});
  REQUIRE_FALSE(empty);
  CHECK(is(empty.error(), ec::invalid_request));
  tensor_table zero_sized;
  REQUIRE_FALSE(zero_sized.add("z", dtype::f32, {0}));
  CHECK_FALSE(gpu::weight_shard::create(test::emulated(0), std::move(zero_sized)));
  tensor_table t;
  REQUIRE_FALSE(t.add("w", dtype::f32, {1}));
  CHECK_FALSE(gpu::weight_shard::create(nullptr, std::move(t)));
}

TEST_CASE("tensors are found in the host buffer and on the device at their offsets",
          "[weight_store]") {
  tensor_table t;
  REQUIRE_FALSE(t.add("a", dtype::f32, {100}));
  REQUIRE_FALSE(t.add("b", dtype::i32, {7}));
  auto shard = gpu::weight_shard::create(test::emulated(0), std::move(t));
  REQUIRE(shard);
  auto& s = **shard;
  CHECK(s.host_tensor("a") == s.host_data());
  CHECK(s.host_tensor("b") == s.host_data() + 512);
  CHECK(s.host_tensor("c") == nullptr);
  int32_t values[7] = {1, 2, 3, 4, 5, 6, 7};
  std::memcpy(s.host_tensor("b"), values, sizeof(values));
  CHECK_FALSE(s.device_data());  // offloaded: no device address
  REQUIRE_FALSE(s.load());
  REQUIRE_FALSE(s.wait_loaded(std::chrono::seconds{10}));
  int32_t back[7] = {};
  REQUIRE_FALSE(s.read_back(s.table().find("b")->offset_bytes, back, sizeof(back)));
  CHECK(std::memcmp(back, values, sizeof(values)) == 0);
}
