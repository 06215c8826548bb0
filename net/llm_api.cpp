#include "net/llm_api.hpp"

#include <cmath>
#include <functional>
#include <set>

namespace computron::net {

using json = nlohmann::json;

namespace {

/// Reads typed fields of one JSON object; the first problem wins and names its field.
class reader {
 public:
  explicit reader(const json& obj, std::string prefix = {})
      : obj_(obj), prefix_(std::move(prefix)) {}

  std::optional<request_error> error;

  /// Every key must be one of `allowed`.
  void only(const std::set<std::string>& allowed) {
    for (auto& [k, _] : obj_.items())
      if (allowed.count(k) == 0) return fail(k, "unknown parameter '" + prefix_ + k + "'");
  }

  const json* find(const char* key) const {
    auto i = obj_.find(key);
    return i == obj_.end() || i->is_null() ? nullptr : &*i;
  }

  void integer(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    auto v = find(key);
    if (!v || error) return;
    if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi)
      return fail(key, name(key) + " must be an integer in " + std::to_string(lo) + ".." +
                           std::to_string(hi));
    out = v->get<int64_t>();
  }

  void number(const char* key, double& out, double lo, double hi) {
    auto v = find(key);
    if (!v || error) return;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo ||
        v->get<double>() > hi)
      return fail(key, name(key) + " must be a number in " + fmt(lo) + ".." + fmt(hi));
    out = v->get<double>();
  }

  void boolean(const char* key, bool& out) {
    auto v = find(key);
    if (!v || error) return;
    if (!v->is_boolean()) return fail(key, name(key) + " must be true or false");
    out = v->get<bool>();
  }

  /// A string or a list of at most 4 non-empty strings.
  void stops(const char* key, std::vector<std::string>& out) {
    auto v = find(key);
    if (!v || error) return;
    if (v->is_string()) {
      if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
      return;
    }
    if (!v->is_array() || v->size() > 4)
      return fail(key, name(key) + " must be a string or a list of at most 4 strings");
    for (auto& s : *v) {
      if (!s.is_string()) return fail(key, name(key) + " must hold strings");
      if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
    }
  }

  /// The field must be absent, null or `allowed`; anything else is refused as unsupported.
  void only_value(const char* key, const json& allowed, const std::string& why) {
    auto v = find(key);
    if (!v || error || *v == allowed) return;
    fail(key, name(key) + " " + why);
  }

  void fail(const std::string& key, std::string message) {
    if (!error) error = request_error{std::move(message), prefix_ + key};
  }

 private:
  std::string name(const char* key) const { return "'" + prefix_ + key + "'"; }
  static std::string fmt(double x) {
    auto s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const json& obj_;
  std::string prefix_;
};

bool int_list(const json& j) {
  if (!j.is_array() || j.empty()) return false;
  for (auto& x : j)
    if (!x.is_number_integer()) return false;
  return true;
}

/// Sampling and length settings shared by the text APIs.
void read_generation(reader& r, generation_request& g, int64_t max_tokens) {
  r.integer("max_tokens", g.max_tokens, 1, max_tokens);
  r.number("temperature", g.sampling.temperature, 0, 100);
  r.number("top_p", g.sampling.top_p, 1e-9, 1);
  r.integer("top_k", g.sampling.top_k, 0, 1 << 30);
  int64_t seed = 0;
  r.integer("seed", seed, 0, INT64_MAX);
  g.sampling.seed = static_cast<uint64_t>(seed);
  int64_t deadline = 0;
  r.integer("deadline_ms", deadline, 0, 24 * 3600 * 1000);
  g.deadline_ms = static_cast<uint32_t>(deadline);
  r.boolean("drop_late", g.drop_late);
  r.stops("stop", g.stop);
}

}  // namespace

std::variant<generation_request, request_error> parse_completion(const json& body,
                                                                 uint32_t max_prompts,
                                                                 int64_t max_tokens) {
  if (!body.is_object()) return request_error{"the body must be a JSON object", ""};
  reader r{body};
  r.only({"model",
          "prompt",
          "max_tokens",
          "temperature",
          "top_p",
          "top_k",
          "n",
          "stop",
          "seed",
          "stream",
          "stream_options",
          "echo",
          "logprobs",
          "best_of",
          "presence_penalty",
          "frequency_penalty",
          "user",
          "suffix",
          "deadline_ms",
          "drop_late"});
  generation_request g;
  g.sampling.temperature = 1.0;  // OpenAI's default
  auto model = r.find("model");
  if (!model || !model->is_string() || model->get<std::string>().empty())
    r.fail("model", "'model' must name a model (GET /v1/models lists them)");
  else
    g.model = model->get<std::string>();
  auto p = r.find("prompt");
  if (!r.error) {
    if (!p) {
      r.fail("prompt", "'prompt' is required");
    } else if (p->is_string()) {
      g.prompts.emplace_back(p->get<std::string>());
    } else if (int_list(*p)) {
      g.prompts.emplace_back(p->get<std::vector<int64_t>>());
    } else if (p->is_array() && !p->empty()) {
      for (auto& x : *p) {
        if (x.is_string())
          g.prompts.emplace_back(x.get<std::string>());
        else if (int_list(x))
          g.prompts.emplace_back(x.get<std::vector<int64_t>>());
        else
          r.fail("prompt",
                 "'prompt' must be a string, a list of strings, a list of token ids "
                 "or a list of such lists");
      }
    } else {
      r.fail("prompt",
             "'prompt' must be a string, a list of strings, a list of token ids or a "
             "list of such lists");
    }
    if (!r.error && g.prompts.size() > max_prompts)
      r.fail("prompt", "at most " + std::to_string(max_prompts) + " prompts per request");
  }
  read_generation(r, g, max_tokens);
  int64_t n = 1;
  r.integer("n", n, 1, 1);
  int64_t best_of = 1;
  r.integer("best_of", best_of, 1, 1);
  r.boolean("stream", g.stream);
  r.only_value("echo", false, "is not supported (only false)");
  r.only_value("logprobs", json{}, "is not supported");
  r.only_value("suffix", json{}, "is not supported");
  double penalty = 0;
  r.number("presence_penalty", penalty, 0, 0);
  r.number("frequency_penalty", penalty, 0, 0);
  if (auto u = r.find("user"); u && !u->is_string()) r.fail("user", "'user' must be a string");
  if (auto so = r.find("stream_options"); so && !r.error) {
    if (!so->is_object()) {
      r.fail("stream_options", "'stream_options' must be an object");
    } else {
      reader s{*so, "stream_options."};
      s.only({"include_usage"});
      s.boolean("include_usage", g.stream_usage);
      if (s.error) r.error = s.error;
    }
  }
  if (r.error) return *r.error;
  return g;
}

std::variant<generation_request, request_error> parse_generate(const json& body,
                                                               const std::string& model,
                                                               bool stream, int64_t max_tokens) {
  if (!body.is_object()) return request_error{"the body must be a JSON object", ""};
  static const std::set<std::string> settings = {
      "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "deadline_ms", "drop_late"};
  auto top = settings;
  top.insert({"text_input", "parameters", "id", "stream"});
  reader r{body};
  r.only(top);
  generation_request g;
  g.model = model;
  g.stream = stream;
  auto text = r.find("text_input");
  if (!r.error && (!text || !text->is_string()))
    r.fail("text_input", "'text_input' must be a string");
  else if (!r.error)
    g.prompts.emplace_back(text->get<std::string>());
  read_generation(r, g, max_tokens);
  if (auto p = r.find("parameters"); p && !r.error) {
    if (!p->is_object()) {
      r.fail("parameters", "'parameters' must be an object");
    } else {
      reader pr{*p, "parameters."};
      auto allowed = settings;
      allowed.insert("stream");
      pr.only(allowed);
      read_generation(pr, g, max_tokens);
      if (pr.error) r.error = pr.error;
    }
  }
  if (r.error) return *r.error;
  return g;
}

std::variant<infer_body, request_error> parse_infer_body(const json& j, uint32_t max_rows,
                                                         int64_t max_tokens) {
  auto bad = [](std::string why, std::string param = {}) {
    return request_error{std::move(why), std::move(param)};
  };
  if (!j.is_object()) return bad("the body must be a JSON object");
  reader top{j};
  top.only({"id", "inputs", "outputs", "parameters"});
  if (top.error) return *top.error;
  infer_body p;
  if (auto id = j.find("id"); id != j.end() && id->is_string())
    p.request_id = id->get<std::string>();
  auto inputs = j.find("inputs");
  if (inputs == j.end() || !inputs->is_array() || inputs->size() != 1)
    return bad("'inputs' must hold exactly one input, input_ids", "inputs");
  auto& in = (*inputs)[0];
  if (!in.is_object()) return bad("inputs[0] must be an object", "inputs");
  reader ir{in, "inputs[0]."};
  ir.only({"name", "datatype", "shape", "data", "parameters"});
  if (ir.error) return *ir.error;
  auto name = in.find("name");
  if (name == in.end() || !name->is_string() || *name != "input_ids")
    return bad("inputs[0].name must be 'input_ids' (the model's metadata names its inputs)",
               "inputs[0].name");
  auto dt = in.find("datatype");
  if (dt == in.end() || !dt->is_string() || (*dt != "INT64" && *dt != "INT32"))
    return bad(
        "inputs[0].datatype must be INT64 or INT32 (token ids); text goes to "
        "/v2/models/{model}/generate or /v1/completions",
        "inputs[0].datatype");
  auto shape = in.find("shape");
  if (shape == in.end() || !shape->is_array() || shape->empty() || shape->size() > 2)
    return bad("inputs[0].shape must be [batch, length] or [length]", "inputs[0].shape");
  std::vector<int64_t> dims;
  for (auto& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      return bad("inputs[0].shape must hold non-negative integers", "inputs[0].shape");
    dims.push_back(d.get<int64_t>());
  }
  if (dims.size() == 1) dims.insert(dims.begin(), 1);
  if (dims[0] == 0 || dims[1] == 0) return bad("the batch is empty (shape has a zero)");
  if (dims[0] > max_rows)
    return bad("at most " + std::to_string(max_rows) + " sequences per request", "inputs[0].shape");
  auto data = in.find("data");
  std::vector<int64_t> flat;
  std::function<bool(const json&)> flatten = [&](const json& x) {
    if (x.is_array()) {
      for (auto& e : x)
        if (!flatten(e)) return false;
      return true;
    }
    if (!x.is_number_integer()) return false;
    flat.push_back(x.get<int64_t>());
    return true;
  };
  if (data == in.end() || !flatten(*data))
    return bad("inputs[0].data must hold integers", "inputs[0].data");
  if (static_cast<int64_t>(flat.size()) != dims[0] * dims[1])
    return bad("inputs[0].data has " + std::to_string(flat.size()) + " elements; shape says " +
                   std::to_string(dims[0] * dims[1]),
               "inputs[0].data");
  for (int64_t r = 0; r < dims[0]; ++r)
    p.rows.emplace_back(flat.begin() + r * dims[1], flat.begin() + (r + 1) * dims[1]);
  if (auto params = j.find("parameters"); params != j.end()) {
    if (!params->is_object()) return bad("'parameters' must be an object", "parameters");
    reader r{*params, "parameters."};
    r.only({"max_tokens", "temperature", "top_k", "top_p", "seed", "deadline_ms", "drop_late"});
    r.integer("max_tokens", p.max_tokens, 1, max_tokens);
    r.integer("top_k", p.sampling.top_k, 0, 1 << 30);
    int64_t seed = 0, deadline = 0;
    r.integer("seed", seed, 0, INT64_MAX);
    r.integer("deadline_ms", deadline, 0, 24 * 3600 * 1000);
    r.number("temperature", p.sampling.temperature, 0, 100);
    r.number("top_p", p.sampling.top_p, 1e-9, 1);
    r.boolean("drop_late", p.drop_late);
    if (r.error) return *r.error;
    p.sampling.seed = static_cast<uint64_t>(seed);
    p.deadline_ms = static_cast<uint32_t>(deadline);
  }
  return p;
}

json openai_error(int http_status, const std::string& message, const std::string& code,
                  const std::string& param) {
  std::string type = http_status == 400 || http_status == 404 || http_status == 413
                         ? "invalid_request_error"
                     : http_status == 429 ? "rate_limit_error"
                     : http_status == 503 ? "service_unavailable"
                                          : "server_error";
  json e{{"message", message}, {"type", type}, {"code", code}};
  e["param"] = param.empty() ? json{} : json(param);
  return json{{"error", e}};
}

}  // namespace computron::net
