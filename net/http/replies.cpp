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

/// The HTTP status of an error, and whether a retry may succeed (Retry-After).
http::status status_of(const caf::error& e, bool& retry) {
  auto status = http::status::internal_server_error;
  retry = false;
  if (e.category() == error_category) {
    switch (static_cast<ec>(e.code())) {
      case ec::invalid_request:
      case ec::invalid_configuration:
        status = http::status::bad_request;
        break;
      case ec::unknown_model:
        status = http::status::not_found;
        break;
      case ec::overloaded:
        status = http::status::too_many_requests;
        retry = true;
        break;
      case ec::invalid_state:
        status = http::status::conflict;
        break;
      case ec::deadline_exceeded:
      case ec::unavailable:
        status = http::status::service_unavailable;
        retry = true;
        break;
      case ec::out_of_device_memory:
        // The model cannot fit on its devices: retrying will not help.
        status = http::status::service_unavailable;
        break;
      default:
        break;
    }
  } else if (e == caf::sec::request_timeout || e == caf::sec::request_receiver_down) {
    status = http::status::service_unavailable;
    retry = true;
  }
  return status;
}

response error_response(const caf::error& e) {
  bool retry = false;
  auto res = make_error_response(status_of(e, retry), render(e));
  if (retry) res.set(http::field::retry_after, "1");
  return res;
}

/// The error's name as OpenAI's `code` ("model_not_found" as OpenAI calls it).
std::string code_of(const caf::error& e) {
  if (e.category() != error_category) return "server_error";
  auto c = static_cast<ec>(e.code());
  return c == ec::unknown_model ? "model_not_found" : to_string(c);
}

/// An error in OpenAI's shape, with the same HTTP status as the KServe routes.
response openai_error_response(const caf::error& e, const std::string& param) {
  bool retry = false;
  auto status = status_of(e, retry);
  auto res =
      make_json(status, openai_error(static_cast<int>(status), render(e), code_of(e), param));
  if (retry) res.set(http::field::retry_after, "1");
  return res;
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
