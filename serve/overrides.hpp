#pragma once

// What `computron serve`'s flags change in the serve config, and applying them: the CLI
// declares the flags (apps/computron/serve_command.cpp), this says what they mean.
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "net/cluster.hpp"
#include "serve/serve_config.hpp"

namespace computron::serve {

/// serve's flags; each left at its default keeps the config's value.
struct serve_overrides {
  /// --config: the config file; empty: the built-in defaults.
  std::string config_path;
  /// --repository: served instead of the config's `repository`, its models beside the
  /// config's inline ones; without a config file it replaces the built-in models.
  std::string repository;
  std::string host;
  /// Below 0: the config's port.
  int port = -1;
  /// 0: the config's device count.
  int devices = 0;
  /// Memory of each emulated device in MiB; 0: the config's.
  double capacity_mb = 0;
  std::string trace_file;
  /// The bearer key every route but health and metrics requires (--api-key, else
  /// $COMPUTRON_API_KEY, which the CLI reads); empty: the config's.
  std::string api_key;
  /// Nodes as host:port,...; empty: the config's.
  std::string nodes;
  /// Used when it names a certificate (tls.enabled()).
  net::tls_options tls;
  /// Below -1: the config's console port.
  int console_port = -2;
  // vLLM's `serve` flags, where they mean the same here.
  /// The positional MODEL_DIR (`vllm serve ./model`): --repository by another name.
  std::string model_dir;
  /// --served-model-name: the name a one-model folder is served as.
  std::string served_model_name;
  /// --max-model-len: every model's context capped here (0: each model's own).
  int64_t max_model_len = 0;
  /// --tensor-parallel-size, --pipeline-parallel-size: every model's tp and pp (0: its
  /// own).
  int tensor_parallel_size = 0;
  int pipeline_parallel_size = 0;
  /// --dtype in vLLM's words (auto, half, float16, bfloat16, float, float32); empty: each
  /// model's own.
  std::string dtype;
  /// --lora-modules, as vLLM takes them: `name=path`, or a JSON object with "name", "path"
  /// and optionally "base_model_name". Each PEFT folder is served as an adapter of the
  /// model it names (or that its adapter_config.json names).
  std::vector<std::string> lora_modules;
  /// --allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true/1): the
  /// load and unload routes of adapters answer (http_options::runtime_lora_updates).
  bool allow_runtime_lora_updating = false;
  /// --max-lora-rank: the largest adapter rank accepted (scheduler.max_lora_rank); 0: the
  /// config's.
  int max_lora_rank = 0;
};

/// The config the flags start from: the config file (or the built-in defaults) with the
/// repository. Errors: the file's, or the repository's.
caf::expected<serve_config> base_serve_config(const serve_overrides& o);

/// `f` over one model (serve's models at start, and each folder the repository reads
/// again later). Returns what does not fit the model, or empty.
std::string apply_model_flags(actors::model_config& m, const model_flags& f);

/// Applies the flags over `cfg`. Returns what is wrong, or empty: --capacity-mb sets the
/// memory of this process's emulated devices only; --nodes must parse.
std::string apply_overrides(serve_config& cfg, const serve_overrides& o);

}  // namespace computron::serve
