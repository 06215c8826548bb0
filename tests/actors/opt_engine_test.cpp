// A model's dtype against the kinds of the devices it is placed on (a fake device list is
// enough, no GPU needed), a batch's head, and where a shard's KV blocks live.
#include <catch2/catch.hpp>

#include <chrono>

#include "actors/opt_engine.hpp"
#include "common/error.hpp"
#include "gpu/collective.hpp"
#include "gpu/emulated_device.hpp"
#include "gpu/weight_store.hpp"
#include "models/decoder_spec.hpp"

using namespace computron;
using namespace computron::actors;
using gpu::device_kind;

namespace {

model_config opt(const std::string& dtype, std::vector<int32_t> devices, int tp = 1, int pp = 1) {
  model_config m;
  m.name = "m";
  m.kind = "opt";
  m.spec = "opt-tiny";
  m.dtype = dtype;
  m.tp = tp;
  m.pp = pp;
  m.devices = std::move(devices);
  return m;
}

}  // namespace

TEST_CASE("f16 is accepted on CUDA placements and refused elsewhere by device kind",
          "[actors][engine]") {
  auto engines = all_engines();
  std::vector<device_kind> cuda2{device_kind::cuda, device_kind::cuda};
  std::vector<device_kind> mixed{device_kind::cuda, device_kind::emulated};
  for (auto d : {"f16", "bf16", "f32"}) {
    INFO(d);
    CHECK_FALSE(validate_model(engines, opt(d, {0, 1}, 2), cuda2));
  }
  CHECK_FALSE(validate_model(engines, opt("bf16", {0, 1}, 2), mixed));
  CHECK_FALSE(validate_model(engines, opt("f16", {0}), mixed));  // placed on the CUDA device only
  auto err = validate_model(engines, opt("f16", {0, 1}, 1, 2), mixed);
  REQUIRE(err);
  CHECK(is(err, ec::invalid_configuration));
  CHECK_THAT(render(err), Catch::Contains("f16 runs only on CUDA devices, and it is placed on "
                                          "emulated devices; use bf16 or f32 there"));
  auto one = validate_model(engines, opt("f16", {1}), mixed);
  CHECK_THAT(render(one), Catch::Contains("placed on emulated devices"));
}

TEST_CASE("dtype auto serves the checkpoint's dtype where the devices run it, else bf16",
          "[actors][engine]") {
  std::vector<device_kind> kinds{device_kind::cuda, device_kind::emulated};
  auto m = opt("auto", {0});
  m.checkpoint_dtype = "f16";
  CHECK(resolve_dtype(m, kinds).dtype == "f16");
  m.devices = {1};
  CHECK(resolve_dtype(m, kinds).dtype == "bf16");
  m.checkpoint_dtype = "f32";
  CHECK(resolve_dtype(m, kinds).dtype == "f32");
  m.checkpoint_dtype.clear();
  CHECK(resolve_dtype(m, kinds).dtype == "bf16");
  // An explicit dtype is never changed.
  CHECK(resolve_dtype(opt("f16", {1}), kinds).dtype == "f16");
  auto engines = all_engines();
  CHECK_FALSE(validate_model(engines, resolve_dtype(m, kinds), kinds));
}

TEST_CASE("an OPT shape outside the catalogue comes from the config", "[actors][engine]") {
  auto engines = all_engines();
  auto m = opt("f32", {0});
  m.spec = "my-opt";
  m.shape = {96, 3, 6, 384, 700, 64};
  std::vector<device_kind> kinds{device_kind::emulated};
  CHECK_FALSE(validate_model(engines, m, kinds));
  auto& e = *engines.at("opt");
  CHECK(e.vocab(m) == 700);
  CHECK(e.max_positions(m) == 64);
  m.shape = {96, 3, 5, 384, 700, 64};  // 96 is not a multiple of 5 heads
  CHECK(validate_model(engines, m, kinds));
  m.shape = {1, 2};
  CHECK_THAT(render(validate_model(engines, m, kinds)), Catch::Contains("shape needs 6 numbers"));
}

TEST_CASE("a batch's head follows its step-0 settings: candidates, or whole rows",
          "[actors][engine][vocab]") {
  auto engines = all_engines();
  auto& e = *engines.at("opt");
  auto m = opt("f32", {0});
  shard_spec s{m, 0, 0, {}};
  auto table = e.layout(s);
  REQUIRE(table);
  gpu::emulated_device_options o;
  o.capacity_bytes = 64ull << 20;
  auto dev = gpu::emulated_device::make(o);
  REQUIRE(dev);
  auto w = gpu::weight_shard::create(*dev, *table);
  REQUIRE(w);
  REQUIRE_FALSE(e.fill(s, **w));
  REQUIRE_FALSE((*w)->load({1ull << 20}));
  REQUIRE_FALSE((*w)->wait_loaded(std::chrono::seconds{30}));
  auto group = gpu::make_solo_collective();
  auto program = e.make_program(s, **w, *group);
  REQUIRE(program);
  auto step0 = [&](uint64_t batch, row_sampling r) {
    step_request q;
    q.model = "m";
    q.batch_id = batch;
    q.prompts = {{2, 100, 37}, {2, 9}};
    q.sampling = {r, r};
    auto out = (*program)->run(q, nullptr);
    REQUIRE(out);
    return out->shape;
  };
  row_sampling greedy;
  CHECK(step0(3, greedy) == std::vector<int64_t>{2, 1, 2});
  row_sampling topk;
  topk.temperature = 0.8;
  topk.top_k = 5;
  CHECK(step0(4, topk) == std::vector<int64_t>{2, 5, 2});
  // The same batch id again (a direct caller's, never ended) with log-probabilities: the
  // whole rows, not the candidates the earlier batch took.
  auto scored = greedy;
  scored.logprobs = 1;
  CHECK(step0(3, scored) == std::vector<int64_t>{2, 512});
  step_request next;
  next.model = "m";
  next.batch_id = 3;
  next.step = 1;
  next.tokens = {5, 6};
  auto out = (*program)->run(next, nullptr);
  REQUIRE(out);
  CHECK(out->shape == std::vector<int64_t>{2, 512});
}

TEST_CASE("a decoder shard's KV blocks come out of its device's memory and go back",
          "[actors][engine][kv]") {
  // The worker's program takes KV chunks from the shard's own device (beside the
  // weights), and a batch that ends gives them back.
  auto engines = all_engines();
  auto& e = *engines.at("opt");
  auto m = opt("f32", {0});
  shard_spec s{m, 0, 0, {}};
  auto table = e.layout(s);
  REQUIRE(table);
  gpu::emulated_device_options o;
  o.capacity_bytes = 64ull << 20;
  auto dev = gpu::emulated_device::make(o);
  REQUIRE(dev);
  auto w = gpu::weight_shard::create(*dev, *table);
  REQUIRE(w);
  REQUIRE_FALSE(e.fill(s, **w));
  REQUIRE_FALSE((*w)->load({1ull << 20}));
  REQUIRE_FALSE((*w)->wait_loaded(std::chrono::seconds{30}));
  auto group = gpu::make_solo_collective();
  auto program = e.make_program(s, **w, *group);
  REQUIRE(program);
  const auto weights = (*dev)->used_bytes();
  auto spec = models::find_spec("opt-tiny");
  REQUIRE(spec);
  const auto block = models::kv_block_bytes(*spec, gpu::dtype::f32, {1, 1}, {0, 0});
  step_request q;
  q.model = "m";
  q.batch_id = 1;
  q.prompts = {{2, 100, 37}, {2, 9}};
  q.sampling = {row_sampling{}, row_sampling{}};
  REQUIRE((*program)->run(q, nullptr));
  // One chunk of the pool's smallest size (16 blocks) holds the two rows' blocks.
  CHECK((*dev)->used_bytes() == weights + 16 * block);
  (*program)->end_batch(1);
  CHECK((*dev)->used_bytes() == weights);
}
