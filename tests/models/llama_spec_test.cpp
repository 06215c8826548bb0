// The Llama family without torch: config.json reading, refusals by message, the catalogue's
// sizes against the published parameter counts, and how shards cut (and replicate) the
// key/value heads.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "models/checkpoint.hpp"
#include "models/decoder_spec.hpp"
#include "models/weights.hpp"
#include "tests/support/llama_reference.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::models;
using json = nlohmann::json;

namespace {

/// Rewrites `dir`/config.json with `edit` applied.
template <class F>
void edit_config(const std::string& dir, F edit) {
  json j;
  {
    std::ifstream in{dir + "/config.json"};
    in >> j;
  }
  edit(j);
  std::ofstream out{dir + "/config.json"};
  out << j.dump(2);
}

std::string refusal(const std::string& dir) {
  auto c = read_hf_config(dir);
  REQUIRE_FALSE(c);
  return render(c.error());
}

}  // namespace

TEST_CASE("config.json of every Llama-family model type reads into its shape", "[llama]") {
  for (std::string type : {"llama", "mistral", "qwen2", "qwen3"}) {
    SECTION(type) {
      test::temp_dir dir;
      test::tiny_llama_options o;
      o.model_type = type;
      o.head_dim = type == "qwen3" ? 32 : 0;
      o.tie_word_embeddings = type == "qwen2";
      test::write_tiny_llama_folder(dir.path(), o);
      auto c = read_hf_config(dir.path());
      INFO((c ? std::string{} : render(c.error())));
      REQUIRE(c);
      auto& s = c->spec;
      CHECK(s.family == model_family::llama);
      CHECK(s.model_type == type);
      CHECK(s.hidden == 64);
      CHECK(s.kv_head_count() == 2);
      CHECK(s.head_size() == (type == "qwen3" ? 32 : 16));
      CHECK(s.qkv_bias == (type == "qwen2"));
      CHECK_FALSE(s.o_bias);
      CHECK(s.qk_norm == (type == "qwen3"));
      CHECK(s.tied_embeddings == (type == "qwen2"));
      CHECK(c->dtype == "f32");
      CHECK_FALSE(check_checkpoint_files(dir.path()));
      // The shape travels as JSON in a model's configuration and comes back the same.
      auto back = spec_from_json(to_json(s));
      REQUIRE(back);
      CHECK(to_json(*back) == to_json(s));
    }
  }
}

TEST_CASE("a sliding window caps a model's positions, rope scaling is read", "[llama]") {
  test::temp_dir dir;
  test::tiny_llama_options o;
  o.model_type = "mistral";
  o.sliding_window = 32;
  test::write_tiny_llama_folder(dir.path(), o);
  auto c = read_hf_config(dir.path());
  REQUIRE(c);
  CHECK(c->spec.max_positions == 32);  // of 128: the window never applies
  edit_config(dir.path(), [](json& j) {
    j["sliding_window"] = nullptr;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  });
  c = read_hf_config(dir.path());
  REQUIRE(c);
  CHECK(c->spec.max_positions == 128);
  CHECK(c->spec.rope.scaling == "llama3");
  CHECK(c->spec.rope.factor == 8.0);
  // transformers 5 writes rope_parameters with the theta inside.
  edit_config(dir.path(), [](json& j) {
    j.erase("rope_scaling");
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 12345.0}};
  });
  c = read_hf_config(dir.path());
  REQUIRE(c);
  CHECK(c->spec.rope.scaling == "linear");
  CHECK(c->spec.rope.theta == 12345.0);
}

TEST_CASE("what the Llama forward does not implement is refused naming the field", "[llama]") {
  test::temp_dir dir;
  test::write_tiny_llama_folder(dir.path(), {});
  SECTION("an unknown model type") {
    edit_config(dir.path(), [](json& j) {
      j["model_type"] = "gpt_neox";
      j["architectures"] = {"GPTNeoXForCausalLM"};
    });
    auto why = refusal(dir.path());
    CHECK_THAT(why, Catch::Contains("model_type 'gpt_neox'") &&
                        Catch::Contains("GPTNeoXForCausalLM") && Catch::Contains("qwen3"));
  }
  SECTION("yarn rope scaling") {
    edit_config(dir.path(), [](json& j) {
      j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    });
    CHECK_THAT(refusal(dir.path()), Catch::Contains("rope_scaling.rope_type 'yarn'"));
  }
  SECTION("another activation") {
    edit_config(dir.path(), [](json& j) { j["hidden_act"] = "gelu"; });
    CHECK_THAT(refusal(dir.path()), Catch::Contains("hidden_act 'gelu'"));
  }
  SECTION("MLP biases") {
    edit_config(dir.path(), [](json& j) { j["mlp_bias"] = true; });
    CHECK_THAT(refusal(dir.path()), Catch::Contains("mlp_bias"));
  }
  SECTION("a dimension of the wrong type") {
    edit_config(dir.path(), [](json& j) { j["num_key_value_heads"] = "two"; });
    CHECK_THAT(refusal(dir.path()), Catch::Contains("num_key_value_heads"));
  }
  SECTION("query heads that are no multiple of the key/value heads") {
    edit_config(dir.path(), [](json& j) { j["num_key_value_heads"] = 3; });
    CHECK_THAT(refusal(dir.path()), Catch::Contains("4 query heads") && Catch::Contains("3 key"));
  }
  SECTION("a quantized checkpoint, by its method") {
    for (auto method : {"awq", "gptq", "fp8", "bitsandbytes", "compressed-tensors"}) {
      edit_config(dir.path(), [&](json& j) {
        j["quantization_config"] = {{"quant_method", method}, {"bits", 4}};
      });
      auto why = refusal(dir.path());
      CHECK_THAT(why, Catch::Contains(std::string{"quantization_config names '"} + method + "'") &&
                          Catch::Contains("not supported"));
    }
    edit_config(dir.path(), [](json& j) { j["quantization_config"] = nullptr; });
    CHECK(read_hf_config(dir.path()));
  }
  SECTION("only pytorch_model.bin") {
    std::filesystem::remove(dir.path() + "/model.safetensors");
    std::ofstream{dir.path() + "/pytorch_model.bin"} << "pickle";
    auto err = check_checkpoint_files(dir.path());
    REQUIRE(err);
    CHECK_THAT(render(err),
               Catch::Contains("pytorch_model.bin") && Catch::Contains("safe_serialization=True"));
    auto open = checkpoint::open(dir.path());
    REQUIRE_FALSE(open);
    CHECK_THAT(render(open.error()), Catch::Contains("safetensors only"));
  }
}

TEST_CASE("a missing or misshapen Llama tensor is named with its file", "[llama]") {
  test::temp_dir dir;
  test::write_tiny_llama_folder(dir.path(), {});
  auto c = read_hf_config(dir.path());
  REQUIRE(c);
  auto spec = c->spec;
  auto table = shard_layout(spec, gpu::dtype::f32, {1, 1}, {0, 0});
  REQUIRE(table);
  std::vector<std::byte> host(table->total_bytes());
  SECTION("missing") {
    spec.qkv_bias = true;  // the file has no q/k/v biases
    auto t = shard_layout(spec, gpu::dtype::f32, {1, 1}, {0, 0});
    REQUIRE(t);
    host.resize(t->total_bytes());
    auto file = checkpoint::open(dir.path());
    REQUIRE(file);
    auto err = fill_from_checkpoint(spec, {1, 1}, {0, 0}, *t, host.data(), *file);
    REQUIRE(err);
    CHECK_THAT(render(err), Catch::Contains("'model.layers.0.self_attn.q_proj.bias'") &&
                                Catch::Contains(dir.path()));
  }
  SECTION("a shape that disagrees with the config") {
    edit_config(dir.path(), [](json& j) { j["intermediate_size"] = 96; });
    auto wrong = read_hf_config(dir.path());
    REQUIRE(wrong);
    auto t = shard_layout(wrong->spec, gpu::dtype::f32, {1, 1}, {0, 0});
    REQUIRE(t);
    host.resize(t->total_bytes());
    auto file = checkpoint::open(dir.path());
    REQUIRE(file);
    auto err = fill_from_checkpoint(wrong->spec, {1, 1}, {0, 0}, *t, host.data(), *file);
    REQUIRE(err);
    CHECK_THAT(render(err), Catch::Contains("gate_proj.weight") && Catch::Contains("[128, 64]") &&
                                Catch::Contains("[96, 64]"));
  }
}

TEST_CASE("Llama splits: kv heads split or replicated, bad tp refused naming both numbers",
          "[llama]") {
  auto spec = *find_spec("llama-tiny");  // 4 query heads, 2 key/value heads
  CHECK_FALSE(validate(spec, {2, 1}));
  CHECK_FALSE(validate(spec, {4, 2}));
  auto err = validate(spec, {3, 1});
  REQUIRE(err);
  CHECK_THAT(render(err), Catch::Contains("4 query heads do not divide by tp 3"));
  auto odd = spec;
  odd.heads = 12;
  odd.kv_heads = 3;
  odd.head_dim = 16;
  err = validate(odd, {2, 1});
  REQUIRE(err);
  CHECK_THAT(render(err), Catch::Contains("3 key/value heads and tp 2"));

  // TP4 over 2 kv heads: ranks 0 and 1 hold kv head 0, ranks 2 and 3 kv head 1, each the
  // same bytes as that head's rows of the unsharded tensor.
  auto full_table = shard_layout(spec, gpu::dtype::f32, {1, 1}, {0, 0});
  REQUIRE(full_table);
  std::vector<std::byte> full(full_table->total_bytes());
  REQUIRE_FALSE(fill_seeded(spec, {1, 1}, {0, 0}, *full_table, full.data(), 9));
  auto full_k = full_table->find("layers.0.self_attn.k_proj.weight");
  REQUIRE(full_k);
  const auto head_bytes = static_cast<size_t>(spec.head_size() * spec.hidden * 4);
  for (int rank = 0; rank < 4; ++rank) {
    auto t = shard_layout(spec, gpu::dtype::f32, {4, 1}, {rank, 0});
    REQUIRE(t);
    std::vector<std::byte> host(t->total_bytes());
    REQUIRE_FALSE(fill_seeded(spec, {4, 1}, {rank, 0}, *t, host.data(), 9));
    auto k = t->find("layers.0.self_attn.k_proj.weight");
    REQUIRE(k);
    CHECK(k->shape == std::vector<int64_t>{spec.head_size(), spec.hidden});
    CHECK(
        std::memcmp(host.data() + k->offset_bytes,
                    full.data() + full_k->offset_bytes + static_cast<size_t>(rank / 2) * head_bytes,
                    head_bytes) == 0);
    auto q = t->find("layers.0.self_attn.q_proj.weight");
    REQUIRE(q);
    CHECK(q->shape == std::vector<int64_t>{spec.head_size(), spec.hidden});  // one query head
  }
}

TEST_CASE("Llama catalogue shapes have their published parameter counts", "[llama]") {
  // Counts as transformers reports them (num_parameters()), tied heads counted once.
  for (auto [name, count] :
       {std::pair{"llama-3.2-1b", 1235814400ull}, std::pair{"llama-3.1-8b", 8030261248ull},
        std::pair{"qwen2.5-0.5b", 494032768ull}, std::pair{"qwen2.5-7b", 7615616512ull},
        std::pair{"qwen3-0.6b", 596049920ull}, std::pair{"mistral-7b", 7248023552ull}}) {
    INFO(name);
    auto s = find_spec(name);
    REQUIRE(s);
    CHECK(parameter_count(*s) == count);
  }
}
