// `computron generate`: one model folder's tokens for given prompts, run directly (no
// actors, no server; run_generate in serve.cpp): the reference the served outputs match.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/serve.hpp"
#include "common/error.hpp"
#include "models/gguf_model.hpp"

namespace computron::app {

namespace {

struct generate_flags {
  std::string model_dir;
  std::string prompts;
  int64_t max_tokens = 1;
  actors::row_sampling sampling;
  gpu::device_options devices;
};

int run(generate_flags f) {
  // Only this folder is read (a model folder is a repository of itself): a broken
  // sibling is not this model's problem.
  auto name = std::filesystem::path{f.model_dir}.filename().string();
  auto repo =
      is_model_folder(f.model_dir) || models::is_gguf_file(f.model_dir)
          ? read_repository(f.model_dir)
          : read_repository(std::filesystem::path{f.model_dir}.parent_path().string(), name);
  if (!repo) {
    std::cerr << "computron generate: " << render(repo.error()) << '\n';
    return exit_usage;
  }
  if (!repo->empty() && repo->front().error) {
    std::cerr << "computron generate: " << render(repo->front().error) << '\n';
    return exit_usage;
  }
  auto prompts = nlohmann::json::parse(f.prompts, nullptr, false);
  std::vector<std::vector<int64_t>> rows;
  try {
    rows = prompts.get<std::vector<std::vector<int64_t>>>();
  } catch (const std::exception&) {
    std::cerr << "computron generate: --prompts must be a JSON array of integer arrays\n";
    return exit_usage;
  }
  if (repo->empty()) {
    std::cerr << "computron generate: no model in " << f.model_dir << '\n';
    return exit_usage;
  }
  auto& model = repo->front().config;
  if (f.devices.count == 0) {
    for (auto d : model.devices) f.devices.count = std::max(f.devices.count, d + 1);
    if (model.devices.empty()) f.devices.count = model.tp * model.pp;  // placed on the first
  }
  return run_generate(model, f.devices, rows, f.max_tokens, f.sampling);
}

const registration generate_command{
    {"generate", "generate directly from one model (no server): the reference output", 90,
     [](CLI::App& cmd) -> command_run {
       auto f = std::make_shared<generate_flags>();
       f->devices.kind = "emulated";
       cmd.add_option("--model-dir", f->model_dir,
                      "a model folder holding config.json, or a GGUF file")
           ->required();
       cmd.add_option("--prompts", f->prompts, "JSON array of token-id arrays")->required();
       cmd.add_option("--max-tokens", f->max_tokens, "tokens to generate")->capture_default_str();
       cmd.add_option("--temperature", f->sampling.temperature, "0 is greedy")
           ->capture_default_str();
       cmd.add_option("--top-k", f->sampling.top_k, "0 keeps all")->capture_default_str();
       cmd.add_option("--top-p", f->sampling.top_p, "1 keeps all")->capture_default_str();
       cmd.add_option("--seed", f->sampling.seed, "row i uses seed + i")->capture_default_str();
       cmd.add_option("--devices", f->devices.count, "emulated devices")->capture_default_str();
       return [f] { return run(*f); };
     }}};

}  // namespace

}  // namespace computron::app
