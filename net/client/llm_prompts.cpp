#include "net/client/llm_prompts.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "net/client/http_client.hpp"
#include "net/client/llm_lengths.hpp"

namespace computron::net {

namespace {

using json = nlohmann::json;

/// The server's tokenizer routes over one keep-alive connection.
class tokenizer_routes {
 public:
  tokenizer_routes(http_client& c, std::chrono::milliseconds timeout) : c_(c), timeout_(timeout) {}

  /// The tokens of `body`'s prompt as /tokenize counts them. `what` names the prompt in
  /// errors.
  caf::expected<int64_t> count(const json& body, const std::string& what) {
    auto j = post("/tokenize", body, what);
    if (!j) return j.error();
    auto n = j->find("count");
    if (n == j->end() || !n->is_number_integer())
      return make_error(ec::io_error, "/tokenize answered without a count for " + what);
    return n->get<int64_t>();
  }

  caf::expected<std::string> detokenize(const std::string& model, const std::vector<int64_t>& ids) {
    auto j = post("/detokenize", json{{"model", model}, {"tokens", ids}}, "random token ids");
    if (!j) return j.error();
    auto p = j->find("prompt");
    if (p == j->end() || !p->is_string())
      return make_error(ec::io_error, "/detokenize answered without a prompt");
    return p->get<std::string>();
  }

 private:
  caf::expected<json> post(const std::string& route, const json& body, const std::string& what) {
    auto model = body.at("model").get<std::string>();
    auto r = c_.request("POST", route, body.dump(-1, ' ', false, json::error_handler_t::replace),
                        timeout_);
    if (!r) return with_context(r.error(), route + " of model " + model);
    if (r->status != 200)
      // The server refused the prompt (no tokenizer, no chat template): bad input, not
      // an unreachable server.
      return make_error(r->status >= 500 ? ec::io_error : ec::invalid_request,
                        fmt::format("model {}: {} refused {} ({}): {}", model, route, what,
                                    r->status, error_message(r->body)));
    auto j = json::parse(r->body, nullptr, false);
    if (!j.is_object()) return make_error(ec::io_error, route + " answered something not JSON");
    return j;
  }

  http_client& c_;
  std::chrono::milliseconds timeout_;
};

/// The /tokenize body that counts `text` as the route reads it: a completion's prompt (with
/// the tokenizer's special tokens, as /v1/completions adds them), or one user message
/// rendered by the model's chat template.
json count_body(const std::string& model, const std::string& text, llm_api api) {
  if (api == llm_api::chat)
    return json{{"model", model},
                {"messages", json::array({json{{"role", "user"}, {"content", text}}})},
                {"add_generation_prompt", true}};
  return json{{"model", model}, {"prompt", text}};
}

/// Fits the output into the context after a prompt of `prompt_tokens` (setting `clipped`);
/// an error when the prompt leaves no room for one token.
caf::error fit_output(text_prompt& p, int64_t max_len, const std::string& model,
                      const std::string& what, bool& clipped) {
  if (max_len <= 0 || p.prompt_tokens + p.output_tokens <= max_len) return {};
  if (p.prompt_tokens >= max_len)
    return make_error(ec::invalid_request,
                      fmt::format("{} is {} tokens, and model {} holds {} positions: no room "
                                  "for one output token",
                                  what, p.prompt_tokens, model, max_len));
  p.output_tokens = max_len - p.prompt_tokens;
  clipped = true;
  return {};
}

}  // namespace

std::string to_string(llm_api a) {
  return a == llm_api::chat ? "chat" : "completions";
}

std::vector<int64_t> random_token_ids(std::mt19937_64& rng, int64_t vocab, int64_t n) {
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = token(rng);
  return ids;
}

caf::expected<text_prompts> make_text_prompts(const workload::schedule& s,
                                              const std::vector<served_model>& models,
                                              const std::vector<dataset_prompt>& dataset,
                                              const text_prompt_options& opts) {
  std::vector<const served_model*> of(s.models.size());
  for (size_t i = 0; i < s.models.size(); ++i) {
    auto m = std::find_if(models.begin(), models.end(),
                          [&](const served_model& x) { return x.name == s.models[i]; });
    if (m == models.end()) return make_error(ec::unknown_model, "unknown model " + s.models[i]);
    of[i] = &*m;
  }
  auto client = http_client::connect(opts.server.host, opts.server.port, opts.timeout);
  if (!client) return client.error();
  tokenizer_routes routes{**client, opts.timeout};
  text_prompts out;
  out.prompts.reserve(s.arrivals.size());
  const auto order = dataset_order(dataset.size(), opts.seed);
  // (model, dataset index) -> prompt tokens, reply tokens: each counted once.
  std::map<std::pair<uint32_t, size_t>, std::pair<int64_t, int64_t>> counted;
  std::mt19937_64 rng{opts.seed};
  for (size_t i = 0; i < s.arrivals.size(); ++i) {
    auto& a = s.arrivals[i];
    auto& m = *of[a.model];
    text_prompt p;
    p.output_tokens = a.max_tokens > 0 ? a.max_tokens : 16;
    std::string what;
    bool clipped = false;
    if (dataset.empty()) {
      // The completions route's token-id prompt, made text by the model's own tokenizer.
      int64_t prompt_len = a.prompt_len > 0 ? a.prompt_len : 16;
      clipped = fit_lengths(prompt_len, p.output_tokens, m.max_model_len);
      auto text = routes.detokenize(m.name, random_token_ids(rng, m.vocab, prompt_len));
      if (!text) return text.error();
      p.text = std::move(*text);
      what = fmt::format("the random prompt of request {}", i + 1);
      auto n = routes.count(count_body(m.name, p.text, opts.api), what);
      if (!n) return n.error();
      p.prompt_tokens = *n;
    } else {
      auto at = order[i % order.size()];
      auto& d = dataset[at];
      what = "the prompt of " + d.source;
      auto c = counted.find({a.model, at});
      if (c == counted.end()) {
        auto n = routes.count(count_body(m.name, d.text, opts.api), what);
        if (!n) return n.error();
        int64_t reply = 0;
        if (d.reply && !d.reply->empty()) {
          // The reply's own tokens, as vLLM counts ShareGPT's output: no special tokens.
          json body{{"model", m.name}, {"prompt", *d.reply}, {"add_special_tokens", false}};
          auto r = routes.count(body, "the reply of " + d.source);
          if (!r) return r.error();
          reply = *r;
        }
        c = counted.emplace(std::pair{a.model, at}, std::pair{*n, reply}).first;
      }
      p.text = d.text;
      p.prompt_tokens = c->second.first;
      if (d.output_tokens > 0)
        p.output_tokens = d.output_tokens;
      else if (c->second.second > 0)
        p.output_tokens = c->second.second;
    }
    if (auto err = fit_output(p, m.max_model_len, m.name, what, clipped)) return err;
    if (clipped) ++out.clipped;
    out.prompts.push_back(std::move(p));
  }
  return out;
}

}  // namespace computron::net
