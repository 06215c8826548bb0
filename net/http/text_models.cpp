#include "net/http/text_models.hpp"

#include <algorithm>
#include <random>

#include <fmt/format.h>

#include "common/error.hpp"

namespace computron::net {

using json = nlohmann::json;

namespace {

std::string no_tokenizer(const std::string& model) {
  return "model " + model +
         " has no tokenizer, so it takes token ids only (prompts of ids on /v1/completions, "
         "or /v2/models/" +
         model + "/infer); give the model a tokenizer for text (configs/README.md)";
}

}  // namespace

caf::expected<std::shared_ptr<const model_text>> text_models::for_request(
    const actors::model_info& i, text_api api, generation_request& g) {
  if (!i.config.tokenizer.empty()) return of(i);
  // No tokenizer: a completion of token ids is still served, as vLLM serves one with
  // --skip-tokenizer-init. It answers ids; whatever needs text is refused by name.
  std::string needs;
  if (api != text_api::openai)
    needs = api == text_api::chat ? "a chat" : "a text_input";
  else if (g.echo)
    needs = "echo";
  else if (!g.stop.empty())
    needs = "stop strings";
  else if (g.sampling.logprobs >= 0)
    needs = "logprobs";
  else
    for (auto& p : g.prompts)
      if (std::holds_alternative<std::string>(p)) needs = "a text prompt";
  if (!needs.empty())
    return make_error(ec::invalid_request,
                      no_tokenizer(i.config.name) + ": " + needs + " needs one");
  g.return_token_ids = true;
  static const auto ids_only = std::make_shared<const model_text>();
  return ids_only;
}

caf::expected<std::shared_ptr<const model_text>> text_models::of(const actors::model_info& i) {
  const auto& path = i.config.tokenizer;
  if (path.empty()) return make_error(ec::invalid_request, no_tokenizer(i.config.name));
  auto t = directory_->open(path);
  if (!t) return with_context(t.error(), "model " + i.config.name);
  return t;
}

caf::expected<std::string> render_chat(const model_text& text, const generation_request& g,
                                       const std::string& model) {
  const text::chat_template* tmpl = text.chat.get();
  std::shared_ptr<const text::chat_template> own;
  if (!g.chat_template.empty()) {
    // The request's own template (vLLM's chat_template), parsed for this request only.
    auto parsed = text::chat_template::parse(g.chat_template);
    if (!parsed)
      return make_error(ec::invalid_request, "'chat_template': " + render(parsed.error()));
    own = std::move(*parsed);
    tmpl = own.get();
  } else if (!text.chat) {
    if (text.chat_error)
      return with_context(make_error(ec::invalid_request, render(text.chat_error)),
                          "model " + model + " has a chat template this server cannot render");
    return make_error(
        ec::invalid_request,
        "model " + model + " declares no chat template; send a prompt to /v1/completions");
  }
  json ctx = g.template_kwargs;
  ctx["messages"] = g.messages;
  ctx["add_generation_prompt"] = g.add_generation_prompt;
  ctx["bos_token"] = text.tok->bos_token().value_or("");
  ctx["eos_token"] = text.tok->eos_token().value_or("");
  auto out = tmpl->render(ctx);
  if (!out) return with_context(out.error(), "chat template of " + model);
  return out;
}

std::string fresh_completion_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return prefix + fmt::format("{:016x}{:016x}", rng(), rng());
}

caf::error prepare_rows(gen_state& st, const model_text& text, const actors::model_info& info,
                        int64_t max_tokens_limit) {
  auto& g = st.g;
  auto bad = [](std::string why) { return make_error(ec::invalid_request, std::move(why)); };
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> echoes;
  if (g.chat()) {
    auto rendered = render_chat(text, g, info.config.name);
    if (!rendered) return rendered.error();
    prompts.push_back(text.tok->encode(*rendered, g.add_special_tokens.value_or(false)));
    echoes.emplace_back();
  } else {
    for (auto& p : g.prompts) {
      if (auto s = std::get_if<std::string>(&p)) {
        prompts.push_back(text.tok->encode(*s, g.add_special_tokens.value_or(true)));
        echoes.push_back(g.echo ? *s : std::string{});
      } else {
        prompts.push_back(std::get<std::vector<int64_t>>(p));
        echoes.push_back(g.echo ? text.tok->decode(prompts.back(), false) : std::string{});
      }
    }
  }
  if (g.truncate_prompt_tokens != 0) {
    // vLLM's truncate_prompt_tokens: the last k tokens of each prompt (-1: the context).
    auto keep = static_cast<size_t>(g.truncate_prompt_tokens > 0 ? g.truncate_prompt_tokens
                                                                 : info.max_positions);
    for (auto& p : prompts)
      if (p.size() > keep) p.erase(p.begin(), p.end() - static_cast<ptrdiff_t>(keep));
  }
  if (st.api != text_api::triton) {
    // generation_config.json's defaults for what the request left out, as vLLM applies them.
    auto& d = text.defaults;
    auto& s = g.sampling;
    auto unset = [&](const char* key) { return g.given.count(key) == 0; };
    if (d.temperature && unset("temperature")) s.temperature = *d.temperature;
    if (d.top_p && unset("top_p")) s.top_p = *d.top_p;
    if (d.top_k && unset("top_k")) s.top_k = std::max<int64_t>(*d.top_k, 0);
    if (d.min_p && unset("min_p")) s.min_p = *d.min_p;
    if (d.repetition_penalty && unset("repetition_penalty"))
      s.repetition_penalty = *d.repetition_penalty;
    // Without a seed every request samples anew.
    if (unset("seed")) {
      static thread_local std::mt19937_64 rng{std::random_device{}()};
      s.seed = rng() >> 1;
    }
  }
  if (g.chat() && !g.max_tokens_given) {
    // Chat clients rarely say how long: the rest of the context, as vLLM answers.
    int64_t room = info.max_positions - static_cast<int64_t>(prompts[0].size());
    if (room < 1)
      return bad(
          fmt::format("the conversation renders to {} tokens, which fill the {} positions "
                      "of {}",
                      prompts[0].size(), info.max_positions, info.config.name));
    g.max_tokens = std::min(room, max_tokens_limit);
    if (text.defaults.max_new_tokens)
      g.max_tokens = std::min(g.max_tokens, *text.defaults.max_new_tokens);
  }
  if (!g.ignore_eos && text.tok)
    for (auto id : text.tok->eos_ids())
      if (id < info.vocab) st.stop_ids.push_back(id);
  for (auto id : g.stop_token_ids)
    if (std::find(st.stop_ids.begin(), st.stop_ids.end(), id) == st.stop_ids.end())
      st.stop_ids.push_back(id);
  for (size_t p = 0; p < prompts.size(); ++p)
    for (int64_t j = 0; j < g.n; ++j) {
      gen_row r;
      r.prompt = prompts[p];
      r.echo = echoes[p];
      st.rows.push_back(std::move(r));
    }
  return {};
}

replies::response tokenize_reply(const tokenize_body& req, const actors::model_info& info,
                                 const model_text& text) {
  std::string prompt;
  if (req.g.chat()) {
    auto rendered = render_chat(text, req.g, info.config.name);
    if (!rendered) return replies::openai_error_response(rendered.error());
    prompt = *rendered;
  } else {
    prompt = std::get<std::string>(req.g.prompts.at(0));
  }
  auto ids = text.tok->encode(prompt, req.add_special_tokens);
  json out{{"count", ids.size()}, {"max_model_len", info.max_positions}, {"tokens", ids}};
  if (req.token_strs) {
    json strs = json::array();
    for (auto id : ids) strs.push_back(text.tok->decode({id}, false));
    out["token_strs"] = strs;
  }
  return replies::make_json(boost::beast::http::status::ok, out);
}

replies::response detokenize_reply(const detokenize_body& req, const actors::model_info& info,
                                   const model_text& text) {
  for (auto id : req.tokens)
    if (id >= info.vocab)
      return replies::openai_bad_request(
          {"token id " + std::to_string(id) + " is outside the vocabulary of " + info.config.name,
           "tokens"});
  return replies::make_json(boost::beast::http::status::ok,
                            json{{"prompt", text.tok->decode(req.tokens, false)}});
}

}  // namespace computron::net
