#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/interfaces.hpp"
#include "text/text_directory.hpp"

/// The HTTP API (KServe v2 / Triton REST conventions, OpenAI's and vLLM's routes) on
/// Boost.Beast, talking to the frontend actor and the registry. Beast and Asio stay inside
/// net/http's sources and its private headers (http_server_impl.hpp, http_transport.hpp,
/// replies.hpp), so code that includes this header never compiles them.
namespace computron::net {

class metrics;
class trace_recorder;

struct http_options {
  std::string host = "127.0.0.1";
  /// 0 picks a free port (tests); port() tells which.
  uint16_t port = 8000;
  /// Larger request bodies are refused with 413.
  uint64_t max_body_bytes = 1 << 20;
  /// Sequences one infer request may carry.
  uint32_t max_batch_rows = 256;
  /// The largest max_tokens (the manager's; serve copies batching.max_tokens here, so
  /// every route and the manager state one range); 0: none, each model's context bounds it.
  int64_t max_tokens = 0;
  /// I/O threads.
  int threads = 2;
  /// Idle keep-alive connections close after this.
  std::chrono::seconds idle_timeout{30};
  /// Longest the server waits for the frontend's answer.
  std::chrono::seconds request_timeout{300};
  /// Non-empty: every route but the health probes and the metrics answers 401 unless the
  /// request carries `Authorization: Bearer <api_key>` (serve's --api-key).
  std::string api_key;
  /// POST /v1/load_lora_adapter and /v1/unload_lora_adapter read a folder on the server's
  /// disk on a client's word, so they answer 404 unless this is on, as vLLM's do unless
  /// VLLM_ALLOW_RUNTIME_LORA_UPDATING is set (serve's --allow-runtime-lora-updating, the
  /// config's http.allow_runtime_lora_updating, or that variable).
  bool runtime_lora_updates = false;
};

class http_server {
 public:
  /// Binds and starts serving. Model control (the repository index, load, unload and
  /// unregister) goes to `registry` where there is one, else to the frontend (no
  /// unregister). `texts`: the models' tokenizers, chat templates and generation
  /// defaults, opened where they were registered (null: the server opens each on its first
  /// text request). Errors: the address cannot be bound (io_error, with the reason).
  static caf::expected<std::unique_ptr<http_server>> start(
      caf::actor_system& sys, actors::frontend_actor frontend, std::shared_ptr<metrics> metrics,
      std::shared_ptr<trace_recorder> trace, http_options opts,
      actors::registry_actor registry = {}, std::shared_ptr<text::text_directory> texts = nullptr);
  ~http_server();

  /// The bound port.
  uint16_t port() const;

  /// Stops accepting and closes every connection; idempotent.
  void stop();

  struct impl;

 private:
  explicit http_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace computron::net
