#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "models/checkpoint.hpp"
#include "models/weights.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::models;
using computron::test::temp_path;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// A Hugging Face-format folder of seeded opt-tiny weights, removed at the end.
struct hf_folder {
  std::string dir;
  explicit hf_folder(const std::string& name, gpu::dtype t = gpu::dtype::bf16, int files = 2)
      : dir(temp_path(name)) {
    fs::remove_all(dir);
    REQUIRE_FALSE(write_hf_opt_folder(dir, *find_spec("opt-tiny"), t, 9, files));
  }
  ~hf_folder() { fs::remove_all(dir); }

  json config() const {
    std::ifstream in{dir + "/config.json"};
    return json::parse(in);
  }
  void set(const std::string& key, const json& value) const {
    auto j = config();
    j[key] = value;
    std::ofstream{dir + "/config.json"} << j.dump();
  }
};

}  // namespace

TEST_CASE("a Hugging Face OPT folder gives the same shards as our seeded weights",
          "[models][checkpoint]") {
  auto spec = *find_spec("opt-tiny");
  for (int files : {1, 2}) {
    hf_folder hf{"hf-" + std::to_string(files), gpu::dtype::bf16, files};
    CHECK(
        fs::exists(hf.dir + (files == 1 ? "/model.safetensors" : "/model.safetensors.index.json")));
    CHECK(is_hf_folder(hf.dir));
    auto cfg = read_hf_opt_config(hf.dir);
    REQUIRE(cfg);
    CHECK(cfg->spec.hidden == spec.hidden);
    CHECK(cfg->spec.layers == spec.layers);
    CHECK(cfg->spec.heads == spec.heads);
    CHECK(cfg->spec.ffn == spec.ffn);
    CHECK(cfg->spec.vocab == spec.vocab);
    CHECK(cfg->spec.max_positions == spec.max_positions);
    CHECK(cfg->dtype == "bf16");
    auto ckpt = checkpoint::open(hf.dir);
    REQUIRE(ckpt);
    CHECK(ckpt->file_count() == static_cast<size_t>(files));
    CHECK(ckpt->dtype() == gpu::dtype::bf16);
    // model.decoder. prefixes are gone, the tied lm_head is dropped.
    CHECK(ckpt->find("layers.1.fc2.weight") != nullptr);
    CHECK(ckpt->find("lm_head.weight") == nullptr);
    CHECK(ckpt->tensor_count() == shard_params(spec, {1, 1}, {0, 0}).size());
    for (int r = 0; r < 2; ++r)
      for (int s = 0; s < 2; ++s) {
        auto table = *shard_layout(spec, gpu::dtype::bf16, {2, 2}, {r, s});
        std::vector<std::byte> want(table.total_bytes()), got(table.total_bytes());
        REQUIRE_FALSE(fill_seeded(spec, {2, 2}, {r, s}, table, want.data(), 9));
        REQUIRE_FALSE(fill_from_checkpoint(spec, {2, 2}, {r, s}, table, got.data(), *ckpt));
        for (auto& e : table.entries())
          CHECK(std::memcmp(got.data() + e.offset_bytes, want.data() + e.offset_bytes,
                            e.size_bytes) == 0);
      }
  }
}

TEST_CASE("a decoder. prefix is accepted like model.decoder.", "[models][checkpoint]") {
  auto spec = *find_spec("opt-tiny");
  auto table = *shard_layout(spec, gpu::dtype::f32, {1, 1}, {0, 0});
  std::vector<std::byte> host(table.total_bytes());
  REQUIRE_FALSE(fill_seeded(spec, {1, 1}, {0, 0}, table, host.data(), 3));
  std::vector<safetensor> views;
  for (auto& e : table.entries())
    views.push_back(
        {"decoder." + e.name, e.type, e.shape, host.data() + e.offset_bytes, e.size_bytes});
  auto path = temp_path("decoder-prefix.safetensors");
  REQUIRE_FALSE(write_safetensors(path, views));
  auto ckpt = checkpoint::open(path);
  REQUIRE(ckpt);
  std::vector<std::byte> got(table.total_bytes());
  REQUIRE_FALSE(fill_from_checkpoint(spec, {1, 1}, {0, 0}, table, got.data(), *ckpt));
  for (auto& e : table.entries())
    CHECK(std::memcmp(got.data() + e.offset_bytes, host.data() + e.offset_bytes, e.size_bytes) ==
          0);
  fs::remove(path);
}

TEST_CASE("what the OPT forward does not implement is refused naming the field",
          "[models][checkpoint]") {
  hf_folder hf{"hf-unsupported"};
  auto refused = [&](const std::string& key, const json& value, const std::string& text) {
    auto saved = hf.config();
    hf.set(key, value);
    auto cfg = read_hf_opt_config(hf.dir);
    CHECK_FALSE(cfg);
    if (!cfg) {
      CHECK(is(cfg.error(), ec::invalid_configuration));
      CHECK_THAT(render(cfg.error()), Catch::Contains(text));
    }
    std::ofstream{hf.dir + "/config.json"} << saved.dump();
  };
  refused("do_layer_norm_before", false, "do_layer_norm_before: false is not implemented");
  refused("word_embed_proj_dim", 32, "word_embed_proj_dim 32 differs from hidden_size 64");
  refused("activation_function", "gelu", "activation_function \"gelu\" is not implemented");
  refused("enable_bias", false, "enable_bias: false is not implemented");
  refused("hidden_size", -1, "hidden_size must be a positive integer");
  // Strings transformers writes, of another type: refused, not thrown (found by fuzzing).
  refused("model_type", 64, "field model_type must be a string");
  refused("_name_or_path", json::array(), "field _name_or_path must be a string");
  refused("torch_dtype", "int8", "torch_dtype 'int8' is not");
  auto saved = hf.config();
  auto j = saved;
  j.erase("ffn_dim");
  std::ofstream{hf.dir + "/config.json"} << j.dump();
  CHECK_THAT(render(read_hf_opt_config(hf.dir).error()), Catch::Contains("no field ffn_dim"));
  j = saved;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  std::ofstream{hf.dir + "/config.json"} << j.dump();
  CHECK_THAT(render(read_hf_opt_config(hf.dir).error()), Catch::Contains("only OPT is served"));
  std::ofstream{hf.dir + "/config.json"} << saved.dump();
  CHECK(read_hf_opt_config(hf.dir));
}

TEST_CASE(
    "a missing shard, a truncated shard and an index naming a missing tensor are clear "
    "errors",
    "[models][checkpoint]") {
  {
    hf_folder hf{"hf-missing"};
    fs::remove(hf.dir + "/model-00002-of-00002.safetensors");
    auto c = checkpoint::open(hf.dir);
    REQUIRE_FALSE(c);
    CHECK(is(c.error(), ec::io_error));
    CHECK_THAT(render(c.error()),
               Catch::Contains("names shard model-00002-of-00002.safetensors, which is missing"));
  }
  {
    hf_folder hf{"hf-truncated"};
    auto shard = hf.dir + "/model-00001-of-00002.safetensors";
    fs::resize_file(shard, fs::file_size(shard) / 2);
    auto c = checkpoint::open(hf.dir);
    REQUIRE_FALSE(c);
    CHECK_THAT(render(c.error()), Catch::Contains("model-00001-of-00002.safetensors"));
  }
  {
    hf_folder hf{"hf-index"};
    std::ifstream in{hf.dir + "/model.safetensors.index.json"};
    auto idx = json::parse(in);
    idx["weight_map"]["model.decoder.layers.7.fc1.weight"] = "model-00001-of-00002.safetensors";
    std::ofstream{hf.dir + "/model.safetensors.index.json"} << idx.dump();
    auto c = checkpoint::open(hf.dir);
    REQUIRE_FALSE(c);
    CHECK_THAT(render(c.error()),
               Catch::Contains("tensor 'model.decoder.layers.7.fc1.weight' is in "
                               "model-00001-of-00002.safetensors, which does not hold it"));
  }
  {
    hf_folder hf{"hf-escape"};
    std::ifstream in{hf.dir + "/model.safetensors.index.json"};
    auto idx = json::parse(in);
    idx["weight_map"]["model.decoder.layers.0.fc1.weight"] = "../elsewhere.safetensors";
    std::ofstream{hf.dir + "/model.safetensors.index.json"} << idx.dump();
    auto c = checkpoint::open(hf.dir);
    REQUIRE_FALSE(c);
    CHECK_THAT(render(c.error()), Catch::Contains("is not a file name in the folder"));
  }
  auto empty = temp_path("hf-empty");
  fs::create_directories(empty);
  CHECK_THAT(render(checkpoint::open(empty).error()),
             Catch::Contains("has neither model.safetensors.index.json nor model.safetensors"));
  fs::remove_all(empty);
}
