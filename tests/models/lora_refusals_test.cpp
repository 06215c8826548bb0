// LoRA adapter refusals: each field of adapter_config.json and each kind of tensor the
// forward cannot apply is refused with a message naming it (tests/support/peft_folder.hpp
// writes the folders).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <functional>

#include "common/error.hpp"
#include "models/lora_adapter.hpp"
#include "tests/support/peft_folder.hpp"

using namespace computron;
using namespace computron::models;
using namespace computron::test;

TEST_CASE("adapter_config.json refusals name their field", "[models][lora]") {
  auto base = tiny_llama();
  struct edit {
    const char* key;
    json value;
    const char* says;
  };
  std::vector<edit> edits = {
      {"peft_type", "PREFIX_TUNING", "peft_type 'PREFIX_TUNING'"},
      {"r", 0, "r must be a positive integer"},
      {"r", "4", "r must be a positive integer"},
      {"lora_alpha", "8", "lora_alpha must be a number"},
      {"use_dora", true, "use_dora: true"},
      {"use_rslora", "yes", "use_rslora must be true or false"},
      {"modules_to_save", json::array({"lm_head"}), "modules_to_save is not supported"},
      {"bias", "all", "bias \"all\""},
      {"bias", "lora_only", "bias \"lora_only\""},
      {"rank_pattern", {{"q_proj", 8}}, "rank_pattern is not supported"},
      {"alpha_pattern", {{"q_proj", 8}}, "alpha_pattern is not supported"},
      {"lora_bias", true, "lora_bias: true"},
      {"layer_replication", json::array({json::array({0, 1})}), "layer_replication"},
      {"layers_pattern", "h", "layers_pattern \"h\""},
      {"layers_to_transform", "0", "layers_to_transform must be"},
      {"target_modules", 5, "target_modules must be a list"},
      {"target_modules", nullptr, "target_modules is missing"},
      {"target_modules", json::array(), "target_modules is an empty list"},
      {"target_modules", json::array({"lm_head"}), "'lm_head': adapters on the LM head"},
      {"target_modules", json::array({"q_proj", "embed_tokens"}), "'embed_tokens'"},
      {"target_modules", json::array({"q_proj", "c_attn"}),
       "'c_attn', which is no projection of lora-llama"},
      {"target_modules", "(?<=self_attn\\.)q_proj", "target_modules '(?<=self_attn\\.)q_proj'"},
      {"exclude_modules", "(?P<x>q)", "exclude_modules"},
      // Matching runs in polynomial time, which has no backreferences: `(.*)*x` would
      // otherwise backtrack for hours on one path.
      {"target_modules", "(q)\\1_proj", "target_modules '(q)\\1_proj' is not a regular"},
      {"target_modules", std::string(600, 'a'), "a regular expression of 600 characters"},
      {"exclude_modules", "(q{8}){9}_proj", "repeats a part more than 64 times"},
      {"target_modules", "(q{8,65})_proj", "repeats a part more than 64 times"},
  };
  for (auto& e : edits) {
    auto f = make_folder(base, 4, 8, {"q_proj"});
    if (e.value.is_null())
      f.config.erase(e.key);
    else
      f.config[e.key] = e.value;
    INFO(e.key << " = " << e.value.dump());
    auto why = refusal(f, base);
    CHECK_THAT(why, Catch::Contains(e.says));
    CHECK_THAT(why, Catch::Contains(f.dir->path()));
  }
  auto f = make_folder(base, 8, 8, {"q_proj"});
  CHECK_THAT(refusal(f, base, lora_limits{4}),
             Catch::Contains("r 8 is over the largest rank accepted, 4"));
  CHECK(f.dir->path().size() > 0);
  lora_limits roomy{8};
  CHECK(read_lora_adapter(f.dir->path(), base, roomy));
}

TEST_CASE("adapter_model.safetensors refusals name the tensor and what is wrong",
          "[models][lora]") {
  auto base = tiny_llama();
  auto q_a = tensor_name(base, 0, "q_proj", "lora_A");
  auto q_b = tensor_name(base, 0, "q_proj", "lora_B");
  auto check = [&](std::function<void(peft_folder&)> change, const std::string& says) {
    auto f = make_folder(base, 4, 8, {"q_proj", "o_proj"});
    change(f);
    INFO(says);
    CHECK_THAT(refusal(f, base), Catch::Contains(says));
  };
  auto add = [](std::string name, std::vector<int64_t> shape, gpu::dtype type = gpu::dtype::f32) {
    return [=](peft_folder& f) {
      size_t n = 1;
      for (auto d : shape) n *= static_cast<size_t>(d);
      f.tensors.push_back({name, type, shape, draw(n, 99)});
    };
  };
  check(add("base_model.model.lm_head.lora_A.weight", {4, 16}),
        "module 'lm_head': adapters on the LM head or embeddings are not supported");
  check(add("base_model.model.model.embed_tokens.lora_embedding_A", {4, 40}),
        "adapters on embeddings are not supported");
  check(add("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", {24}),
        "DoRA");
  check(add("base_model.model.lm_head.modules_to_save.default.weight", {40, 16}),
        "modules_to_save");
  check(add("base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", {24}), "lora_bias");
  check(add("base_model.model.model.layers.0.self_attn.q_proj.weight", {24, 16}),
        "not a LoRA tensor");
  check(add("base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight", {4, 16}),
        "layer 5 is beyond the base's 2 layers");
  check(add("base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight", {4, 16}),
        "module 'model.layers.0.self_attn.qkv_proj' is no projection of lora-llama");
  check(add(tensor_name(base, 1, "v_proj", "lora_A"), {4, 16}),
        "module 'model.layers.1.self_attn.v_proj' has tensors but target_modules does not");
  check(add("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", {4, 16}),
        "a second lora_A for module 'model.layers.0.self_attn.q_proj'");
  check([&](peft_folder& f) { f.erase(q_b); },
        "module 'model.layers.0.self_attn.q_proj' has lora_A but no lora_B");
  check([&](peft_folder& f) { f.erase(q_a); },
        "module 'model.layers.0.self_attn.q_proj' has lora_B but no lora_A");
  check(
      [&](peft_folder& f) {
        f.erase(q_a);
        f.erase(q_b);
      },
      "module 'model.layers.0.self_attn.q_proj' is selected by target_modules but has no");
  check(
      [&](peft_folder& f) {
        for (auto& t : f.tensors)
          if (t.name == q_a) t.type = gpu::dtype::i32;
      },
      "dtype I32 is not a float type");
  check(
      [&](peft_folder& f) {
        for (auto& t : f.tensors)
          if (t.name == q_a) {
            t.shape = {4, 24};  // o_proj's input width, not q_proj's
            t.values = draw(4 * 24, 7);
          }
      },
      "shape [4, 24] does not fit: lora_A of layers.0.self_attn.q_proj.weight (r 4, in 16)");
  check(
      [&](peft_folder& f) {
        auto o_b = tensor_name(base, 1, "o_proj", "lora_B");
        for (auto& t : f.tensors)
          if (t.name == o_b) t.shape = {32, 2};  // the right count, the wrong r
      },
      "shape [32, 2] does not fit: lora_B of layers.1.self_attn.o_proj.weight (out 16, r 4)");

  // A missing tensor file is an I/O error naming the folder.
  auto f = make_folder(base, 4, 8, {"q_proj"});
  f.write();
  std::remove((f.dir->path() + "/adapter_model.safetensors").c_str());
  auto got = read_lora_adapter(f.dir->path(), base);
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), ec::io_error));
  CHECK_THAT(render(got.error()), Catch::Contains("adapter_model.safetensors"));
  // A pickle beside it is named as such, not read.
  std::ofstream(f.dir->path() + "/adapter_model.bin") << "not read";
  got = read_lora_adapter(f.dir->path(), base);
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), ec::invalid_configuration));
  CHECK_THAT(render(got.error()), Catch::Contains("adapter_model.bin (a pickle) is not read"));
}
