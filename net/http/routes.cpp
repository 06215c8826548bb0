#include "net/http/routes.hpp"

#include <cctype>

namespace computron::net {

using json = nlohmann::json;

namespace {

struct fixed_route {
  const char* target;
  const char* method;
  route_id id;
};

// The routes without a model in the target.
constexpr fixed_route fixed_routes[] = {
    {"/v2/health/live", "GET", route_id::live},
    {"/v2/health/ready", "GET", route_id::ready},
    {"/v2", "GET", route_id::server},
    {"/v2/status", "GET", route_id::status},
    {"/metrics", "GET", route_id::metrics},
    {"/v2/trace", "GET", route_id::trace},
    {"/v2/repository/index", "POST", route_id::repository_index},
    {"/v1/models", "GET", route_id::models_list},
    {"/v1/completions", "POST", route_id::completions},
    {"/v1/chat/completions", "POST", route_id::chat_completions},
    {"/health", "GET", route_id::health},
    {"/version", "GET", route_id::version},
    {"/tokenize", "POST", route_id::tokenize},
    {"/detokenize", "POST", route_id::detokenize},
    {"/v1/load_lora_adapter", "POST", route_id::load_lora_adapter},
    {"/v1/unload_lora_adapter", "POST", route_id::unload_lora_adapter},
};

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

std::variant<route_match, route_refusal> match_route(std::string_view method,
                                                     std::string_view target_in) {
  std::string target{target_in.substr(0, target_in.find('?'))};
  auto no_route = [&] { return route_refusal{404, "no route " + target}; };
  auto need = [&](const char* wanted, route_id id,
                  std::string model = {}) -> std::variant<route_match, route_refusal> {
    if (method != wanted)
      return route_refusal{405, "method " + std::string{method} + " is not allowed on " + target};
    return route_match{id, std::move(model), target};
  };
  for (auto& r : fixed_routes)
    if (target == r.target) return need(r.method, r.id);

  constexpr std::string_view cards = "/v1/models/";
  if (starts_with(target, cards)) {
    auto model = std::string{std::string_view{target}.substr(cards.size())};
    if (model.empty() || model.find('/') != std::string::npos) return no_route();
    return need("GET", route_id::model_card, std::move(model));
  }
  constexpr std::string_view repo = "/v2/repository/models/";
  if (starts_with(target, repo)) {
    auto rest = std::string_view{target}.substr(repo.size());
    auto slash = rest.find('/');
    if (slash == std::string_view::npos) return no_route();
    auto model = std::string{rest.substr(0, slash)};
    auto verb = rest.substr(slash + 1);
    if (verb == "load") return need("POST", route_id::repository_load, std::move(model));
    if (verb == "unload") return need("POST", route_id::repository_unload, std::move(model));
    return no_route();
  }
  constexpr std::string_view models = "/v2/models/";
  if (starts_with(target, models)) {
    auto rest = std::string_view{target}.substr(models.size());
    auto slash = rest.find('/');
    auto model = std::string{rest.substr(0, slash)};
    auto verb = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (model.empty()) return route_refusal{404, "no model named in " + target};
    if (verb.empty()) return need("GET", route_id::model_metadata, std::move(model));
    if (verb == "ready") return need("GET", route_id::model_ready, std::move(model));
    if (verb == "infer") return need("POST", route_id::infer, std::move(model));
    if (verb == "generate") return need("POST", route_id::generate, std::move(model));
    if (verb == "generate_stream") return need("POST", route_id::generate_stream, std::move(model));
  }
  return no_route();
}

bool open_route(route_id id) {
  return id == route_id::live || id == route_id::ready || id == route_id::health ||
         id == route_id::metrics;
}

const char* route_family(std::string_view method, std::string_view target) {
  if (openai_target(target)) return "openai";
  auto m = match_route(method, target);
  if (!std::holds_alternative<route_match>(m)) return "other";
  switch (std::get<route_match>(m).id) {
    case route_id::infer:
    case route_id::generate:
    case route_id::generate_stream:
      return "kserve";
    default:
      return "control";
  }
}

bool openai_target(std::string_view target) {
  return starts_with(target, "/v1/") || target == "/v1";
}

bool bearer_matches(std::string_view header, const std::string& key) {
  // The scheme's name is case-insensitive (RFC 9110); the key is not.
  constexpr std::string_view scheme = "bearer ";
  if (header.size() < scheme.size()) return false;
  for (size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) != scheme[i]) return false;
  auto given = header.substr(scheme.size());
  // Every byte is looked at whatever the first difference: the time says nothing of it.
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < given.size(); ++i)
    diff |=
        static_cast<unsigned>(static_cast<unsigned char>(given[i]) ^
                              static_cast<unsigned char>(key[i % (key.empty() ? 1 : key.size())]));
  return diff == 0 && !key.empty();
}

std::variant<json, std::string> control_parameters(const std::string& body,
                                                   std::initializer_list<const char*> allowed) {
  if (body.empty()) return json::object();
  auto j = json::parse(body, nullptr, false);
  if (!j.is_object()) return std::string{"the body must be a JSON object"};
  for (auto& [k, v] : j.items())
    if (k != "parameters") return "unknown key '" + k + "' (only 'parameters')";
  auto p = j.value("parameters", json::object());
  if (!p.is_object()) return std::string{"'parameters' must be an object"};
  for (auto& [k, v] : p.items()) {
    bool known = false;
    for (auto* a : allowed) known = known || k == a;
    if (!known)
      return "parameter '" + k + "' is not supported" +
             (allowed.size() > 0 ? std::string{} : " (a model's settings come from its folder)");
    if (!v.is_boolean()) return "parameter '" + k + "' must be true or false";
  }
  return p;
}

std::variant<bool, std::string> index_filter(const std::string& body) {
  bool only_ready = false;
  if (body.empty()) return only_ready;
  auto j = json::parse(body, nullptr, false);
  if (!j.is_object()) return std::string{"the body must be a JSON object"};
  for (auto& [k, v] : j.items()) {
    if (k != "ready") return "unknown key '" + k + "' (only 'ready')";
    if (!v.is_boolean()) return std::string{"'ready' must be true or false"};
    only_ready = v.get<bool>();
  }
  return only_ready;
}

}  // namespace computron::net
