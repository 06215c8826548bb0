#include "net/http/replies.hpp"

#include "common/error.hpp"

namespace computron::net::replies {

namespace http = boost::beast::http;

response make_json(http::status status, const json& body) {
  response res{status, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = body.dump();
  return res;
}

response make_error_response(http::status status, const std::string& message) {
  return make_json(status, json{{"error", message}});
}

/// The one rule from an error code to its HTTP answer. Retry-After is sent only where the
/// same request, sent again after a wait, can succeed without anyone acting on the server
/// (a queue drains, a model swaps in, a registration finishes, a node rejoins); where only
/// a changed request or an operator can help, it is never sent. The switch has no default:
/// a new code does not compile (-Wswitch, warnings are errors) until it has its row here.
error_answer answer_of(ec code) {
  using s = http::status;
  switch (code) {
    // The request itself is wrong: sent again unchanged, it fails the same way.
    case ec::invalid_request:
    case ec::invalid_configuration:
      return {s::bad_request, false};
    // No such model: a load registers one, waiting does not.
    case ec::unknown_model:
      return {s::not_found, false};
    // A queue is full (the frontend's or a model's): it drains.
    case ec::overloaded:
      return {s::too_many_requests, true};
    // The model's weights are not on its devices at this moment (evicted under a step):
    // the next request swaps it in.
    case ec::not_resident:
      return {s::service_unavailable, true};
    // Passed its deadline behind other work, or a step's answer came too late: with less
    // ahead of it, it fits.
    case ec::deadline_exceeded:
      return {s::service_unavailable, true};
    // A model registering or being unregistered, a device whose node is being replaced or
    // cannot be reached yet: each passes by itself.
    case ec::unavailable:
      return {s::service_unavailable, true};
    // The model can never fit its devices (the ledger's sizes, a row's KV room). A device
    // short of pages for a while is not this: the swap scheduler retries those loads itself
    // and the request waits, so waiting longer outside adds no room.
    case ec::out_of_device_memory:
      return {s::service_unavailable, false};
    // Conflicts with a model's lifecycle (already registered, being prepared): the client
    // reads the model's state and decides, it does not resend blindly.
    case ec::invalid_state:
      return {s::conflict, false};
    // The server failed (a device, a file, memory) or the client withdrew: the same
    // request meets the same failure; the message and the log say why.
    case ec::none:
    case ec::unspecified:
    case ec::out_of_host_memory:
    case ec::device_error:
    case ec::io_error:
    case ec::cancelled:
      return {s::internal_server_error, false};
  }
  return {s::internal_server_error, false};
}

/// CAF's own errors: a request that timed out or found its receiver gone (a node lost
/// mid-request) may succeed once the stack has recovered; anything else is a server fault.
error_answer answer_of(const caf::error& e) {
  if (e.category() == error_category) return answer_of(static_cast<ec>(e.code()));
  if (e == caf::sec::request_timeout || e == caf::sec::request_receiver_down)
    return {http::status::service_unavailable, true};
  return {http::status::internal_server_error, false};
}

namespace {

/// Sets Retry-After where answer_of says a retry after waiting can succeed.
response answered(response res, const error_answer& a) {
  if (a.retry) res.set(http::field::retry_after, "1");
  return res;
}

}  // namespace

response error_response(const caf::error& e) {
  auto a = answer_of(e);
  return answered(make_error_response(a.status, render(e)), a);
}

/// The error's name as OpenAI's `code` ("model_not_found" as OpenAI calls it).
std::string code_of(const caf::error& e) {
  if (e.category() != error_category) return "server_error";
  auto c = static_cast<ec>(e.code());
  return c == ec::unknown_model ? "model_not_found" : to_string(c);
}

/// An error in OpenAI's shape, with the same HTTP status as the KServe routes.
response openai_error_response(const caf::error& e, const std::string& param) {
  auto a = answer_of(e);
  return answered(
      make_json(a.status, openai_error(static_cast<int>(a.status), render(e), code_of(e), param)),
      a);
}

response openai_bad_request(const request_error& e) {
  return make_json(http::status::bad_request,
                   openai_error(400, "invalid_request: " + e.message, "invalid_request", e.param));
}

json info_json(const actors::model_info& i) {
  return json{{"name", i.config.name},
              {"kind", i.config.kind},
              {"spec", i.config.spec},
              {"dtype", i.config.dtype},
              {"tp", i.config.tp},
              {"pp", i.config.pp},
              {"devices", i.config.devices},
              {"state", to_string(i.state)},
              {"bytes", i.bytes},
              {"weight_bytes", i.weight_bytes},
              {"queued", i.queued},
              {"pinned", i.config.pinned},
              {"served", i.served},
              {"loads", i.loads},
              {"evictions", i.evictions},
              {"kv_blocks", i.kv_blocks},
              {"kv_bytes", i.kv_bytes},
              {"vocab", i.vocab},
              {"max_positions", i.max_positions},
              {"tokenizer", !i.config.tokenizer.empty()},
              // Weights from a checkpoint (a folder or a GGUF file), not seeded random ones.
              {"checkpoint", !i.config.weights_path.empty()},
              {"reason", i.reason}};
}

/// Triton's model state (READY, LOADING, UNLOADING, UNAVAILABLE) and its reason, from
/// ours. A registered model is READY whether or not it is resident: it is swapped in on
/// demand.
std::pair<std::string, std::string> triton_state(const actors::model_info& i) {
  using actors::model_lifecycle;
  switch (i.state) {
    case model_lifecycle::registering:
      return {"LOADING", ""};
    case model_lifecycle::unregistering:
      return {"UNLOADING", ""};
    case model_lifecycle::failed:
      return {"UNAVAILABLE", i.reason};
    case model_lifecycle::unloaded:
    case model_lifecycle::unregistered:
      return {"UNAVAILABLE", "unloaded"};
    case model_lifecycle::unavailable:
      return {"UNAVAILABLE", i.reason.empty() ? "a device of it is unreachable" : i.reason};
    default:
      return {"READY", ""};
  }
}

/// Why a model the index lists cannot serve, as the error its requests get: the index's
/// reason, with its code where one is known (a model that can never fit its devices is
/// out_of_device_memory: 503 without Retry-After), else unavailable (503). A folder that
/// is not registered is unknown_model (404), saying that a load registers it. No error
/// when the model is READY.
caf::error serving_error(const actors::model_info& i) {
  auto [state, reason] = triton_state(i);
  if (state == "READY") return {};
  const auto& name = i.config.name;
  if (i.state == actors::model_lifecycle::unloaded ||
      i.state == actors::model_lifecycle::unregistered)
    return make_error(ec::unknown_model, "model " + name +
                                             " is in the repository but not loaded (unloaded): "
                                             "POST /v2/repository/models/" +
                                             name + "/load registers it");
  if (state == "LOADING") return make_error(ec::unavailable, "model " + name + " is registering");
  if (state == "UNLOADING")
    return make_error(ec::unavailable, "model " + name + " is being unregistered");
  auto code = i.reason_code != 0 ? static_cast<ec>(i.reason_code) : ec::unavailable;
  return make_error(code, "model " + name + " is unavailable: " + reason);
}

namespace {

json settings_json(const caf::config_value& v) {
  auto& d = v.get_data();
  if (auto x = caf::get_if<caf::config_value::integer>(&d)) return *x;
  if (auto x = caf::get_if<caf::config_value::boolean>(&d)) return *x;
  if (auto x = caf::get_if<caf::config_value::real>(&d)) return *x;
  if (auto x = caf::get_if<std::string>(&d)) return *x;
  if (auto x = caf::get_if<caf::config_value::list>(&d)) {
    json out = json::array();
    for (auto& e : *x) out.push_back(settings_json(e));
    return out;
  }
  if (auto x = caf::get_if<caf::config_value::dictionary>(&d)) {
    json out = json::object();
    for (auto& [k, e] : *x) out[k] = settings_json(e);
    return out;
  }
  return caf::to_string(v);
}

}  // namespace

/// The merged status (every actor's report) plus a per-node summary an operator reads
/// first: which nodes answer, their devices' memory and link, what is resident.
json status_json(const caf::settings& s) {
  json all = json::object();
  for (auto& [k, v] : s) all[k] = settings_json(v);
  json nodes = json::object();
  if (all.contains("devices") && all["devices"].is_array()) {
    for (auto& d : all["devices"]) {
      auto name = d.value("node", std::string{"local"});
      auto& n = nodes[name];
      if (!n.contains("online")) n["online"] = true;
      if (!d.value("online", true) || d.contains("error")) n["online"] = false;
      n["devices"].push_back(d.value("device", int64_t{-1}));
    }
  }
  json list = json::array();
  for (auto& [name, n] : nodes.items()) {
    json e = n;
    e["node"] = name;
    list.push_back(std::move(e));
  }
  all["nodes"] = std::move(list);
  return all;
}

}  // namespace computron::net::replies
