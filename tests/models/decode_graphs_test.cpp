// Decode graphs (compute_options::graph_max_batch): a decode step run through a bucket's
// fixed buffers (the block table of the pool's slots, the chunk table, splits by reach,
// padding rows) equals the eager step. On the CPU the step runs eagerly over the buffers a
// CUDA graph replays; the [cuda] case captures real graphs, before the weights are loaded,
// and replays them after an eviction and a reload.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "models/weights.hpp"
#include "tests/support/devices.hpp"
#include "tests/support/sharded_model.hpp"

using namespace computron;
using namespace computron::models;
using namespace std::chrono_literals;

namespace {

/// Chunks of one block at first, so that the pool's chunks come and go (and take new
/// slots) while the rows grow: the graph reads them through the chunk table.
kv_pool_options one_block_chunks() {
  kv_pool_options kv;
  kv.min_chunk_blocks = 1;
  return kv;
}

/// One whole model on `dev`: its shard (loaded unless `load` is false), group and stage.
struct single {
  std::unique_ptr<gpu::weight_shard> shard;
  std::unique_ptr<gpu::collective> group;
  std::unique_ptr<decoder_stage> stage;

  single(const decoder_spec& spec, gpu::dtype type, gpu::device_ptr dev, compute_options compute,
         bool load = true, kv_pool_options kv = one_block_chunks()) {
    auto table = shard_layout(spec, type, {1, 1}, {0, 0});
    REQUIRE(table);
    auto s = gpu::weight_shard::create(std::move(dev), *table);
    REQUIRE(s);
    shard = std::move(*s);
    REQUIRE_FALSE(fill_seeded(spec, {1, 1}, {0, 0}, shard->table(), shard->host_data(), 11));
    if (load) reload();
    group = gpu::make_solo_collective();
    auto st = decoder_stage::create(spec, {1, 1}, {0, 0}, *shard, *group, kv, compute);
    REQUIRE(st);
    stage = std::move(*st);
  }

  void reload() {
    REQUIRE_FALSE(shard->load());
    REQUIRE_FALSE(shard->wait_loaded(60s));
  }
};

/// Each row's most likely token: what both stages are fed next, so that they compute the
/// same positions.
std::vector<int64_t> greedy(const host_tensor& logits) {
  auto v = logits.to_floats();
  const auto vocab = logits.shape.back();
  std::vector<int64_t> out;
  for (int64_t r = 0; r < logits.shape.front(); ++r) {
    auto row = v.begin() + r * vocab;
    out.push_back(std::max_element(row, row + vocab) - row);
  }
  return out;
}

/// Runs `steps` decode steps on both stages from their caches, feeding the eager stage's
/// greedy tokens to both, and checks every step's logits against each other.
void decode_both(single& graphs, kv_cache& gc, single& eager, kv_cache& ec,
                 std::vector<int64_t>& next, int steps, double bound, const std::string& what) {
  for (int k = 0; k < steps; ++k) {
    auto a = eager.stage->decode(next, nullptr, ec);
    REQUIRE(a);
    auto b = graphs.stage->decode(next, nullptr, gc);
    INFO(what << " step " << k << (b ? "" : ": " + render(b.error())));
    REQUIRE(b);
    auto e = test::relative_error(b->to_floats(), a->to_floats());
    INFO(what << " step " << k << ": " << e);
    CHECK(e <= bound);
    next = greedy(*a);
  }
  CHECK(gc.lengths() == ec.lengths());
}

const std::vector<std::vector<int64_t>> prompts = {
    {3, 9, 27},
    {5, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7},
    {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2}};

}  // namespace

TEST_CASE("a decode step through a graph bucket's buffers equals the eager step",
          "[graphs][decoder]") {
  for (auto name : {"llama-tiny", "opt-tiny"}) {
    for (auto type : {gpu::dtype::f32, gpu::dtype::bf16}) {
      const auto spec = *find_spec(name);
      const std::string what = std::string{name} + " " + gpu::to_string(type);
      compute_options with;
      with.graph_max_batch = 4;
      single graphs{spec, type, test::emulated(0), with};
      single eager{spec, type, test::emulated(1), {}};
      REQUIRE_FALSE(graphs.stage->capture_graphs());
      auto g = graphs.stage->graphs();
      INFO(what << ": " << g.off_because);
      REQUIRE(g.off_because.empty());
      CHECK(g.buckets == std::vector<int32_t>{1, 2, 4});
      CHECK(eager.stage->graphs().buckets.empty());

      kv_cache gc, ec;
      auto a = eager.stage->prefill(prompts, nullptr, ec);
      auto b = graphs.stage->prefill(prompts, nullptr, gc);
      REQUIRE(a);
      REQUIRE(b);
      auto next = greedy(*a);
      // The same arithmetic over the same blocks, row by row; the products see a padded
      // batch (4 rows for 3), which BLAS may block otherwise.
      const double bound = type == gpu::dtype::f32 ? 1e-5 : 2e-2;
      // Past two block boundaries (16 positions each) for every row, and through the
      // pool's growth by one-block chunks.
      decode_both(graphs, gc, eager, ec, next, 36, bound, what + " 3 rows");
      CHECK(graphs.stage->graphs().replays == 36);
      CHECK(graphs.stage->graphs().eager_steps == 0);
      CHECK(graphs.stage->kv_blocks().chunks > 1);

      // Rows leave (continuous batching): the 2-row bucket, a row's blocks given back.
      REQUIRE_FALSE(gc.keep_rows({2, 0}));
      REQUIRE_FALSE(ec.keep_rows({2, 0}));
      next = {next[2], next[0]};
      decode_both(graphs, gc, eager, ec, next, 5, bound, what + " 2 rows");
      CHECK(graphs.stage->graphs().replays == 41);

      // Rows join: five rows are more than the largest bucket, and run eagerly.
      kv_cache gj, ej;
      std::vector<std::vector<int64_t>> more = {{4, 4}, {8, 1, 3}, {2}};
      auto aj = eager.stage->prefill(more, nullptr, ej);
      REQUIRE(aj);
      REQUIRE(graphs.stage->prefill(more, nullptr, gj));
      REQUIRE_FALSE(gc.append(std::move(gj)));
      REQUIRE_FALSE(ec.append(std::move(ej)));
      auto joined = greedy(*aj);
      next.insert(next.end(), joined.begin(), joined.end());
      decode_both(graphs, gc, eager, ec, next, 3, bound, what + " 5 rows");
      CHECK(graphs.stage->graphs().replays == 41);
      CHECK(graphs.stage->graphs().eager_steps == 3);

      // Back within a bucket after a reload of the weights (their addresses are kept).
      REQUIRE_FALSE(gc.keep_rows({0, 1, 2, 3}));
      REQUIRE_FALSE(ec.keep_rows({0, 1, 2, 3}));
      next.resize(4);
      REQUIRE_FALSE(graphs.shard->evict());
      graphs.reload();
      decode_both(graphs, gc, eager, ec, next, 4, bound, what + " after a reload");
      CHECK(graphs.stage->graphs().replays == 45);
      CHECK(graphs.stage->graphs().off_because.empty());
    }
  }
}

TEST_CASE("decode graphs stay off where a step cannot run through them, and decode goes on",
          "[graphs][decoder]") {
  const auto spec = *find_spec("llama-tiny");
  SECTION("without the fused rotary and KV write") {
    compute_options c;
    c.graph_max_batch = 8;
    c.fused_rope = false;
    single m{spec, gpu::dtype::f32, test::emulated(0), c};
    REQUIRE_FALSE(m.stage->capture_graphs());
    auto g = m.stage->graphs();
    CHECK(g.buckets.empty());
    CHECK(g.off_because.find("rotary") != std::string::npos);
    kv_cache cache;
    REQUIRE(m.stage->prefill(prompts, nullptr, cache));
    REQUIRE(m.stage->decode({1, 2, 3}, nullptr, cache));
    CHECK(m.stage->graphs().replays == 0);
  }
  SECTION("not captured yet: every step eagerly") {
    compute_options c;
    c.graph_max_batch = 8;
    single m{spec, gpu::dtype::f32, test::emulated(0), c};
    kv_cache cache;
    REQUIRE(m.stage->prefill(prompts, nullptr, cache));
    REQUIRE(m.stage->decode({1, 2, 3}, nullptr, cache));
    CHECK(m.stage->graphs().replays == 0);
    REQUIRE_FALSE(m.stage->capture_graphs());
    REQUIRE(m.stage->decode({1, 2, 3}, nullptr, cache));
    CHECK(m.stage->graphs().replays == 1);
  }
  SECTION("a graph's step without KV blocks fails and leaves the cache as it was") {
    compute_options c;
    c.graph_max_batch = 8;
    // Two chunks, then the device is full.
    auto calls = std::make_shared<int>(0);
    auto kv = one_block_chunks();
    kv.allocate = [calls](uint64_t bytes) -> caf::expected<kv_memory> {
      if (++*calls > 2) return make_error(ec::out_of_device_memory, "full");
      std::shared_ptr<void> mem{std::calloc(1, bytes), std::free};
      return kv_memory{mem.get(), mem};
    };
    single m{spec, gpu::dtype::f32, test::emulated(0), c, true, kv};
    REQUIRE_FALSE(m.stage->capture_graphs());
    kv_cache cache;
    REQUIRE(m.stage->prefill(prompts, nullptr, cache));
    caf::expected<host_tensor> step = host_tensor{};
    std::vector<int64_t> before;
    for (int k = 0; k < 64 && step; ++k) {
      before = cache.lengths();
      step = m.stage->decode({1, 2, 3}, nullptr, cache);
    }
    REQUIRE_FALSE(step);
    CHECK(step.error() == ec::out_of_device_memory);
    CHECK(cache.lengths() == before);
    auto g = m.stage->graphs();
    CHECK(g.replays > 0);
    CHECK(g.off_because.empty());
    // The rows that fit go on through the graph once one leaves.
    REQUIRE_FALSE(cache.keep_rows({0}));
    auto replays = g.replays;
    REQUIRE(m.stage->decode({4}, nullptr, cache));
    CHECK(m.stage->graphs().replays == replays + 1);
  }
}

TEST_CASE(
    "a pool whose chunks pass the graph's chunk table decodes eagerly, with the same "
    "tokens",
    "[graphs][decoder]") {
  const auto spec = *find_spec("llama-tiny");
  compute_options with;
  with.graph_max_batch = 8;
  single graphs{spec, gpu::dtype::f32, test::emulated(0), with};
  single eager{spec, gpu::dtype::f32, test::emulated(1), {}};
  // No spare: every chunk is exactly what a step needs, so rows that cross a block
  // boundary at different steps each take a chunk of their own.
  graphs.stage->set_kv_spare(0);
  REQUIRE_FALSE(graphs.stage->capture_graphs());
  std::vector<std::vector<int64_t>> rows;
  for (int64_t r = 0; r < 8; ++r) rows.push_back(std::vector<int64_t>(56 + r, 3 + r));
  kv_cache gc, ec;
  auto a = eager.stage->prefill(rows, nullptr, ec);
  REQUIRE(a);
  REQUIRE(graphs.stage->prefill(rows, nullptr, gc));
  auto next = greedy(*a);
  decode_both(graphs, gc, eager, ec, next, 64, 1e-5, "8 rows");
  auto g = graphs.stage->graphs();
  CHECK(graphs.stage->kv_blocks().chunks > 32);
  CHECK(g.replays > 0);
  CHECK(g.eager_steps > 0);
  CHECK(g.replays + g.eager_steps == 64);
  CHECK(g.off_because.empty());
}

TEST_CASE("a later pipeline stage's graph steps take the previous stage's states",
          "[graphs][decoder]") {
  // Two stages of llama-tiny (a layer each), with graphs and without.
  const auto spec = *find_spec("llama-tiny");
  struct pipeline {
    std::vector<std::unique_ptr<gpu::weight_shard>> shards;
    std::vector<std::unique_ptr<gpu::collective>> groups;
    std::vector<std::unique_ptr<decoder_stage>> stages;
    std::vector<kv_cache> caches = std::vector<kv_cache>(2);

    explicit pipeline(const decoder_spec& spec, compute_options compute) {
      for (int32_t p = 0; p < 2; ++p) {
        auto table = shard_layout(spec, gpu::dtype::f32, {1, 2}, {0, p});
        REQUIRE(table);
        auto s = gpu::weight_shard::create(test::emulated(p), *table);
        REQUIRE(s);
        REQUIRE_FALSE(fill_seeded(spec, {1, 2}, {0, p}, (*s)->table(), (*s)->host_data(), 11));
        REQUIRE_FALSE((*s)->load());
        REQUIRE_FALSE((*s)->wait_loaded(60s));
        shards.push_back(std::move(*s));
        groups.push_back(gpu::make_solo_collective());
        auto st = decoder_stage::create(spec, {1, 2}, {0, p}, *shards.back(), *groups.back(),
                                        one_block_chunks(), compute);
        REQUIRE(st);
        stages.push_back(std::move(*st));
        REQUIRE_FALSE(stages.back()->capture_graphs());
      }
    }
    host_tensor step(const std::vector<int64_t>* tokens) {
      auto h = tokens == nullptr ? stages[0]->prefill(prompts, nullptr, caches[0])
                                 : stages[0]->decode(*tokens, nullptr, caches[0]);
      REQUIRE(h);
      auto out = tokens == nullptr ? stages[1]->prefill(prompts, &*h, caches[1])
                                   : stages[1]->decode(*tokens, &*h, caches[1]);
      REQUIRE(out);
      return *out;
    }
  };
  compute_options with;
  with.graph_max_batch = 4;
  pipeline graphs{spec, with}, eager{spec, {}};
  auto next = greedy(eager.step(nullptr));
  graphs.step(nullptr);
  for (int k = 0; k < 20; ++k) {
    auto a = eager.step(&next);
    auto b = graphs.step(&next);
    INFO("step " << k);
    CHECK(test::relative_error(b.to_floats(), a.to_floats()) <= 1e-5);
    next = greedy(a);
  }
  for (auto& s : graphs.stages) CHECK(s->graphs().replays == 20);
}

TEST_CASE(
    "CUDA graphs captured before the weights are loaded replay the eager decode step, also "
    "after an eviction and a reload",
    "[cuda][graphs]") {
  auto dev = test::cuda(0);
  for (auto name : {"llama-tiny", "opt-tiny"}) {
    for (auto type : {gpu::dtype::f16, gpu::dtype::bf16}) {
      const auto spec = *find_spec(name);
      const std::string what = std::string{name} + " " + gpu::to_string(type);
      compute_options with;
      with.graph_max_batch = 4;
      // Captured at "registration": nothing on the device yet, so nothing may run.
      single graphs{spec, type, dev, with, /*load=*/false};
      REQUIRE_FALSE(graphs.stage->capture_graphs());
      auto g = graphs.stage->graphs();
      INFO(what << ": " << g.off_because);
      REQUIRE(g.off_because.empty());
      REQUIRE(g.buckets == std::vector<int32_t>{1, 2, 4});
      graphs.reload();
      single eager{spec, type, dev, {}};

      kv_cache gc, ec;
      auto a = eager.stage->prefill(prompts, nullptr, ec);
      REQUIRE(a);
      REQUIRE(graphs.stage->prefill(prompts, nullptr, gc));
      auto next = greedy(*a);
      // One graph for the whole step against the same kernels launched one by one; the
      // split-K count differs (the bucket's against the step's), which moves a rounding.
      const double bound = type == gpu::dtype::f16 ? 5e-3 : 3e-2;
      decode_both(graphs, gc, eager, ec, next, 36, bound, what);
      CHECK(graphs.stage->graphs().replays == 36);

      REQUIRE_FALSE(graphs.shard->evict());
      graphs.reload();
      REQUIRE_FALSE(gc.keep_rows({1, 2}));
      REQUIRE_FALSE(ec.keep_rows({1, 2}));
      next = {next[1], next[2]};
      decode_both(graphs, gc, eager, ec, next, 8, bound, what + " after a reload");
      CHECK(graphs.stage->graphs().replays == 44);
      CHECK(graphs.stage->graphs().off_because.empty());

      // On a gpu-let's lane (a green context) the step runs eagerly: a graph captured on
      // the whole device is not replayed into it.
      if (!dev->check_gpulets()) {
        auto lane = dev->gpulet_stream({50, 50}, 0);
        REQUIRE(lane);
        REQUIRE_FALSE(use_compute_stream(*dev, *lane));
        decode_both(graphs, gc, eager, ec, next, 2, bound, what + " on a gpu-let");
        REQUIRE_FALSE(use_compute_stream(*dev, nullptr));
        CHECK(graphs.stage->graphs().replays == 44);
        CHECK(graphs.stage->graphs().eager_steps == 2);
      }
    }
  }
}
