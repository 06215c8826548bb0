#include <catch2/catch.hpp>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "engine/torch/torchscript_model.hpp"
#include "gpu/emulated_device.hpp"
#include "models/weights.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::models;
using computron::test::temp_path;
using namespace std::chrono_literals;

namespace {

gpu::device_ptr device() {
  auto d = gpu::emulated_device::make({});
  REQUIRE(d);
  return *d;
}

host_tensor floats(std::vector<int64_t> shape, const std::vector<float>& v) {
  host_tensor h{gpu::dtype::f32, std::move(shape), std::vector<std::byte>(v.size() * 4)};
  std::memcpy(h.bytes.data(), v.data(), h.bytes.size());
  return h;
}

}  // namespace

TEST_CASE("a TorchScript module runs from the weight store and swaps like a shard",
          "[models][torchscript]") {
  auto path = temp_path("demo.pt");
  REQUIRE_FALSE(write_demo_torchscript(path, 4, 3, 5));
  auto model = torchscript_model::load(path, device());
  REQUIRE(model);
  auto& m = **model;
  CHECK(m.weights().table().find("fc.weight") != nullptr);
  CHECK(m.weights().table().find("scale") != nullptr);
  std::vector<float> x = {1, -2, 0.5f, 3, 0, 1, 1, -1};
  auto input = floats({2, 4}, x);
  // Not loaded yet: a clear error, not a forward over stale memory.
  auto early = m.forward({input});
  REQUIRE_FALSE(early);
  CHECK(is(early.error(), ec::not_resident));
  REQUIRE_FALSE(m.weights().load());
  REQUIRE_FALSE(m.weights().wait_loaded(10s));
  auto y = m.forward({input});
  REQUIRE(y);
  REQUIRE(y->shape == std::vector<int64_t>{2, 3});
  // The expected values, computed by hand from the same seeded weights.
  auto got = y->to_floats();
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 3; ++o) {
      float acc = seeded_value(5, "fc.bias", static_cast<uint64_t>(o), init_kind::bias);
      for (int i = 0; i < 4; ++i)
        acc += x[static_cast<size_t>(r * 4 + i)] *
               seeded_value(5, "fc.weight", static_cast<uint64_t>(o * 4 + i), init_kind::weight);
      CHECK(got[static_cast<size_t>(r * 3 + o)] == Approx(std::max(acc, 0.0f) * 2).margin(1e-6));
    }
  // Zero-copy: the module reads the shard's device copy.
  auto base = m.weights().device_data();
  REQUIRE(base);
  CHECK(*m.parameter_address("fc.weight") ==
        *base + m.weights().table().find("fc.weight")->offset_bytes);
  // Evict, reload: the same bits.
  REQUIRE_FALSE(m.weights().evict());
  CHECK(is(m.forward({input}).error(), ec::not_resident));
  REQUIRE_FALSE(m.weights().load());
  REQUIRE_FALSE(m.weights().wait_loaded(10s));
  auto again = m.forward({input});
  REQUIRE(again);
  CHECK(again->bytes == y->bytes);
  // Inputs the module rejects get its message, and the model keeps working.
  auto wrong = m.forward({floats({2, 5}, std::vector<float>(10, 1.0f))});
  REQUIRE_FALSE(wrong);
  CHECK_THAT(render(wrong.error()), Catch::Contains("TorchScript forward failed"));
  CHECK(m.forward({input}));
  std::filesystem::remove(path);
}

TEST_CASE("a missing or corrupt TorchScript file gets a clear error", "[models][torchscript]") {
  auto missing = torchscript_model::load(temp_path("nope.pt"), device());
  REQUIRE_FALSE(missing);
  CHECK_THAT(render(missing.error()), Catch::Contains("cannot load TorchScript module"));
  auto path = temp_path("garbage.pt");
  std::ofstream(path) << "not a zip archive at all";
  auto garbage = torchscript_model::load(path, device());
  REQUIRE_FALSE(garbage);
  CHECK(is(garbage.error(), ec::invalid_request));
  std::filesystem::remove(path);
}
