// `computron serve`: its flags (serve/overrides.hpp says what each overrides in the serve
// config), then the server (serve.cpp).
#include <cstdlib>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/serve.hpp"
#include "common/error.hpp"
#include "serve/overrides.hpp"

namespace computron::app {

namespace {

int run(serve::serve_overrides flags) {
  if (const char* k = std::getenv("COMPUTRON_API_KEY"); k && *k && flags.api_key.empty())
    flags.api_key = k;
  // vLLM's switch for the adapter routes, as its users set it.
  if (const char* v = std::getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
    if (std::string s = v; s == "1" || s == "true" || s == "True" || s == "TRUE")
      flags.allow_runtime_lora_updating = true;
  auto cfg = serve::base_serve_config(flags);
  if (!cfg) {
    std::cerr << "computron serve: " << render(cfg.error()) << '\n';
    return exit_usage;
  }
  if (auto why = serve::apply_overrides(*cfg, flags); !why.empty()) {
    std::cerr << "computron serve: " << why << '\n';
    return exit_usage;
  }
  return run_serve(std::move(*cfg));
}

const registration serve_command{
    {"serve", "serve the models of a repository over HTTP (KServe v2)", 30,
     [](CLI::App& cmd) -> command_run {
       auto f = std::make_shared<serve::serve_overrides>();
       cmd.add_option("--config", f->config_path,
                      "JSON serve config (default: built-in, see configs/)");
       cmd.add_option("--repository", f->repository,
                      "model repository folder (one folder per model), or one model's "
                      "folder (it holds config.json); served instead of the config's "
                      "`repository`, beside its inline `models` (without --config, instead "
                      "of the built-in models)");
       cmd.add_option("--host", f->host, "address to listen on (default 127.0.0.1)");
       cmd.add_option("--port", f->port, "port to listen on (default 8000; 0 picks a free one)")
           ->check(CLI::Range(0, 65535));
       cmd.add_option("--devices", f->devices, "number of devices (overrides the config)")
           ->check(CLI::Range(1, 1024));
       cmd.add_option("--capacity-mb", f->capacity_mb,
                      "memory of each emulated device, MiB (the config's devices.capacity_mb; "
                      "refused unless devices.kind is emulated)")
           ->check(CLI::Range(1.0, 1024.0 * 1024 * 1024));
       cmd.add_option("--trace", f->trace_file,
                      "write a Chrome trace of loads and batches here at exit");
       cmd.add_option("--api-key", f->api_key,
                      "require `Authorization: Bearer KEY` on every route but /health, "
                      "/v2/health/* and /metrics (default: $COMPUTRON_API_KEY; none: open)");
       cmd.add_option("--nodes", f->nodes,
                      "serve with these nodes, host:port,... (`computron node` on each)");
       // vLLM's serve flags, where they mean the same here.
       cmd.add_option("model_dir", f->model_dir,
                      "MODEL_DIR: a model's folder, a GGUF file or a repository of them, as "
                      "`vllm serve ./model` takes it (the same as --repository)");
       cmd.add_option("--served-model-name", f->served_model_name,
                      "the name a model folder given to serve is served as (default: the "
                      "folder's name)");
       cmd.add_option("--max-model-len", f->max_model_len,
                      "every model's context, in positions (at most its own; default: its own)")
           ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
       cmd.add_option("--tensor-parallel-size,--tp", f->tensor_parallel_size,
                      "every model's tensor-parallel degree (default: each model's tp)")
           ->check(CLI::Range(1, 1024));
       cmd.add_option("--pipeline-parallel-size,--pp", f->pipeline_parallel_size,
                      "every model's pipeline stages (default: each model's pp)")
           ->check(CLI::Range(1, 1024));
       cmd.add_option("--dtype", f->dtype,
                      "every model's weights: auto (the checkpoint's where the devices run it), "
                      "half/float16 (CUDA), bfloat16, float/float32 (default: each model's)");
       cmd.add_option("--lora-modules", f->lora_modules,
                      "LoRA adapters to serve, as vLLM takes them: name=path (a PEFT folder) or "
                      "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; the base is "
                      "base_model_name, else the folder's base_model_name_or_path matched to a "
                      "served model, else the one model served");
       // vLLM needs it for adapters; here they are always on.
       cmd.add_flag("--enable-lora", "accepted for vLLM's command lines; adapters are always on");
       cmd.add_flag("--allow-runtime-lora-updating", f->allow_runtime_lora_updating,
                    "answer POST /v1/load_lora_adapter and /v1/unload_lora_adapter, which read "
                    "folders on this machine's disk on a client's word (default: off, 404, as "
                    "vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, which turns it on too)");
       cmd.add_option("--max-lora-rank", f->max_lora_rank,
                      "the largest rank r of a LoRA adapter; a larger one is refused when it "
                      "is registered (default: scheduler.max_lora_rank, 64)")
           ->check(CLI::Range(1, 4096));
       cmd.add_option("--console-port", f->console_port,
                      "console port on 127.0.0.1 (default 4242; 0 picks one; -1 turns it off)")
           ->check(CLI::Range(-1, 65535));
       return [f] { return run(*f); };
     }}};

}  // namespace

}  // namespace computron::app
