#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "models/opt_spec.hpp"

using namespace computron;
using namespace computron::models;

TEST_CASE("the catalogue has the OPT family with the published sizes", "[models][catalogue]") {
  for (auto name : {"opt-125m", "opt-350m", "opt-1.3b", "opt-2.7b", "opt-6.7b", "opt-13b",
                    "opt-30b", "opt-66b", "opt-175b", "opt-tiny"})
    CHECK(find_spec(name));
  // Hugging Face's OPT-125M has exactly this many parameters (positions included).
  CHECK(parameter_count(*find_spec("opt-125m")) == 125239296ull);
  // OPT-13B in fp16 is about 25.7 GB (WORKLOADS.md).
  auto bytes = shard_bytes(*find_spec("opt-13b"), gpu::dtype::f16, {1, 1}, {0, 0});
  REQUIRE(bytes);
  CHECK(static_cast<double>(*bytes) == Approx(25.7e9).epsilon(0.01));
  auto unknown = find_spec("gpt-5");
  REQUIRE_FALSE(unknown);
  CHECK(is(unknown.error(), ec::unknown_model));
  CHECK_THAT(render(unknown.error()), Catch::Contains("opt-13b"));
}

TEST_CASE("sharding cuts the big matrices and the vocabulary, replicating only norms and biases",
          "[models][sharding]") {
  auto spec = *find_spec("opt-13b");
  auto full = *shard_bytes(spec, gpu::dtype::f16, {1, 1}, {0, 0});
  uint64_t tp4 = 0;
  for (int r = 0; r < 4; ++r) tp4 += *shard_bytes(spec, gpu::dtype::f16, {4, 1}, {r, 0});
  // Four TP shards hold the model once plus three extra copies of what is replicated:
  // per layer two LayerNorms (weight and bias) and the two biases added after an
  // all-reduce; the final LayerNorm. Alignment adds at most 256 bytes a tensor.
  auto replicated = static_cast<uint64_t>((6 * spec.layers + 2) * spec.hidden * 2);
  auto tensors = shard_layout(spec, gpu::dtype::f16, {4, 1}, {0, 0})->entries().size();
  CHECK(tp4 >= full + 3 * replicated);
  CHECK(tp4 <= full + 3 * replicated + 4 * 256 * tensors);
  auto t = shard_layout(spec, gpu::dtype::f16, {4, 1}, {2, 0});
  REQUIRE(t);
  CHECK(t->find("layers.0.self_attn.q_proj.weight")->shape == std::vector<int64_t>{1280, 5120});
  CHECK(t->find("layers.0.self_attn.out_proj.weight")->shape == std::vector<int64_t>{5120, 1280});
  CHECK(t->find("layers.0.fc1.bias")->shape == std::vector<int64_t>{5120});
  CHECK(t->find("layers.0.fc2.bias")->shape == std::vector<int64_t>{5120});
  CHECK(t->find("embed_tokens.weight")->shape == std::vector<int64_t>{50272 / 4, 5120});
  CHECK(t->find("embed_positions.weight")->shape == std::vector<int64_t>{2050, 1280});
}

TEST_CASE("no catalogue model holds a weight byte on two tensor-parallel ranks",
          "[models][sharding][vocab]") {
  // The figure of bench/RESULTS.md: bytes on the devices over the checkpoint's bytes, at
  // most 1.01 at pp 1 (norms and biases replicated), and at pp > 1 with a tied head the
  // last stage's copy of the embedding on top (each rank holding 1/tp of it).
  for (auto& spec : catalogue()) {
    if (spec.name.find("tiny") != std::string::npos || spec.name.find("mini") != std::string::npos)
      continue;  // test shapes: norms are a large share of a 64-wide model
    const auto weights = static_cast<double>(weight_bytes(spec, gpu::dtype::bf16));
    const double head = static_cast<double>(spec.vocab * spec.hidden * 2);
    for (int tp : {1, 2, 4})
      for (int pp : {1, 2}) {
        if (validate(spec, {tp, pp})) continue;  // e.g. 14 heads at tp 4
        uint64_t on_devices = 0;
        for (int s = 0; s < pp; ++s)
          for (int r = 0; r < tp; ++r)
            on_devices += *shard_bytes(spec, gpu::dtype::bf16, {tp, pp}, {r, s});
        auto ratio = static_cast<double>(on_devices) / weights;
        INFO(spec.name << " tp " << tp << " pp " << pp << ": " << ratio);
        CHECK(ratio >= 1.0);
        CHECK(ratio <= (pp > 1 && spec.tied_embeddings ? 1.01 + head / weights : 1.01));
      }
  }
}

TEST_CASE("the layout before vocabulary-parallel embeddings is still priced for the swap bench",
          "[models][sharding][vocab]") {
  auto spec = *find_spec("llama-3.1-8b");
  uint64_t now = 0, before = 0;
  for (int r = 0; r < 4; ++r) {
    now += *shard_bytes(spec, gpu::dtype::bf16, {4, 1}, {r, 0});
    before += *replicated_vocab_shard_bytes(spec, gpu::dtype::bf16, {4, 1}, {r, 0});
  }
  // Each of the 4 ranks held the whole 128256 x 4096 embedding and head; now 1/4 of each.
  const auto table = static_cast<uint64_t>(128256) * 4096 * 2;
  CHECK(before - now == 2 * 3 * table);
  CHECK_FALSE(replicated_vocab_shard_bytes(spec, gpu::dtype::bf16, {3, 1}, {0, 0}));
}

TEST_CASE("pipeline stages hold contiguous layers and the ends of the model",
          "[models][sharding]") {
  auto spec = *find_spec("opt-tiny");
  spec.layers = 5;
  CHECK(stage_layers(spec, 2, 0) == std::pair<int64_t, int64_t>{0, 3});
  CHECK(stage_layers(spec, 2, 1) == std::pair<int64_t, int64_t>{3, 5});
  auto s0 = *shard_layout(spec, gpu::dtype::f32, {1, 2}, {0, 0});
  auto s1 = *shard_layout(spec, gpu::dtype::f32, {1, 2}, {0, 1});
  CHECK(s0.find("embed_positions.weight") != nullptr);
  CHECK(s0.find("final_layer_norm.weight") == nullptr);
  CHECK(s0.find("layers.2.fc1.weight") != nullptr);
  CHECK(s0.find("layers.3.fc1.weight") == nullptr);
  CHECK(s1.find("layers.3.fc1.weight") != nullptr);
  CHECK(s1.find("final_layer_norm.weight") != nullptr);
  CHECK(s1.find("embed_tokens.weight") != nullptr);  // tied LM head on the last stage
  CHECK(s1.find("embed_positions.weight") == nullptr);
}

TEST_CASE("impossible splits are refused with the reason", "[models][sharding]") {
  auto tiny = *find_spec("opt-tiny");  // 4 heads, 2 layers
  auto tp3 = shard_layout(tiny, gpu::dtype::f32, {3, 1}, {0, 0});
  REQUIRE_FALSE(tp3);
  CHECK(is(tp3.error(), ec::invalid_configuration));
  CHECK_THAT(render(tp3.error()), Catch::Contains("4 heads do not divide by tp"));
  auto pp3 = shard_layout(tiny, gpu::dtype::f32, {1, 3}, {0, 0});
  CHECK_THAT(render(pp3.error()), Catch::Contains("only 2 layers for 3 stages"));
  auto rank = shard_layout(tiny, gpu::dtype::f32, {2, 1}, {2, 0});
  CHECK(is(rank.error(), ec::invalid_request));
  CHECK_FALSE(shard_layout(tiny, gpu::dtype::f32, {0, 1}, {0, 0}));
}
