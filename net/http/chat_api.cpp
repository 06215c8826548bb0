#include "net/http/llm_api.hpp"

#include <string>
#include <utility>
#include <vector>

#include "net/http/body_reader.hpp"
#include "net/http/request_fields.hpp"

// OpenAI's chat body and vLLM's tokenize and detokenize bodies, declared in
// net/http/llm_api.hpp with the other parsers (those are in llm_api.cpp).
namespace computron::net {

using json = nlohmann::json;
using detail::reader;

namespace {

/// Whether `j` nests deeper than `limit` arrays and objects. Iterative: copying a JSON
/// value recurses, so a body of a few hundred kilobytes nested 100k deep would overflow
/// the stack where a route copies it.
bool nests_deeper(const json& j, int limit) {
  std::vector<std::pair<const json*, int>> todo{{&j, 0}};
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    if (depth >= limit) return true;
    for (auto& x : *v) todo.emplace_back(&x, depth + 1);
  }
  return false;
}

/// What a chat request tells its template besides the messages.
void read_template_settings(reader& r, generation_request& g) {
  r.boolean("add_generation_prompt", g.add_generation_prompt);
  if (auto kw = r.find("chat_template_kwargs"); kw && !r.error) {
    if (!kw->is_object())
      r.fail("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    else
      g.template_kwargs = *kw;
  }
}

/// One chat message's content as the template reads it: a string, or a list of text
/// parts joined with newlines (as vLLM does for text-only content).
std::optional<json> message_content(reader& r, const json& content, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array()) {
    r.fail("messages", where + ".content must be a string or a list of text parts");
    return std::nullopt;
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    auto& part = content[i];
    // Read without json::value, which throws on a non-string type.
    auto t = part.is_object() ? part.find("type") : part.end();
    auto type = part.is_object() && t != part.end() && t->is_string() ? t->get<std::string>()
                                                                      : std::string{};
    if (type != "text" || !part.contains("text") || !part["text"].is_string()) {
      r.fail("messages", where + ".content[" + std::to_string(i) +
                             "] must be a text part ({\"type\": \"text\", \"text\": ...}); " +
                             (type.empty() ? "" : "'" + type + "' parts are not supported"));
      return std::nullopt;
    }
    if (i > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  return json(text);
}

/// The messages of a chat request, checked: roles the templates know, text content.
json read_messages(reader& r) {
  auto m = r.find("messages");
  if (!m || !m->is_array() || m->empty()) {
    r.fail("messages", "'messages' must be a non-empty list of messages");
    return json{};
  }
  static const std::set<std::string> roles = {"system", "user", "assistant", "developer", "tool"};
  json out = json::array();
  for (size_t i = 0; i < m->size() && !r.error; ++i) {
    auto where = "messages[" + std::to_string(i) + "]";
    auto& msg = (*m)[i];
    if (!msg.is_object()) {
      r.fail("messages", where + " must be an object");
      break;
    }
    reader mr{msg, where + "."};
    mr.only({"role", "content", "name", "tool_call_id", "tool_calls", "reasoning_content"});
    mr.only_value("tool_calls", json{}, "is not supported (no tool calling)");
    for (auto key : {"name", "tool_call_id", "reasoning_content"})
      if (auto v = mr.find(key); v && !v->is_string())
        mr.fail(key, "'" + where + "." + key + "' must be a string");
    if (mr.error) {
      r.fail("messages", mr.error->message);
      break;
    }
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string() || roles.count(role->get<std::string>()) == 0) {
      r.fail("messages", where + ".role must be system, user, assistant, developer or tool");
      break;
    }
    json copy = json::object();
    for (auto& [k, v] : msg.items())
      if (!v.is_null()) copy[k] = v;
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
      if (*role != "assistant") {
        r.fail("messages", where + ".content is required");
        break;
      }
      copy["content"] = "";
    } else if (auto c = message_content(r, *content, where)) {
      copy["content"] = *c;
    }
    out.push_back(std::move(copy));
  }
  return out;
}

}  // namespace

std::variant<generation_request, request_error> parse_chat(const json& body, uint32_t max_choices,
                                                           int64_t max_tokens) {
  if (!body.is_object()) return request_error{"the body must be a JSON object", ""};
  if (nests_deeper(body, 64)) return request_error{"the body nests deeper than 64 levels", ""};
  reader r{body};
  auto allowed = detail::openai_shared;
  allowed.insert({"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                  "add_generation_prompt", "chat_template_kwargs", "tools", "tool_choice",
                  "parallel_tool_calls", "echo", "continue_final_message", "chat_template"});
  generation_request g;
  detail::apply_field_rules(r, body, allowed, g.ignored);
  r.only(allowed);
  g.sampling.temperature = 1.0;  // OpenAI's default
  detail::read_openai(r, g, max_tokens);
  g.messages = read_messages(r);
  if (auto t = r.find("chat_template")) {
    if (!t->is_string() || t->get<std::string>().empty())
      r.fail("chat_template", "'chat_template' must be a non-empty string (a Jinja template)");
    else
      g.chat_template = t->get<std::string>();
  }
  if (r.find("max_completion_tokens")) {
    g.max_tokens_given = true;
    r.integer("max_completion_tokens", g.max_tokens, 1, max_tokens);
  }
  bool logprobs = false;
  r.boolean("logprobs", logprobs);
  int64_t top = 0;
  r.integer("top_logprobs", top, 0, 20);
  if (!r.error && top > 0 && !logprobs)
    r.fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (logprobs) g.sampling.logprobs = static_cast<int32_t>(top);
  read_template_settings(r, g);
  if (auto t = r.find("tools"); t && !(t->is_array() && t->empty()))
    r.fail("tools", "'tools' is not supported (no tool calling)");
  if (auto t = r.find("tool_choice"); t && *t != "none")
    r.fail("tool_choice", "'tool_choice' is not supported (no tool calling)");
  r.only_value("parallel_tool_calls", json{}, "is not supported (no tool calling)");
  r.only_value("echo", false, "is not supported in chat");
  r.only_value("continue_final_message", false, "is not supported");
  if (!r.error && static_cast<uint64_t>(g.n) > max_choices)
    r.fail("n", "at most " + std::to_string(max_choices) + " choices per request");
  g.prompts.emplace_back(std::string{});  // rendered from the messages with the model's template
  if (r.error) return *r.error;
  return g;
}

std::variant<tokenize_body, request_error> parse_tokenize(const json& body) {
  if (!body.is_object()) return request_error{"the body must be a JSON object", ""};
  if (nests_deeper(body, 64)) return request_error{"the body nests deeper than 64 levels", ""};
  reader r{body};
  r.only({"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
          "chat_template_kwargs", "return_token_strs"});
  tokenize_body t;
  auto& g = t.g;
  auto model = r.find("model");
  if (!model || !model->is_string() || model->get<std::string>().empty())
    r.fail("model", "'model' must name a model (GET /v1/models lists them)");
  else
    g.model = model->get<std::string>();
  if (r.find("messages")) {
    g.messages = read_messages(r);
    t.add_special_tokens = false;
    read_template_settings(r, g);
  } else if (auto p = r.find("prompt"); p && p->is_string()) {
    g.prompts.emplace_back(p->get<std::string>());
  } else if (!r.error) {
    r.fail("prompt", "'prompt' (a string) or 'messages' is required");
  }
  r.boolean("add_special_tokens", t.add_special_tokens);
  r.boolean("return_token_strs", t.token_strs);
  if (r.error) return *r.error;
  return t;
}

std::variant<detokenize_body, request_error> parse_detokenize(const json& body) {
  if (!body.is_object()) return request_error{"the body must be a JSON object", ""};
  reader r{body};
  r.only({"model", "tokens"});
  detokenize_body d;
  auto model = r.find("model");
  if (!model || !model->is_string() || model->get<std::string>().empty())
    r.fail("model", "'model' must name a model (GET /v1/models lists them)");
  else
    d.model = model->get<std::string>();
  auto t = r.find("tokens");
  if (!r.error && (!t || !t->is_array())) r.fail("tokens", "'tokens' must be a list of token ids");
  for (auto& x : t && t->is_array() ? *t : json::array()) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0) {
      r.fail("tokens", "'tokens' must hold token ids (integers >= 0)");
      break;
    }
    d.tokens.push_back(x.get<int64_t>());
  }
  if (r.error) return *r.error;
  return d;
}

}  // namespace computron::net
