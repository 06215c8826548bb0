#pragma once

#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "actors/node.hpp"
#include "net/cluster.hpp"
#include "serve/repository.hpp"
#include "serve/serve_config.hpp"

/// `computron serve`, `node`, `demo` and `generate`: running what a serve config describes
/// (read by serve/), and talking to it.
namespace computron::app {

// The serve config and the repository live in serve/; the CLI's code names them as before.
using serve::add_repository;
using serve::default_serve_config;
using serve::is_model_folder;
using serve::load_repository;
using serve::load_serve_config;
using serve::read_repository;
using serve::serve_config;

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

/// Runs the server until SIGINT or SIGTERM; prints "listening on http://HOST:PORT" on
/// stdout once ready. Returns the process exit code.
int run_serve(serve_config cfg);

struct demo_options {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  size_t requests = 32;
  size_t clients = 4;
  int64_t max_tokens = 24;
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
