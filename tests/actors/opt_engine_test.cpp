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
#include "sched/kv_blocks.hpp"
#include "tests/support/peft_folder.hpp"
#include "tests/support/sharded_model.hpp"

using namespace computron;
using namespace computron::actors;
using gpu::device_kind;

namespace {

/// Block tables that cover each row's positions after the step, as a runner hands them
/// to its backend (the tests call the backend directly).
std::vector<std::vector<uint32_t>> tables_for(const engine::step_input& in) {
  std::vector<std::vector<uint32_t>> tables;
  uint32_t next = 0;
  for (auto& r : in.plan.rows) {
    tables.emplace_back();
    for (auto b = sched::kv_blocks_for(r.computed + r.scheduled); b-- > 0;)
      tables.back().push_back(next++);
  }
  return tables;
}

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

/// One f32 OPT shard on an emulated device, loaded, and the kind's backend over it.
struct loaded_opt {
  engine_registry engines = all_engines();
  shard_spec s{opt("f32", {0}), 0, 0, {}};
  gpu::device_ptr dev;
  std::unique_ptr<gpu::weight_shard> w;
  std::unique_ptr<gpu::collective> group = gpu::make_solo_collective();
  caf::expected<std::unique_ptr<backend>> program{nullptr};

  loaded_opt() {
    auto& e = *engines.at("opt");
    auto table = e.layout(s);
    REQUIRE(table);
    gpu::emulated_device_options o;
    o.capacity_bytes = 64ull << 20;
    auto made = gpu::emulated_device::make(o);
    REQUIRE(made);
    dev = *made;
    auto shard = gpu::weight_shard::create(dev, *table);
    REQUIRE(shard);
    w = std::move(*shard);
    REQUIRE_FALSE(e.fill(s, *w));
    REQUIRE_FALSE(w->load({1ull << 20}));
    REQUIRE_FALSE(w->wait_loaded(std::chrono::seconds{30}));
    program = e.make_backend(s, *w, *group);
    REQUIRE(program);
  }
};

TEST_CASE("a batch's head follows its step-0 settings: candidates, or whole rows",
          "[actors][engine][vocab]") {
  loaded_opt f;
  auto& program = f.program;
  auto step0 = [&](uint64_t batch, row_sampling r) {
    auto q = engine::prefill_step(batch, {{2, 100, 37}, {2, 9}}, {r, r});
    auto out = (*program)->run(q, {}, tables_for(q), nullptr);
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
  auto next = engine::prefill_step(3, {{2, 100, 37}, {2, 9}}, {});
  engine::next_decode_step(next, {5, 6});
  auto out = (*program)->run(next, {}, tables_for(next), nullptr);
  REQUIRE(out);
  CHECK(out->shape == std::vector<int64_t>{2, 512});  // A step whose tables do not cover its rows
                                                      // is refused: the runner's tables and the
  // pool's blocks must agree.
  auto bare = engine::prefill_step(9, {{2, 100, 37}, {2, 9}}, {greedy, greedy});
  auto refused = (*program)->run(bare, {}, {{0}}, nullptr);
  REQUIRE_FALSE(refused);
  CHECK_THAT(render(refused.error()), Catch::Contains("the step's tables 1"));
}

TEST_CASE("a chunked step 0 answers nothing until its last chunk, then what one step answers",
          "[actors][engine][chunked]") {
  loaded_opt f;
  auto& program = f.program;
  const std::vector<std::vector<int64_t>> prompts = {{2, 100, 37, 5, 400, 12, 9}, {2, 9}};
  auto request = [&](uint64_t batch, int32_t step) {
    auto q = engine::prefill_step(batch, prompts, {});
    if (step > 0) engine::next_decode_step(q, {});
    return q;
  };
  // The one-step prefill: greedy rows take one candidate each.
  auto one = request(1, 0);
  one.sampling = {row_sampling{}, row_sampling{}};
  auto want = (*program)->run(one, {}, tables_for(one), nullptr);
  REQUIRE(want);
  REQUIRE(want->shape == std::vector<int64_t>{2, 1, 2});
  // Chunks of 3 (7 tokens: 1, 3 and 3 of the long prompt); only the first carries the
  // settings, and the head it chose holds to the last.
  for (int32_t left : {6, 3, 0}) {
    INFO("left " << left);
    auto q = request(2, 0);
    q.plan.chunk = 3;
    q.plan.left = left;
    if (left == 6) q.sampling = {row_sampling{}, row_sampling{}};
    auto out = (*program)->run(q, {}, tables_for(q), nullptr);
    INFO((out ? std::string{} : render(out.error())));
    REQUIRE(out);
    if (left > 0) {
      CHECK(out->shape.empty());
      CHECK(out->bytes.empty());
      continue;
    }
    REQUIRE(out->shape == want->shape);
    auto got = out->to_floats(), ref = want->to_floats();
    for (size_t r = 0; r < 2; ++r) {
      CHECK(got[2 * r + 1] == ref[2 * r + 1]);  // the same id
      CHECK(got[2 * r] == Approx(ref[2 * r]).epsilon(1e-5));
    }
  }
  // The chunked batch decodes on as the one-step batch does.
  auto next = request(2, 1);
  next.tokens = {5, 6};
  auto d = (*program)->run(next, {}, tables_for(next), nullptr);
  REQUIRE(d);
  next.plan.batch = 1;
  auto d_one = (*program)->run(next, {}, tables_for(next), nullptr);
  REQUIRE(d_one);
  CHECK(d->shape == d_one->shape);
  CHECK(d->to_floats()[1] == d_one->to_floats()[1]);
  // Prompt log-probabilities need the whole prompt in one step.
  auto scored = request(3, 0);
  scored.plan.chunk = 3;
  scored.plan.left = 6;
  row_sampling logprobs;
  logprobs.prompt_logprobs = 1;
  scored.sampling = {logprobs, row_sampling{}};
  auto refused = (*program)->run(scored, {}, tables_for(scored), nullptr);
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::invalid_request));
  // A chunk its batch's cache does not match is an error, and the batch ends (the
  // worker's rule for a failed step): its next step finds no cache.
  auto stale = request(2, 0);
  stale.plan.chunk = 3;
  stale.plan.left = 3;
  CHECK_FALSE((*program)->run(stale, {}, tables_for(stale), nullptr));
  next.plan.batch = 2;
  CHECK_FALSE((*program)->run(next, {}, tables_for(next), nullptr));
}

TEST_CASE("a decoder shard's KV blocks come out of its device's memory and go back",
          "[actors][engine][kv]") {
  // The worker's backend takes KV chunks from the shard's own device (beside the
  // weights), and a batch that ends gives them back.
  loaded_opt f;
  auto& program = f.program;
  const auto weights = f.dev->used_bytes();
  auto spec = models::find_spec("opt-tiny");
  REQUIRE(spec);
  const auto block = models::kv_block_bytes(*spec, gpu::dtype::f32, {1, 1}, {0, 0});
  auto q = engine::prefill_step(1, {{2, 100, 37}, {2, 9}}, {row_sampling{}, row_sampling{}});
  REQUIRE((*program)->run(q, {}, tables_for(q), nullptr));
  // One chunk of the pool's smallest size (16 blocks), in whole pages of the device,
  // holds the two rows' blocks; the backend reports what its pool holds.
  CHECK(f.dev->used_bytes() == weights + f.dev->pages_of(16 * block));
  CHECK((*program)->kv_device_bytes() == f.dev->pages_of(16 * block));
  (*program)->end_batch(1);
  CHECK(f.dev->used_bytes() == weights);
  CHECK((*program)->kv_device_bytes() == 0);
}

namespace {

/// A LoRA adapter of loaded_opt's model ("m", opt-tiny in f32) as the engine lays it out
/// and fills it from a PEFT folder, loaded on the same device.
struct loaded_adapter {
  test::peft_folder folder;
  shard_spec s;
  std::shared_ptr<gpu::weight_shard> w;

  loaded_adapter(loaded_opt& f, const std::string& name, int64_t r, double alpha) {
    auto spec = models::find_spec("opt-tiny");
    REQUIRE(spec);
    folder = test::make_folder(*spec, r, alpha, {"q_proj", "v_proj", "fc2"});
    folder.write();
    s = f.s;
    s.model.name = name;
    s.model.base = "m";
    s.model.weights_path = folder.dir->path();
    auto& e = *f.engines.at("opt");
    CHECK(e.kv_block_bytes(s) == 0);  // its rows' KV is the base's
    auto table = e.layout(s);
    REQUIRE(table);
    auto shard = gpu::weight_shard::create(f.dev, *table);
    REQUIRE(shard);
    w = std::move(*shard);
    REQUIRE_FALSE(e.fill(s, *w));
    REQUIRE_FALSE(w->load({1ull << 20}));
    REQUIRE_FALSE(w->wait_loaded(std::chrono::seconds{30}));
  }
};

/// Step 0 of `prompts` with each row's adapter; every row's whole logits.
caf::expected<std::vector<float>> prefill_logits(backend& p, uint64_t batch,
                                                 std::vector<std::vector<int64_t>> prompts,
                                                 std::vector<std::string> adapters) {
  row_sampling whole;
  whole.logprobs = 1;  // whole rows, not candidates
  std::vector<row_sampling> sampling(prompts.size(), whole);
  auto q = engine::prefill_step(batch, std::move(prompts), std::move(sampling));
  q.adapters = std::move(adapters);
  auto out = p.run(q, {}, tables_for(q), nullptr);
  if (!out) return out.error();
  return out->to_floats();
}

}  // namespace

TEST_CASE("a decoder shard runs each row with its own LoRA adapter", "[actors][engine][adapters]") {
  loaded_opt f;
  auto& program = **f.program;
  loaded_adapter a{f, "a", 4, 8};
  loaded_adapter b{f, "b", 2, 4};
  REQUIRE_FALSE(program.bind_adapter("a", a.w));
  REQUIRE_FALSE(program.bind_adapter("a", a.w));  // the same shard again: nothing to do
  REQUIRE_FALSE(program.bind_adapter("b", b.w));
  const std::vector<int64_t> p{2, 100, 37, 5};
  auto base = prefill_logits(program, 1, {p}, {});
  auto with_a = prefill_logits(program, 2, {p}, {"a"});
  auto mixed = prefill_logits(program, 3, {p, p, p}, {"b", "", "a"});
  REQUIRE(base);
  REQUIRE(with_a);
  REQUIRE(mixed);
  const size_t vocab = base->size();
  REQUIRE(mixed->size() == 3 * vocab);
  std::vector<float> row_b(mixed->begin(), mixed->begin() + vocab);
  std::vector<float> row_base(mixed->begin() + vocab, mixed->begin() + 2 * vocab);
  std::vector<float> row_a(mixed->begin() + 2 * vocab, mixed->end());
  // The adapter changes its rows, and only its rows: a base row of a mixed batch is the
  // base's, an adapter's row the adapter's alone.
  CHECK(test::relative_error(*with_a, *base) > 1e-3);
  CHECK(test::relative_error(row_base, *base) < 1e-5);
  CHECK(test::relative_error(row_a, *with_a) < 1e-5);
  CHECK(test::relative_error(row_b, *base) > 1e-3);
  CHECK(test::relative_error(row_b, *with_a) > 1e-3);
  for (auto batch : {1, 2, 3}) program.end_batch(static_cast<uint64_t>(batch));
  // A row naming an adapter the shard was not given, or a list of the wrong length.
  auto unknown = prefill_logits(program, 4, {p}, {"c"});
  REQUIRE_FALSE(unknown);
  CHECK(is(unknown.error(), ec::invalid_request));
  CHECK_THAT(render(unknown.error()), Catch::Contains("adapter c is not bound"));
  auto short_list = prefill_logits(program, 5, {p, p}, {"a"});
  REQUIRE_FALSE(short_list);
  CHECK(is(short_list.error(), ec::invalid_request));
  // Unbound while a batch of it runs: its next step fails, naming the adapter's id, and
  // reads nothing of the adapter's memory.
  REQUIRE(prefill_logits(program, 6, {p}, {"a"}));
  program.unbind_adapter("a");
  auto next = engine::prefill_step(6, {p}, {});
  engine::next_decode_step(next, {5});
  auto after = program.run(next, {}, tables_for(next), nullptr);
  REQUIRE_FALSE(after);
  CHECK(is(after.error(), ec::invalid_request));
  // Bound again under the name with other weights (a new registration): a new id.
  loaded_adapter a2{f, "a", 4, 16};
  REQUIRE_FALSE(program.bind_adapter("a", a2.w));
  auto with_a2 = prefill_logits(program, 7, {p}, {"a"});
  REQUIRE(with_a2);
  CHECK(test::relative_error(*with_a2, *with_a) > 1e-3);
}

TEST_CASE("an adapter folder that does not fit its base is refused naming the adapter",
          "[actors][engine][adapters]") {
  loaded_opt f;
  auto other = models::find_spec("opt-mini");
  REQUIRE(other);
  auto folder = test::make_folder(*other, 4, 8);
  folder.write();
  auto s = f.s;
  s.model.name = "wrong";
  s.model.base = "m";
  s.model.weights_path = folder.dir->path();
  auto table = f.engines.at("opt")->layout(s);
  REQUIRE_FALSE(table);
  CHECK(is(table.error(), ec::invalid_configuration));
  CHECK_THAT(render(table.error()), Catch::Contains("adapter wrong"));
}
