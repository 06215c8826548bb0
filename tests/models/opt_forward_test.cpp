// The OPT forward pass over the weight store: sharded equals unsharded, decode with the
// cache equals recomputation, weights are never copied. Tensor-parallel ranks run in
// threads and talk through real Gloo on 127.0.0.1.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "engine/torch/gloo_collective.hpp"
#include "gpu/emulated_device.hpp"
#include "models/weights.hpp"
#include "tests/support/sharded_model.hpp"

using namespace computron;
using namespace computron::models;
using computron::test::relative_error;
using namespace std::chrono_literals;

namespace computron::models {
// Bitwise equality, for the checks that demand it (found by ADL from the helpers below).
bool operator==(const host_tensor& a, const host_tensor& b) {
  return a.type == b.type && a.shape == b.shape && a.bytes == b.bytes;
}
}  // namespace computron::models

namespace {

const std::vector<std::vector<int64_t>> prompts = {{2, 100, 37, 5, 400, 12}, {2, 7, 300}, {2, 9}};

using test::emulated_device;

/// A catalogue model with seeded weights (the shared fixture by name).
struct sharded_model : test::sharded_model {
  sharded_model(const std::string& name, gpu::dtype type, parallel_config p, uint64_t seed = 1,
                bool load = true)
      : test::sharded_model(*find_spec(name), type, p, test::seeded_filler(*find_spec(name), seed),
                            load) {}
};

host_tensor logits_of(sharded_model& m) {
  return m.on_all_ranks([](std::vector<decoder_stage*> c) { return prefill_logits(c, prompts); });
}

}  // namespace

TEST_CASE("a sharded forward equals the unsharded one in fp32", "[models][forward][tp][pp]") {
  sharded_model full{"opt-tiny", gpu::dtype::f32, {1, 1}};
  auto want = logits_of(full);
  REQUIRE(want.shape == std::vector<int64_t>{3, 512});
  auto want_f = want.to_floats();
  for (auto par : {parallel_config{2, 1}, parallel_config{4, 1}, parallel_config{1, 2},
                   parallel_config{2, 2}}) {
    DYNAMIC_SECTION("tp=" << par.tp << " pp=" << par.pp) {
      sharded_model m{"opt-tiny", gpu::dtype::f32, par};
      auto got = logits_of(m);
      REQUIRE(got.shape == want.shape);
      CHECK(relative_error(got.to_floats(), want_f) <= 1e-5);
    }
  }
}

TEST_CASE("a vocabulary tp does not divide splits with padding and equals the unsharded model",
          "[models][forward][tp][vocab]") {
  // 509 ids (prime): every rank's slice of the embedding and head holds 255 or 128 rows,
  // the last rank's padding zero; the logits keep exactly the vocabulary.
  auto spec = *find_spec("opt-tiny");
  spec.vocab = 509;
  const std::vector<std::vector<int64_t>> odd = {{2, 100, 37, 508, 400, 12}, {2, 507, 300}, {2, 9}};
  auto run = [&](parallel_config par) {
    test::sharded_model m{spec, gpu::dtype::f32, par, test::seeded_filler(spec, 3)};
    auto logits =
        m.on_all_ranks([&](std::vector<decoder_stage*> c) { return prefill_logits(c, odd); });
    generate_options g;
    g.max_tokens = 6;
    auto tokens =
        m.on_all_ranks([&](std::vector<decoder_stage*> c) { return generate(c, odd, g); });
    return std::pair{logits, tokens};
  };
  auto [want, want_tokens] = run({1, 1});
  REQUIRE(want.shape == std::vector<int64_t>{3, 509});
  for (auto par : {parallel_config{2, 1}, parallel_config{4, 1}, parallel_config{2, 2},
                   parallel_config{4, 2}}) {
    DYNAMIC_SECTION("tp=" << par.tp << " pp=" << par.pp) {
      auto [got, tokens] = run(par);
      REQUIRE(got.shape == want.shape);
      CHECK(relative_error(got.to_floats(), want.to_floats()) <= 1e-5);
      CHECK(tokens == want_tokens);
    }
  }
}

TEST_CASE("the candidates head gives the best ids of the gathered logits at every split",
          "[models][forward][tp][vocab]") {
  // Batches that need only each row's k most likely ids take them from the last stage:
  // each rank's k best of its slice, then the k best of those. They must be what a stable
  // sort of the whole row's logits puts first (logits equal, ids equal, ties to the lower
  // id), at the prefill and every decode step, with a vocabulary tp does not divide.
  auto spec = *find_spec("opt-tiny");
  spec.vocab = 509;
  const std::vector<std::vector<int64_t>> odd = {{2, 100, 37, 508, 400, 12}, {2, 507, 300}, {2, 9}};
  for (int64_t k : {1, 7}) {
    for (auto par : {parallel_config{1, 1}, parallel_config{2, 1}, parallel_config{4, 1},
                     parallel_config{2, 2}}) {
      DYNAMIC_SECTION("k=" << k << " tp=" << par.tp << " pp=" << par.pp) {
        test::sharded_model m{spec, gpu::dtype::bf16, par, test::seeded_filler(spec, 5)};
        auto steps = m.on_all_ranks(
            [&](std::vector<decoder_stage*> c) -> caf::expected<std::vector<std::vector<int64_t>>> {
              // Two caches per stage: the same batch through both heads, step by step.
              std::vector<kv_cache> by_logits(c.size()), by_top(c.size());
              std::vector<std::vector<int64_t>> out;
              std::vector<int64_t> next;
              const head_output top{k};
              for (int step = 0; step < 5; ++step) {
                host_tensor a, b;
                for (size_t s = 0; s < c.size(); ++s) {
                  auto* ha = s == 0 ? nullptr : &a;
                  auto* hb = s == 0 ? nullptr : &b;
                  auto ra = step == 0 ? c[s]->prefill(odd, ha, by_logits[s])
                                      : c[s]->decode(next, ha, by_logits[s]);
                  auto rb = step == 0 ? c[s]->prefill(odd, hb, by_top[s], {}, top)
                                      : c[s]->decode(next, hb, by_top[s], top);
                  if (!ra) return std::move(ra.error());
                  if (!rb) return std::move(rb.error());
                  a = std::move(*ra);
                  b = std::move(*rb);
                }
                if (b.type != gpu::dtype::f32 || b.shape != std::vector<int64_t>{3, k, 2})
                  return make_error(ec::invalid_state, "the candidates head did not return 3 x k");
                auto f = a.to_floats();
                auto pairs = b.to_floats();
                for (int64_t r = 0; r < 3; ++r) {
                  std::vector<int64_t> order(509);
                  std::iota(order.begin(), order.end(), 0);
                  auto* row = f.data() + r * 509;
                  std::stable_sort(order.begin(), order.end(),
                                   [&](int64_t x, int64_t y) { return row[x] > row[y]; });
                  for (int64_t c2 = 0; c2 < k; ++c2) {
                    auto value = pairs[static_cast<size_t>((r * k + c2) * 2)];
                    auto id =
                        static_cast<int64_t>(pairs[static_cast<size_t>((r * k + c2) * 2 + 1)]);
                    if (id != order[static_cast<size_t>(c2)] || value != row[id])
                      return make_error(ec::invalid_state, "row " + std::to_string(r) +
                                                               " candidate " + std::to_string(c2) +
                                                               " differs");
                  }
                }
                std::vector<int64_t> ids;
                for (int64_t r = 0; r < 3; ++r)
                  ids.push_back(static_cast<int64_t>(pairs[static_cast<size_t>(r * k * 2 + 1)]));
                out.push_back(ids);
                next = ids;
              }
              return out;
            });
        CHECK(steps.size() == 5);
      }
    }
  }
}

TEST_CASE("a sharded forward is close to the unsharded one in bf16", "[models][forward][tp]") {
  // bf16 keeps 8 bits of mantissa; the TP all-reduce sums partial products in f32 and
  // rounds once, the unsharded matmul rounds differently: documented bound 3e-2.
  sharded_model full{"opt-tiny", gpu::dtype::bf16, {1, 1}};
  sharded_model tp2{"opt-tiny", gpu::dtype::bf16, {2, 2}};
  auto err = relative_error(logits_of(tp2).to_floats(), logits_of(full).to_floats());
  CHECK(err <= 3e-2);
  // And bf16 is close to fp32 as a whole.
  sharded_model f32{"opt-tiny", gpu::dtype::f32, {1, 1}};
  CHECK(relative_error(logits_of(full).to_floats(), logits_of(f32).to_floats()) <= 5e-2);
}

TEST_CASE("load, forward, evict, load, forward gives bitwise identical logits",
          "[models][forward]") {
  sharded_model m{"opt-tiny", gpu::dtype::f32, {1, 2}};
  auto first = logits_of(m);
  for (auto& s : m.shards) REQUIRE_FALSE(s->evict());
  auto gone = prefill_logits(m.chain(0), prompts);
  REQUIRE_FALSE(gone);
  CHECK(is(gone.error(), ec::not_resident));
  for (auto& s : m.shards) {
    REQUIRE_FALSE(s->load({1ull << 20}));
    REQUIRE_FALSE(s->wait_loaded(30s));
  }
  CHECK(logits_of(m) == first);
}

TEST_CASE("parameters are views of the weight store's device copy", "[models][forward]") {
  sharded_model m{"opt-tiny", gpu::dtype::bf16, {2, 1}};
  auto& shard = *m.shards[1];
  auto base = shard.device_data();
  REQUIRE(base);
  for (auto name : {"embed_tokens.weight", "layers.1.fc2.weight", "final_layer_norm.bias"}) {
    auto addr = m.stages[1]->parameter_address(name);
    REQUIRE(addr);
    CHECK(*addr == *base + shard.table().find(name)->offset_bytes);
  }
  CHECK_FALSE(m.stages[1]->parameter_address("nope"));
}

TEST_CASE("decoding with the KV cache equals full recomputation for 8 tokens", "[models][decode]") {
  for (auto par : {parallel_config{1, 1}, parallel_config{2, 2}}) {
    DYNAMIC_SECTION("tp=" << par.tp << " pp=" << par.pp) {
      sharded_model m{"opt-tiny", gpu::dtype::f32, par};
      generate_options g;
      g.max_tokens = 8;
      auto cached =
          m.on_all_ranks([&](std::vector<decoder_stage*> c) { return generate(c, prompts, g); });
      REQUIRE(cached.size() == prompts.size());
      // Recompute: prefill prompt + the first k generated tokens, the greedy pick must
      // be token k, for every k.
      for (size_t k = 0; k < 8; ++k) {
        auto longer = prompts;
        for (size_t i = 0; i < longer.size(); ++i)
          longer[i].insert(longer[i].end(), cached[i].begin(),
                           cached[i].begin() + static_cast<ptrdiff_t>(k));
        auto logits = m.on_all_ranks(
            [&](std::vector<decoder_stage*> c) { return prefill_logits(c, longer); });
        auto f = logits.to_floats();
        auto vocab = logits.shape[1];
        for (size_t i = 0; i < longer.size(); ++i) {
          auto row = f.begin() + static_cast<ptrdiff_t>(i) * vocab;
          CHECK(std::max_element(row, row + vocab) - row == cached[i][k]);
        }
      }
    }
  }
}

TEST_CASE("a prompt gives the same logits alone and in a padded batch", "[models][forward]") {
  sharded_model m{"opt-tiny", gpu::dtype::f32, {1, 1}};
  auto batch = logits_of(m).to_floats();
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = prefill_logits(m.chain(0), {prompts[i]});
    REQUIRE(alone);
    std::vector<float> row(batch.begin() + static_cast<ptrdiff_t>(i) * 512,
                           batch.begin() + static_cast<ptrdiff_t>(i + 1) * 512);
    CHECK(relative_error(alone->to_floats(), row) <= 1e-5);
  }
}

TEST_CASE("seeded sampling generates reproducibly", "[models][decode]") {
  sharded_model m{"opt-tiny", gpu::dtype::f32, {1, 1}};
  generate_options g;
  g.max_tokens = 5;
  g.sampling = {1.0, 50, 0.95, 1234};
  auto a = generate(m.chain(0), prompts, g);
  auto b = generate(m.chain(0), prompts, g);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(*a == *b);
  for (auto& seq : *a) {
    CHECK(seq.size() == 5);
    for (auto t : seq) CHECK((t >= 0 && t < 512));
  }
  g.sampling.seed = 99;
  CHECK(*generate(m.chain(0), prompts, g) != *a);
}

TEST_CASE("a forward can start while later layers are still loading",
          "[models][forward][pipelined]") {
  sharded_model ref{"opt-tiny", gpu::dtype::f32, {1, 1}};
  auto want = logits_of(ref);
  // 0.005 GB/s: the 0.6 MB shard takes about 120 ms to arrive, in 64 KiB chunks.
  gpu::emulated_device_options o;
  o.capacity_bytes = 64ull << 20;
  o.link_gbps = 0.005;
  auto dev = gpu::emulated_device::make(o);
  REQUIRE(dev);
  auto spec = *find_spec("opt-tiny");
  auto table = *shard_layout(spec, gpu::dtype::f32, {1, 1}, {0, 0});
  auto shard = gpu::weight_shard::create(*dev, table);
  REQUIRE(shard);
  REQUIRE_FALSE(fill_seeded(spec, {1, 1}, {0, 0}, (*shard)->table(), (*shard)->host_data(), 1));
  auto solo = gpu::make_solo_collective();
  auto stage = decoder_stage::create(spec, {1, 1}, {0, 0}, **shard, *solo);
  REQUIRE(stage);
  REQUIRE_FALSE((*shard)->load({64ull << 10}));
  REQUIRE((*shard)->state() == gpu::residency::loading);
  auto got = prefill_logits({stage->get()}, prompts);  // waits layer by layer
  REQUIRE(got);
  CHECK(*got == want);
}

TEST_CASE("bad forward requests get clear errors", "[models][forward][errors]") {
  sharded_model m{"opt-tiny", gpu::dtype::f32, {1, 2}};
  auto s0 = m.stages[0].get();
  auto s1 = m.stages[1].get();
  kv_cache c;
  CHECK_THAT(render(s0->prefill({}, nullptr, c).error()), Catch::Contains("empty batch"));
  CHECK_THAT(render(s0->prefill({{}}, nullptr, c).error()), Catch::Contains("empty prompt"));
  CHECK_THAT(render(s0->prefill({{1, 512}}, nullptr, c).error()),
             Catch::Contains("token id 512 is outside"));
  CHECK_THAT(render(s0->prefill({{-1}}, nullptr, c).error()),
             Catch::Contains("outside the vocabulary"));
  CHECK_THAT(render(s0->prefill({std::vector<int64_t>(129, 5)}, nullptr, c).error()),
             Catch::Contains("exceeds"));
  CHECK_THAT(render(s0->decode({1}, nullptr, c).error()), Catch::Contains("decode before prefill"));
  CHECK_THAT(render(s1->prefill({{1, 2}}, nullptr, c).error()),
             Catch::Contains("needs the previous stage"));
  host_tensor wrong{gpu::dtype::f32, {1, 3, 64}, std::vector<std::byte>(3 * 64 * 4)};
  CHECK_THAT(render(s1->prefill({{1, 2}}, &wrong, c).error()),
             Catch::Contains("hidden states must be"));
  auto ok = s0->prefill({{1, 2}}, nullptr, c);
  REQUIRE(ok);
  CHECK_THAT(render(s0->decode({1, 2}, nullptr, c).error()),
             Catch::Contains("one token per sequence"));
  generate_options g;
  g.max_tokens = 0;
  CHECK_THAT(render(generate(m.chain(0), prompts, g).error()),
             Catch::Contains("max_tokens must be at least 1"));
  g.max_tokens = 1;
  g.sampling.top_p = 2;
  CHECK(is(generate(m.chain(0), prompts, g).error(), ec::invalid_request));
  CHECK_THAT(render(generate({s1}, prompts, {}).error()), Catch::Contains("whole pipeline"));
}

TEST_CASE("a stage refuses weights, groups and dtypes that do not fit",
          "[models][forward][errors]") {
  auto spec = *find_spec("opt-tiny");
  auto solo = gpu::make_solo_collective();
  auto make_shard = [&](gpu::dtype t, parallel_config par, shard_index idx) {
    auto table = *shard_layout(spec, t, par, idx);
    auto s = gpu::weight_shard::create(emulated_device(0), table);
    REQUIRE(s);
    return std::move(*s);
  };
  auto f16 = make_shard(gpu::dtype::f16, {1, 1}, {0, 0});
  auto half = decoder_stage::create(spec, {1, 1}, {0, 0}, *f16, *solo);
  REQUIRE_FALSE(half);
  CHECK(is(half.error(), ec::invalid_configuration));
  CHECK_THAT(render(half.error()), Catch::Contains("fp16 needs a CUDA device"));
  auto tp2 = make_shard(gpu::dtype::f32, {2, 1}, {0, 0});
  CHECK_THAT(render(decoder_stage::create(spec, {2, 1}, {0, 0}, *tp2, *solo).error()),
             Catch::Contains("collective is rank 0 of 1"));
  auto full = make_shard(gpu::dtype::f32, {1, 1}, {0, 0});
  CHECK_THAT(render(decoder_stage::create(spec, {1, 2}, {0, 0}, *full, *solo).error()),
             Catch::Contains("weight shard has"));
  auto other = *find_spec("opt-mini");
  CHECK_FALSE(decoder_stage::create(other, {1, 1}, {0, 0}, *full, *solo));
}

TEST_CASE("a row that leaves the cache leaves the others' decode unchanged", "[models][decode]") {
  sharded_model m{"opt-tiny", gpu::dtype::f32, {1, 1}};
  auto* stage = m.chain(0)[0];
  REQUIRE(prompts.size() >= 3);
  kv_cache all, kept;
  REQUIRE(stage->prefill(prompts, nullptr, all));
  REQUIRE(stage->prefill(prompts, nullptr, kept));
  std::vector<int64_t> next(prompts.size(), 5);
  auto full = stage->decode(next, nullptr, all);
  REQUIRE(full);
  // Rows 2 and 0 go on, in that order; row 1 finished.
  REQUIRE_FALSE(kept.keep_rows({2, 0}));
  auto part = stage->decode({5, 5}, nullptr, kept);
  REQUIRE(part);
  auto f = full->to_floats(), p = part->to_floats();
  const auto vocab = full->shape[1];
  REQUIRE(part->shape == std::vector<int64_t>{2, vocab});
  auto row = [&](const std::vector<float>& v, int64_t r) {
    return std::vector<float>(v.begin() + r * vocab, v.begin() + (r + 1) * vocab);
  };
  CHECK(relative_error(row(p, 0), row(f, 2)) <= 1e-5);
  CHECK(relative_error(row(p, 1), row(f, 0)) <= 1e-5);
  CHECK(kept.keep_rows({7}));  // outside the batch of 2
}

TEST_CASE("sequences prefilled apart and joined decode as each does alone",
          "[models][decode][join]") {
  // Continuous batching: a request prefilled on its own joins a batch that has decoded a
  // few steps, shorter or longer than the batch's cache; every row's logits afterwards
  // equal its own unbatched run's. The OPT (learned positions) and Llama (rotary, grouped
  // queries) families.
  for (auto name : {"opt-tiny", "llama-tiny"}) {
    INFO(name);
    sharded_model m{name, gpu::dtype::f32, {1, 1}};
    auto* stage = m.chain(0)[0];
    const std::vector<std::vector<int64_t>> running = {{2, 100, 37}, {2, 7}};
    for (auto joiner : {std::vector<int64_t>{2, 9, 44, 81, 3, 19, 20, 5}, {2, 11}}) {
      INFO("joiner of " << joiner.size() << " tokens");
      // The batch: prefill and three decode steps, then the joiner appended.
      kv_cache batch, join;
      REQUIRE(stage->prefill(running, nullptr, batch));
      for (int s = 0; s < 3; ++s) REQUIRE(stage->decode({5 + s, 6 + s}, nullptr, batch));
      REQUIRE(stage->prefill({joiner}, nullptr, join));
      REQUIRE_FALSE(batch.append(std::move(join)));
      CHECK(join.length() == 0);
      std::vector<std::vector<float>> joined_rows;
      for (int s = 0; s < 2; ++s) {
        auto out = stage->decode({40 + s, 41 + s, 42 + s}, nullptr, batch);
        REQUIRE(out);
        REQUIRE(out->shape[0] == 3);
        auto f = out->to_floats();
        const auto vocab = out->shape[1];
        for (int64_t r = 0; r < 3; ++r)
          joined_rows.emplace_back(f.begin() + r * vocab, f.begin() + (r + 1) * vocab);
      }
      // Each sequence alone, fed the same tokens.
      auto alone = [&](const std::vector<int64_t>& prompt, std::vector<int64_t> before,
                       int64_t first) {
        kv_cache c;
        REQUIRE(stage->prefill({prompt}, nullptr, c));
        for (auto t : before) REQUIRE(stage->decode({t}, nullptr, c));
        std::vector<std::vector<float>> rows;
        for (int s = 0; s < 2; ++s) {
          auto out = stage->decode({first + s}, nullptr, c);
          REQUIRE(out);
          rows.push_back(out->to_floats());
        }
        return rows;
      };
      auto r0 = alone(running[0], {5, 6, 7}, 40);
      auto r1 = alone(running[1], {6, 7, 8}, 41);
      auto r2 = alone(joiner, {}, 42);
      for (int s = 0; s < 2; ++s) {
        INFO("step " << s);
        CHECK(relative_error(joined_rows[static_cast<size_t>(s * 3)], r0[static_cast<size_t>(s)]) <=
              1e-5);
        CHECK(relative_error(joined_rows[static_cast<size_t>(s * 3 + 1)],
                             r1[static_cast<size_t>(s)]) <= 1e-5);
        CHECK(relative_error(joined_rows[static_cast<size_t>(s * 3 + 2)],
                             r2[static_cast<size_t>(s)]) <= 1e-5);
      }
      // A row leaving after the join leaves the others unchanged.
      REQUIRE_FALSE(batch.keep_rows({2, 0}));
      auto out = stage->decode({1, 1}, nullptr, batch);
      REQUIRE(out);
      // Once only the joiner is left, the cache is as long as it (its prompt and three
      // decode steps), not as old as the batch: padding every row outgrew is dropped.
      REQUIRE_FALSE(batch.keep_rows({0}));
      CHECK(batch.length() == static_cast<int64_t>(joiner.size()) + 3);
      auto last = stage->decode({2}, nullptr, batch);
      REQUIRE(last);
    }
  }
}
