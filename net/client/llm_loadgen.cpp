#include "net/client/llm_loadgen.hpp"

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "net/client/llm_lengths.hpp"

namespace computron::net {

namespace {

using json = nlohmann::json;

/// A streamed body around `body`'s model and prompt: exactly `max_tokens` out (ignore_eos),
/// usage in the last chunk, a deadline when `deadline_ms` > 0.
std::string streamed(json body, int64_t max_tokens, uint32_t deadline_ms) {
  body["max_tokens"] = max_tokens;
  body["ignore_eos"] = true;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (deadline_ms > 0) {
    body["deadline_ms"] = deadline_ms;
    body["drop_late"] = true;
  }
  // A dataset's text may hold invalid UTF-8: sent as the replacement character, not thrown.
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string completion_body(const std::string& model, const std::vector<int64_t>& prompt,
                            int64_t max_tokens, uint32_t deadline_ms) {
  return streamed(json{{"model", model}, {"prompt", prompt}}, max_tokens, deadline_ms);
}

std::string text_completion_body(const std::string& model, const std::string& prompt,
                                 int64_t max_tokens, uint32_t deadline_ms) {
  return streamed(json{{"model", model}, {"prompt", prompt}}, max_tokens, deadline_ms);
}

std::string chat_body(const std::string& model, const std::string& content, int64_t max_tokens,
                      uint32_t deadline_ms) {
  json messages = json::array({json{{"role", "user"}, {"content", content}}});
  return streamed(json{{"model", model}, {"messages", std::move(messages)}}, max_tokens,
                  deadline_ms);
}

stream_event parse_stream_event(std::string_view data) {
  stream_event e;
  if (data == "[DONE]") {
    e.done = true;
    return e;
  }
  auto j = json::parse(data.begin(), data.end(), nullptr, false);
  auto bad = [&] {
    e.error = "not a completions chunk: " + std::string{data.substr(0, 200)};
    e.error_code = "bad_event";
    return e;
  };
  if (!j.is_object()) return bad();
  if (auto err = j.find("error"); err != j.end()) {
    e.error = error_message(j.dump());
    if (err->is_object())
      if (auto c = err->find("code"); c != err->end() && c->is_string()) e.error_code = *c;
    if (e.error_code.empty()) e.error_code = "error";
    return e;
  }
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array()) return bad();
  for (auto& c : *choices) {
    if (!c.is_object()) return bad();
    // A completion's text, or a chat chunk's delta.content.
    const json* t = nullptr;
    if (auto x = c.find("text"); x != c.end()) t = &*x;
    if (auto d = c.find("delta"); d != c.end() && d->is_object())
      if (auto x = d->find("content"); x != d->end()) t = &*x;
    if (t && t->is_string() && !t->get_ref<const std::string&>().empty()) e.text = true;
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    auto count = [&](const char* key) -> std::optional<int64_t> {
      auto v = u->find(key);
      if (v == u->end() || !v->is_number_integer()) return std::nullopt;
      return v->get<int64_t>();
    };
    e.prompt_tokens = count("prompt_tokens");
    e.completion_tokens = count("completion_tokens");
  }
  return e;
}

void add_event(stream_record& r, double at_s, const stream_event& e) {
  if (e.text) r.chunk_s.push_back(at_s);
}

void stream_outcome::add(const stream_event& e) {
  done = done || e.done;
  if (e.prompt_tokens) prompt_tokens = e.prompt_tokens;
  if (e.completion_tokens) completion_tokens = e.completion_tokens;
  if (!e.error.empty() && error.empty()) {
    error = e.error;
    error_code = e.error_code;
  }
}

void settle(stream_record& rec, const stream_outcome& st, const timed_result& r) {
  rec.sent_s = r.sent_s;
  rec.done_s = r.done_s;
  rec.status = r.status;
  rec.error_kind = error_kind(r);
  if (!rec.error_kind.empty()) {
    rec.error = r.status > 0 ? error_message(r.body) : r.error;
    return;
  }
  if (!st.error.empty()) {
    // The stream began (200) and then failed: the server's error event says why.
    rec.error_kind = "stream_" + (st.error_code.empty() ? std::string{"error"} : st.error_code);
    rec.error = st.error;
    return;
  }
  if (!st.done) {
    rec.error_kind = "bad_response";
    rec.error = "the stream ended without [DONE]" +
                (r.body.empty() ? std::string{} : ": " + error_message(r.body));
    return;
  }
  if (st.prompt_tokens) rec.prompt_tokens = *st.prompt_tokens;
  rec.output_tokens =
      st.completion_tokens ? *st.completion_tokens : static_cast<int64_t>(rec.chunk_s.size());
}

caf::expected<llm_run> run_llm_loadgen(const workload::schedule& s,
                                       const std::vector<served_model>& models,
                                       const llm_options& opts) {
  std::vector<std::string> names;
  for (auto& m : models) names.push_back(m.name);
  if (auto err = workload::check_models(s, names)) return err;
  std::vector<const served_model*> of(s.models.size());
  for (size_t i = 0; i < s.models.size(); ++i) {
    of[i] = &*std::find_if(models.begin(), models.end(),
                           [&](const served_model& m) { return m.name == s.models[i]; });
    if (!of[i]->tokenizer)
      return make_error(ec::invalid_request,
                        "model " + of[i]->name + " has no tokenizer, so /v1/" +
                            (opts.api == llm_api::chat ? "chat/completions" : "completions") +
                            " cannot answer it: use --api infer");
  }
  if (!opts.texts.empty() && opts.texts.size() != s.arrivals.size())
    return make_error(ec::invalid_request, "one text prompt per request is needed");
  if (opts.api == llm_api::chat && opts.texts.empty() && !s.arrivals.empty())
    return make_error(ec::invalid_request, "chat requests need text prompts");
  llm_run run;
  std::vector<timed_request> reqs;
  reqs.reserve(s.arrivals.size());
  run.records.resize(s.arrivals.size());
  std::mt19937_64 rng{opts.seed};
  for (size_t i = 0; i < s.arrivals.size(); ++i) {
    auto& a = s.arrivals[i];
    auto& m = *of[a.model];
    auto& rec = run.records[i];
    rec.model = m.name;
    rec.arrival_s = a.time_s;
    std::string body;
    if (!opts.texts.empty()) {
      // Counted and fitted to the context by make_text_prompts.
      auto& t = opts.texts[i];
      rec.prompt_tokens = t.prompt_tokens;
      body = opts.api == llm_api::chat
                 ? chat_body(m.name, t.text, t.output_tokens, opts.deadline_ms)
                 : text_completion_body(m.name, t.text, t.output_tokens, opts.deadline_ms);
    } else {
      int64_t prompt_len = a.prompt_len > 0 ? a.prompt_len : 16;
      int64_t output_len = a.max_tokens > 0 ? a.max_tokens : 16;
      if (fit_lengths(prompt_len, output_len, m.max_model_len)) ++run.clipped;
      rec.prompt_tokens = prompt_len;
      body = completion_body(m.name, random_token_ids(rng, m.vocab, prompt_len), output_len,
                             opts.deadline_ms);
    }
    timed_request req{a.time_s, "POST",
                      opts.api == llm_api::chat ? "/v1/chat/completions" : "/v1/completions",
                      std::move(body)};
    req.stream = true;
    reqs.push_back(std::move(req));
  }
  std::vector<stream_outcome> states(reqs.size());
  open_loop_options o;
  o.host = opts.server.host;
  o.port = opts.server.port;
  o.max_connections = opts.max_concurrency;
  o.request_timeout = opts.request_timeout;
  o.on_progress = opts.on_progress;
  o.cancel = opts.cancel;
  o.on_event = [&](size_t i, double at_s, std::string_view data) {
    auto e = parse_stream_event(data);
    add_event(run.records[i], at_s, e);
    states[i].add(e);
  };
  auto account = server_account::before(opts.server);
  const auto start = std::chrono::steady_clock::now();
  auto results = run_open_loop(reqs, o);
  if (!results) return results.error();
  for (size_t i = 0; i < results->size(); ++i) settle(run.records[i], states[i], (*results)[i]);
  account.after(opts.server, start, run.devices, run.swaps);
  return run;
}

std::vector<workload::request_record> as_request_records(const std::vector<stream_record>& rs) {
  std::vector<workload::request_record> out;
  out.reserve(rs.size());
  for (auto& r : rs) {
    workload::request_record x;
    x.model = r.model;
    x.arrival_s = r.arrival_s;
    x.sent_s = r.sent_s;
    x.done_s = r.done_s;
    x.status = r.status;
    x.error_kind = r.error_kind;
    x.error = r.error;
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace computron::net
