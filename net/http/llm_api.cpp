#include "net/http/llm_api.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>

#include "net/http/body_reader.hpp"
#include "net/http/request_fields.hpp"
#include "text/unicode.hpp"

namespace computron::net {

using json = nlohmann::json;
using detail::int_list;
using detail::reader;

namespace detail {

namespace {

/// top_p in 0..1, as OpenAI's API states it. 0 is the nucleus's limit, the most likely
/// token alone; the sampler takes (0, 1], so it gets the smallest mass above 0, which
/// keeps exactly that token.
void read_top_p(reader& r, double& out) {
  r.number("top_p", out, 0, 1);
  if (out == 0) out = std::numeric_limits<double>::min();
}

}  // namespace

void read_generation(reader& r, generation_request& g, int64_t max_tokens) {
  if (r.find("max_tokens")) g.max_tokens_given = true;
  r.integer("max_tokens", g.max_tokens, 1, max_tokens);
  auto named = [&](const char* key) {
    if (r.find(key)) g.given.insert(key);
  };
  for (auto key : {"temperature", "top_p", "top_k", "seed"}) named(key);
  r.number("temperature", g.sampling.temperature, 0, 100);
  read_top_p(r, g.sampling.top_p);
  r.integer("top_k", g.sampling.top_k, -1, 1 << 30);
  if (g.sampling.top_k == -1) g.sampling.top_k = 0;  // vLLM's "off"
  int64_t seed = 0;
  r.integer("seed", seed, 0, INT64_MAX);
  g.sampling.seed = static_cast<uint64_t>(seed);
  int64_t deadline = 0;
  r.integer("deadline_ms", deadline, 0, 24 * 3600 * 1000);
  g.deadline_ms = static_cast<uint32_t>(deadline);
  r.boolean("drop_late", g.drop_late);
  r.stops("stop", g.stop);
}

const std::set<std::string> openai_shared = {"model",
                                             "max_tokens",
                                             "temperature",
                                             "top_p",
                                             "top_k",
                                             "min_p",
                                             "n",
                                             "stop",
                                             "seed",
                                             "stream",
                                             "stream_options",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "repetition_penalty",
                                             "logit_bias",
                                             "user",
                                             "ignore_eos",
                                             "min_tokens",
                                             "stop_token_ids",
                                             "include_stop_str_in_output",
                                             "skip_special_tokens",
                                             "best_of",
                                             "response_format",
                                             "deadline_ms",
                                             "drop_late",
                                             "request_id",
                                             "truncate_prompt_tokens",
                                             "add_special_tokens",
                                             "return_token_ids"};

void read_openai(reader& r, generation_request& g, int64_t max_tokens) {
  auto model = r.find("model");
  if (!model || !model->is_string() || model->get<std::string>().empty())
    r.fail("model", "'model' must name a model (GET /v1/models lists them)");
  else
    g.model = model->get<std::string>();
  read_generation(r, g, max_tokens);
  if (auto id = r.find("request_id")) {
    if (!id->is_string() || id->get<std::string>().empty() || id->get<std::string>().size() > 256)
      r.fail("request_id", "'request_id' must be a string of 1..256 characters");
    else
      g.request_id = id->get<std::string>();
  }
  if (auto t = r.find("truncate_prompt_tokens"); t && *t != json(-1))
    r.integer("truncate_prompt_tokens", g.truncate_prompt_tokens, 1, INT32_MAX);
  else if (t)
    g.truncate_prompt_tokens = -1;
  if (r.find("add_special_tokens")) {
    bool add = false;
    r.boolean("add_special_tokens", add);
    g.add_special_tokens = add;
  }
  for (auto key : {"min_p", "repetition_penalty"})
    if (r.find(key)) g.given.insert(key);
  r.number("min_p", g.sampling.min_p, 0, 1);
  r.number("repetition_penalty", g.sampling.repetition_penalty, 1e-9, 100);
  r.number("presence_penalty", g.sampling.presence_penalty, -2, 2);
  r.number("frequency_penalty", g.sampling.frequency_penalty, -2, 2);
  r.integer("n", g.n, 1, 16);
  if (auto b = r.find("best_of"); b && *b != json(1))
    r.fail("best_of", "'best_of' is not supported (n gives several samples)");
  if (auto f = r.find("response_format"); f && *f != json{{"type", "text"}})
    r.fail("response_format", "'response_format' is not supported (no structured outputs)");
  r.boolean("stream", g.stream);
  r.boolean("ignore_eos", g.ignore_eos);
  r.boolean("include_stop_str_in_output", g.include_stop_str_in_output);
  r.boolean("skip_special_tokens", g.skip_special_tokens);
  r.boolean("return_token_ids", g.return_token_ids);
  r.integer("min_tokens", g.sampling.min_tokens, 0, max_tokens);
  if (auto ids = r.find("stop_token_ids"); ids && !r.error) {
    if (!ids->is_array() || ids->size() > 64)
      r.fail("stop_token_ids", "'stop_token_ids' must be a list of at most 64 token ids");
    for (auto& x : ids->is_array() ? *ids : json::array()) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) {
        r.fail("stop_token_ids", "'stop_token_ids' must hold token ids (integers >= 0)");
        break;
      }
      g.stop_token_ids.push_back(x.get<int64_t>());
    }
  }
  if (auto bias = r.find("logit_bias"); bias && !r.error) {
    // OpenAI's keys are token ids written as strings.
    static const json none = json::object();
    if (!bias->is_object() || bias->size() > 300)
      r.fail("logit_bias", "'logit_bias' must map at most 300 token ids to numbers");
    for (auto& [k, v] : (bias->is_object() ? *bias : none).items()) {
      char* end = nullptr;
      errno = 0;
      auto id = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || errno != 0 || id < 0) {
        r.fail("logit_bias", "'logit_bias' keys must be token ids, got '" + k + "'");
        break;
      }
      double value = v.is_number() ? v.template get<double>() : NAN;
      if (!std::isfinite(value) || value < -100 || value > 100) {
        r.fail("logit_bias", "'logit_bias' values must be numbers in -100..100");
        break;
      }
      g.sampling.bias_ids.push_back(id);
      g.sampling.bias_values.push_back(value);
    }
  }
  if (auto u = r.find("user"); u && !u->is_string()) r.fail("user", "'user' must be a string");
  if (auto so = r.find("stream_options"); so && !r.error) {
    if (!so->is_object()) {
      r.fail("stream_options", "'stream_options' must be an object");
    } else {
      reader s{*so, "stream_options."};
      s.only({"include_usage", "continuous_usage_stats"});
      s.boolean("include_usage", g.stream_usage);
      s.boolean("continuous_usage_stats", g.stream_usage_every_chunk);
      if (s.error) r.error = s.error;
    }
  }
}

}  // namespace detail

using detail::openai_shared;
using detail::read_generation;
using detail::read_openai;

std::variant<generation_request, request_error> parse_completion(const json& body,
                                                                 uint32_t max_prompts,
                                                                 int64_t max_tokens) {
  if (!body.is_object()) return request_error{"the body must be a JSON object", ""};
  reader r{body};
  auto allowed = openai_shared;
  allowed.insert({"prompt", "echo", "logprobs", "suffix"});
  generation_request g;
  detail::apply_field_rules(r, body, allowed, g.ignored);
  r.only(allowed);
  g.sampling.temperature = 1.0;  // OpenAI's default
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
  }
  read_openai(r, g, max_tokens);
  if (!r.error && g.prompts.size() * static_cast<size_t>(g.n) > max_prompts)
    r.fail("prompt",
           "at most " + std::to_string(max_prompts) + " sequences (prompts times n) per request");
  r.boolean("echo", g.echo);
  int64_t logprobs = -1;
  r.integer("logprobs", logprobs, 0, 20);
  g.sampling.logprobs = static_cast<int32_t>(logprobs);
  r.only_value("suffix", json{}, "is not supported");
  if (g.echo && logprobs >= 0) {
    // The prompt's log-probabilities come with the answer, not before the first token;
    // every position's logits cost memory per sample, so one sample per prompt.
    if (!r.error && g.stream)
      r.fail("echo", "'echo' with 'logprobs' is not supported when streaming");
    if (!r.error && g.n > 1) r.fail("n", "'echo' with 'logprobs' takes n = 1");
    g.sampling.prompt_logprobs = static_cast<int32_t>(logprobs);
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
    detail::read_top_p(r, p.sampling.top_p);
    r.boolean("drop_late", p.drop_late);
    if (r.error) return *r.error;
    p.sampling.seed = static_cast<uint64_t>(seed);
    p.deadline_ms = static_cast<uint32_t>(deadline);
  }
  return p;
}

std::variant<json, request_error> parse_json_body(const std::string& body) {
  if (!text::unicode::is_valid_utf8(body)) {
    size_t at = 0;
    while (at < body.size() && (static_cast<unsigned char>(body[at]) < 0x80 ||
                                text::unicode::char_length(body, at) > 1))
      at += text::unicode::char_length(body, at);
    return request_error{
        "the body is not valid UTF-8 (byte " + std::to_string(at) + "); JSON text must be", ""};
  }
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return request_error{"the body is not valid JSON", ""};
  return j;
}

json openai_error(int http_status, const std::string& message, const std::string& code,
                  const std::string& param) {
  std::string type =
      http_status == 400 || http_status == 404 || http_status == 405 || http_status == 413
          ? "invalid_request_error"
      : http_status == 401 ? "authentication_error"
      : http_status == 429 ? "rate_limit_error"
      : http_status == 503 ? "service_unavailable"
                           : "server_error";
  json e{{"message", message}, {"type", type}, {"code", code}};
  e["param"] = param.empty() ? json{} : json(param);
  return json{{"error", e}};
}

}  // namespace computron::net
