#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

/// The HTTP routing table and the small control bodies, as plain functions: which route a
/// method and target name, and what a control request's body asks. No sockets, no actors,
/// so the fuzz target that feeds raw requests through Beast's parser reaches the same code
/// the server runs (tests/fuzz/http_head_fuzz.cpp).
namespace computron::net {

enum class route_id {
  live,
  ready,
  server,
  status,
  metrics,
  trace,
  repository_index,
  models_list,
  completions,
  chat_completions,
  repository_load,
  repository_unload,
  model_metadata,
  model_ready,
  infer,
  generate,
  generate_stream,
  health,
  version,
  tokenize,
  detokenize,
  model_card,
  load_lora_adapter,
  unload_lora_adapter,
};

struct route_match {
  route_id id;
  /// The model named in the target ("" for the routes without one).
  std::string model;
  /// The target without its query string.
  std::string target;
};

/// Why no route takes the request: 404 (no such route, no model named) or 405 (a known
/// route, the wrong method), with the message the client reads.
struct route_refusal {
  int status;
  std::string message;
};

/// Routes `method` ("GET", "POST", ...) and `target` (a query string is ignored).
/// GET /v1/models/{id} names its model as the /v2 routes do.
std::variant<route_match, route_refusal> match_route(std::string_view method,
                                                     std::string_view target);

/// A model-control body (Triton's `{"parameters": {...}}`; empty means none): the
/// parameters object, or why it is refused (a 400). Only `allowed` keys, each a boolean.
std::variant<nlohmann::json, std::string> control_parameters(
    const std::string& body, std::initializer_list<const char*> allowed);

/// Whether a route answers without the API key (`--api-key`): the health probes and the
/// metrics, as vLLM leaves them open.
bool open_route(route_id id);

/// The API family a request belongs to, for the response counter's label: "openai"
/// (/v1/...), "kserve" (infer and generate), "control" (the rest of /v2, health,
/// metrics) or "other" (no route).
const char* route_family(std::string_view method, std::string_view target);

/// Whether `target` is one of OpenAI's routes (/v1/...), whose every reply, a 404 too, has
/// OpenAI's error shape.
bool openai_target(std::string_view target);

/// Whether an Authorization header value carries `key` ("Bearer KEY"), compared in time
/// that does not depend on where they differ.
bool bearer_matches(std::string_view header, const std::string& key);

/// The repository index's body: empty, or `{"ready": bool}`. True: READY models only.
std::variant<bool, std::string> index_filter(const std::string& body);

}  // namespace computron::net
