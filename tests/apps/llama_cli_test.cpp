// The Llama family through the command line, as for OPT: `computron generate --model-dir`
// on Hugging Face folders (the independent float64 reference's greedy tokens, at TP1 and
// with a computron.json TP2 x PP2 split) and `computron sim` with today's catalogue shapes
// (the bytes a swap moves and the cost of a step come from the shape).
#include <catch2/catch.hpp>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/support/llama_reference.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

using computron::test::run;
using json = nlohmann::json;

TEST_CASE("generate --model-dir on Llama-family folders gives the reference's tokens",
          "[cli][llama]") {
  computron::test::temp_dir dir{"gen-llama"};
  computron::test::tiny_llama_options llama;
  llama.rope_scaling = {{"rope_type", "llama3"},
                        {"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 32}};
  computron::test::write_tiny_llama_folder(dir.path() + "/llama", llama);
  computron::test::tiny_llama_options qwen3;
  qwen3.model_type = "qwen3";
  qwen3.head_dim = 32;
  computron::test::write_tiny_llama_folder(dir.path() + "/qwen3", qwen3);
  std::ofstream{dir.path() + "/qwen3/computron.json"} << json{{"tp", 2}, {"pp", 2}}.dump();
  const std::vector<std::vector<int64_t>> prompts = {{1, 17, 200, 33, 5}, {9, 8}};
  for (std::string name : {"llama", "qwen3"}) {
    INFO(name);
    auto r = run("generate --model-dir " + dir.path() + "/" + name +
                     " --prompts '[[1,17,200,33,5],[9,8]]' --max-tokens 5",
                 false);
    INFO(r.all);
    REQUIRE(r.exit_code == 0);
    auto got = json::parse(r.out);
    auto ref = computron::test::llama_reference::open(dir.path() + "/" + name);
    REQUIRE(got.size() == 2);
    for (size_t i = 0; i < prompts.size(); ++i) CHECK(got[i] == json(ref.greedy(prompts[i], 5)));
  }
}

namespace {

/// `computron sim` over one seeded catalogue model on one device; its JSON report.
json simulate(const std::string& spec) {
  computron::test::temp_dir dir{"sim-llama"};
  json cfg{
      {"devices", {{"kind", "emulated"}, {"count", 1}, {"capacity_mb", 40000}, {"link_gbps", 16}}},
      {"batching", {{"max_batch_size", 8}, {"batch_window_ms", 10}}},
      {"models",
       {{{"name", "m"}, {"kind", "llama"}, {"spec", spec}, {"devices", {0}}, {"dtype", "bf16"}}}}};
  std::ofstream{dir.path() + "/sim.json"} << cfg.dump();
  auto r = run("sim --config " + dir.path() + "/sim.json --rates 1 --duration 10 --seed 1 --json",
               false);
  INFO(r.all);
  REQUIRE(r.exit_code == 0);
  return json::parse(r.out);
}

}  // namespace

TEST_CASE("sim runs Llama-family catalogue shapes: their bytes and their step cost",
          "[cli][sim][llama]") {
  auto small = simulate("llama-3.2-1b");
  auto large = simulate("llama-3.1-8b");
  INFO(small.dump() << "\n" << large.dump());
  CHECK(small["failed"] == 0);
  CHECK(large["failed"] == 0);
  // One load each, of the model's bf16 weights: 1.24 B parameters (tied head) and 8.03 B.
  CHECK(small["swaps"]["bytes_loaded"].get<double>() == Approx(2 * 1.2358e9).epsilon(0.01));
  CHECK(large["swaps"]["bytes_loaded"].get<double>() == Approx(2 * 8.0301e9).epsilon(0.01));
  // The cost model reads the shape: the 8B model serves the same requests more slowly.
  CHECK(large["overall"]["p50_s"].get<double>() > 2 * small["overall"]["p50_s"].get<double>());
}
