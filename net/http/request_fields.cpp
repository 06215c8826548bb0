#include "net/http/request_fields.hpp"

namespace computron::net::detail {

const std::vector<field_rule>& extra_fields() {
  using s = field_status;
  static const std::vector<field_rule> rules = {
      {"store", s::ignored, "OpenAI keeps the completion for its evals; nothing is kept here"},
      {"metadata", s::ignored, "tags for completions OpenAI stores"},
      {"service_tier", s::ignored, "OpenAI's processing tier; this server has one"},
      {"prompt_cache_key", s::ignored, "OpenAI's cache routing hint"},
      {"safety_identifier", s::ignored, "OpenAI's abuse tracking id"},
      {"reasoning_effort", s::ignored,
       "a budget for OpenAI's reasoning models; a model here reasons as its template says "
       "(chat_template_kwargs, e.g. enable_thinking)"},
      {"prediction", s::ignored, "predicted output only speeds OpenAI's decoding up"},
      {"priority", s::ignored,
       "vLLM's priority scheduling; requests here are served by deadline (deadline_ms)"},
      {"prompt_logprobs", s::refused,
       "'prompt_logprobs' is not supported: /v1/completions gives the prompt's "
       "log-probabilities with echo and logprobs"},
      {"audio", s::refused, "'audio' is not supported: the models here answer in text"},
      {"functions", s::refused, "'functions' (legacy function calling) is not supported"},
      {"function_call", s::refused, "'function_call' (legacy function calling) is not supported"},
      {"web_search_options", s::refused, "'web_search_options' is not supported"},
      {"use_beam_search", s::refused, "'use_beam_search' is not supported: beam search"},
      {"guided_json", s::refused, "'guided_json' is not supported: structured outputs"},
      {"guided_regex", s::refused, "'guided_regex' is not supported: structured outputs"},
      {"guided_choice", s::refused, "'guided_choice' is not supported: structured outputs"},
      {"guided_grammar", s::refused, "'guided_grammar' is not supported: structured outputs"},
      {"structured_outputs", s::refused,
       "'structured_outputs' is not supported: structured outputs"},
  };
  return rules;
}

void apply_field_rules(reader& r, const nlohmann::json& body, std::set<std::string>& allowed,
                       std::vector<std::string>& ignored) {
  for (auto& rule : extra_fields()) {
    auto it = body.find(rule.name);
    if (it == body.end()) continue;
    if (rule.status == field_status::refused) {
      r.fail(rule.name, rule.why);
      continue;
    }
    allowed.insert(rule.name);
    ignored.emplace_back(rule.name);
  }
  if (auto m = body.find("modalities"); m != body.end()) {
    if (m->is_null() || *m == nlohmann::json::array({"text"})) {
      allowed.insert("modalities");
      ignored.emplace_back("modalities");
    } else {
      r.fail("modalities", "'modalities' other than [\"text\"] is not supported");
    }
  }
}

}  // namespace computron::net::detail
