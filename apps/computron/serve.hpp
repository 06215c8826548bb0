#pragma once

#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "actors/node.hpp"
#include "actors/repository.hpp"
#include "models/text_directory.hpp"
#include "net/cluster.hpp"
#include "net/http/http_server.hpp"

/// `computron serve`, `computron demo` and `computron generate`.
namespace computron::app {

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
};

/// `computron node`: devices and shard workers, published for a controller.
struct node_options {
  std::string host = "127.0.0.1";
  uint16_t port = 7000;
  gpu::device_options devices;
  net::tls_options tls;
  /// Publish on a non-loopback address without TLS (an operator's explicit choice).
  bool insecure_public = false;
  int compute_threads = 1;
};

/// Runs a node until SIGINT or SIGTERM; prints "listening on HOST:PORT" on stdout once
/// published. Returns the process exit code.
int run_node(node_options opts);

/// Reads a JSON serve config (see configs/README.md); relative paths are resolved from
/// the file's folder. Unknown keys and bad values are errors that name them.
/// `repository` (serve's --repository) is served instead of the file's `repository` key,
/// its models beside the file's inline `models` (a name in both is an error).
caf::expected<serve_config> load_serve_config(const std::string& path,
                                              const std::string& repository = {});

/// The built-in defaults (configs/default.json has the same values, documented).
serve_config default_serve_config();

/// Whether `dir` is itself one model's folder: it holds config.json.
bool is_model_folder(const std::string& dir);

/// Reads a model repository: one folder per model holding config.json (the model_config
/// fields) and optionally weights.safetensors, or a Hugging Face OPT folder. Every
/// folder (or only the one named `only`; hidden ones never) comes back with its model or
/// the error that names the folder and the problem. A `dir` that is itself a model folder
/// (is_model_folder) is a repository of that one model, named after the folder; its
/// subfolders are not read. `texts`: where a folder's tokenizer, chat template and
/// generation defaults are opened (read again after a change on disk); null: the
/// tokenizer is opened only for the vocabulary check. Error: `dir` is not a folder.
caf::expected<std::vector<actors::repository_folder>> read_repository(
    const std::string& dir, const std::string& only = {}, models::text_directory* texts = nullptr);

/// read_repository, strict: the first folder that cannot be read is the error.
caf::expected<std::vector<actors::model_config>> load_repository(const std::string& dir);

/// Serves `dir` as the model repository: its readable folders join `c.models`, the
/// others are logged (the repository index lists them with their reason), and the
/// server gets model control over it. Errors: `dir` is not a folder; a folder named like
/// a model already in `c.models`.
caf::error add_repository(serve_config& c, const std::string& dir);

/// Runs the server until SIGINT or SIGTERM; prints "listening on http://HOST:PORT" on
/// stdout once ready. Returns the process exit code.
int run_serve(serve_config cfg);

struct demo_options {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  size_t requests = 48;
  size_t clients = 4;
  int64_t max_tokens = 4;
  uint64_t seed = 1;
  /// Waiting for the server to become ready at most.
  int ready_timeout_s = 300;
};

/// Sends a short mixed workload to a running server and prints a summary (latency,
/// swaps, GB/s). Returns the exit code (1 when any request failed).
int run_demo(const demo_options& opts);

/// Generates directly (no actors, no server) with a model config; prints the tokens as
/// a JSON array of arrays. The reference for the served outputs.
int run_generate(const actors::model_config& cfg, const gpu::device_options& devices,
                 const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens,
                 const actors::row_sampling& sampling);

}  // namespace computron::app
