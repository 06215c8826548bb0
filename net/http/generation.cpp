#include "net/http/generation.hpp"

#include <chrono>

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::net {

using namespace replies;
namespace http = boost::beast::http;

std::function<void()> exit_on_gone(caf::actor a) {
  return [a = std::move(a)] { caf::anon_send_exit(a, caf::exit_reason::user_shutdown); };
}

namespace {

/// One token as the logprobs objects show it: its own text, special tokens included.
std::string token_text(const gen_state& st, int64_t id) {
  return st.tok->decode({id}, false);
}

json utf8_bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(c);
  return b;
}

/// The log-probabilities of a row's generated tokens [from, to) in the route's shape:
/// chat's {"content": [{token, logprob, bytes, top_logprobs}]} or completions' parallel
/// lists {tokens, token_logprobs, top_logprobs, text_offset}. Null when none were asked.
json logprobs_json(const gen_state& st, const gen_row& r, size_t from, size_t to) {
  if (st.g.sampling.logprobs < 0) return nullptr;
  to = std::min(to, r.logprobs.size());
  // The entries' ids: the generated ones, then the stop id (named by its token, as vLLM
  // lists it, while the text leaves it out).
  auto id_at = [&](size_t i) { return i < r.ids.size() ? r.ids[i] : r.stop_id; };
  if (st.api == text_api::chat) {
    json content = json::array();
    for (size_t i = from; i < to; ++i) {
      auto text = token_text(st, id_at(i));
      json top = json::array();
      auto& lp = r.logprobs[i];
      for (size_t k = 0; k < lp.top_ids.size() && k < lp.top_logprobs.size(); ++k) {
        auto t = token_text(st, lp.top_ids[k]);
        top.push_back({{"token", t}, {"logprob", lp.top_logprobs[k]}, {"bytes", utf8_bytes(t)}});
      }
      content.push_back({{"token", text},
                         {"logprob", lp.logprob},
                         {"bytes", utf8_bytes(text)},
                         {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json tokens = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();
  size_t offset = 0;
  const bool listed_prompt = from == 0 && st.g.echo && st.g.sampling.prompt_logprobs >= 0;
  if (listed_prompt) {
    // echo: the prompt's tokens first; the first has nothing before it to be scored by.
    for (size_t i = 0; i < r.prompt.size(); ++i) {
      auto text = token_text(st, r.prompt[i]);
      tokens.push_back(text);
      offsets.push_back(offset);
      offset += text.size();
      if (i == 0 || i - 1 >= r.prompt_logprobs.size()) {
        values.push_back(nullptr);
        tops.push_back(nullptr);
        continue;
      }
      auto& lp = r.prompt_logprobs[i - 1];
      values.push_back(lp.logprob);
      json top = json::object();
      for (size_t k = 0; k < lp.top_ids.size() && k < lp.top_logprobs.size(); ++k)
        top[token_text(st, lp.top_ids[k])] = lp.top_logprobs[k];
      tops.push_back(top);
    }
  }
  // One running offset: after the prompt's tokens where they were listed (as vLLM counts
  // them, token texts), else after the echoed text.
  if (!listed_prompt) offset = r.echo.size();
  for (size_t i = 0; i < from && i < r.ids.size(); ++i) offset += token_text(st, r.ids[i]).size();
  for (size_t i = from; i < to; ++i) {
    auto text = token_text(st, id_at(i));
    auto& lp = r.logprobs[i];
    tokens.push_back(text);
    values.push_back(lp.logprob);
    json top = json::object();
    for (size_t k = 0; k < lp.top_ids.size() && k < lp.top_logprobs.size(); ++k)
      top[token_text(st, lp.top_ids[k])] = lp.top_logprobs[k];
    tops.push_back(top);
    offsets.push_back(offset);
    offset += text.size();
  }
  return json{{"tokens", tokens},
              {"token_logprobs", values},
              {"top_logprobs", tops},
              {"text_offset", offsets}};
}

json chunk_json(const gen_state& st, size_t row, const std::string& text, const json& finish,
                json logprobs = nullptr) {
  if (st.api == text_api::triton) {
    json j{{"model_name", st.g.model}, {"model_version", "1"}, {"text_output", text}};
    if (!finish.is_null()) j["finish_reason"] = finish;
    return j;
  }
  json choice{{"index", row}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
  if (st.api == text_api::chat) {
    // The last chunk of a choice carries an empty delta with its finish_reason.
    choice["delta"] = text.empty() && !finish.is_null() ? json::object() : json{{"content", text}};
  } else {
    choice["text"] = text;
  }
  return json{{"id", st.completion_id},
              {"object", st.api == text_api::chat ? "chat.completion.chunk" : "text_completion"},
              {"created", st.created},
              {"model", st.g.model},
              {"choices", json::array({std::move(choice)})}};
}

json usage_json(const gen_state& st) {
  size_t prompt = 0, completion = 0;
  for (size_t i = 0; i < st.rows.size(); ++i) {
    auto& r = st.rows[i];
    // n samples of one prompt read it once.
    if (i % static_cast<size_t>(st.g.n) == 0) prompt += r.prompt.size();
    completion += r.completion_tokens;
  }
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion}};
}

void open_stream(gen_state& st) {
  if (st.sse) return;
  st.sse = st.open_sse();
}

void send_event(gen_state& st, json j) {
  open_stream(st);
  // vLLM's continuous usage: only with include_usage, on every chunk of a choice.
  if (st.g.stream_usage && st.g.stream_usage_every_chunk && j.contains("choices") &&
      !j.contains("usage"))
    j["usage"] = usage_json(st);
  st.sse->send(j.dump(-1, ' ', false, json::error_handler_t::replace));
}

/// Chat streams start each choice with a chunk that names the role.
void send_role(gen_state& st, size_t row) {
  auto& r = st.rows[row];
  if (st.api != text_api::chat || r.role_sent) return;
  r.role_sent = true;
  auto j = chunk_json(st, row, "", nullptr);
  j["choices"][0]["delta"] = json{{"role", "assistant"}, {"content", ""}};
  send_event(st, j);
}

/// Streams what of a row's text is safe to show (never the start of a stop string),
/// with the log-probabilities of the tokens that came since the last chunk.
void stream_text(gen_state& st, size_t row, bool all) {
  auto& r = st.rows[row];
  auto upto = all ? r.text.size() : st.stops.safe_prefix(r.text);
  const bool echo_now = !r.echo_sent && !r.echo.empty() && (all || upto > r.emitted);
  // Without a tokenizer there is no text: each token goes out as its id.
  const bool ids_now = !st.tok && r.ids.size() > r.ids_sent;
  if (upto <= r.emitted && !echo_now && !ids_now) return;
  send_role(st, row);
  auto lp = logprobs_json(st, r, r.logprobs_sent, r.logprobs.size());
  r.logprobs_sent = r.logprobs.size();
  auto text = r.text.substr(r.emitted, upto - r.emitted);
  if (echo_now) text = r.echo + text;
  r.echo_sent = true;
  auto chunk = chunk_json(st, row, text, nullptr, std::move(lp));
  if (st.g.return_token_ids && st.api != text_api::triton) {
    auto& c = chunk["choices"][0];
    c["token_ids"] =
        std::vector<int64_t>(r.ids.begin() + static_cast<ptrdiff_t>(r.ids_sent), r.ids.end());
    if (r.ids_sent == 0) c["prompt_token_ids"] = r.prompt;
    r.ids_sent = r.ids.size();
  }
  send_event(st, chunk);
  r.emitted = upto;
}

response json_response(const json& out) {
  response res{http::status::ok, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = out.dump(-1, ' ', false, json::error_handler_t::replace);
  return res;
}

/// Every row answered: the whole response, or the stream's end.
void finish_generation(caf::event_based_actor* self, gen_state& st) {
  if (st.g.stream) {
    if (st.api != text_api::triton) {
      if (st.g.stream_usage) {
        auto j = chunk_json(st, 0, "", nullptr);
        j["choices"] = json::array();
        j["usage"] = usage_json(st);
        send_event(st, j);
      }
      open_stream(st);
      st.sse->send("[DONE]");
    }
    if (st.sse) st.sse->end();
  } else if (st.api == text_api::triton) {
    auto& r = st.rows[0];
    st.reply(json_response(json{{"model_name", st.g.model},
                                {"model_version", "1"},
                                {"text_output", r.text},
                                {"finish_reason", r.finish},
                                {"usage", usage_json(st)}}));
  } else {
    const bool chat = st.api == text_api::chat;
    json choices = json::array();
    for (size_t i = 0; i < st.rows.size(); ++i) {
      auto& r = st.rows[i];
      json c{{"index", i},
             {"logprobs", logprobs_json(st, r, 0, r.logprobs.size())},
             {"finish_reason", r.finish}};
      if (chat)
        c["message"] = json{{"role", "assistant"}, {"content", r.text}};
      else
        c["text"] = r.echo + r.text;
      if (st.g.return_token_ids) {
        c["prompt_token_ids"] = r.prompt;
        c["token_ids"] = r.ids;
      }
      choices.push_back(std::move(c));
    }
    st.reply(json_response(json{{"id", st.completion_id},
                                {"object", chat ? "chat.completion" : "text_completion"},
                                {"created", st.created},
                                {"model", st.g.model},
                                {"choices", choices},
                                {"usage", usage_json(st)}}));
  }
  self->quit();
}

void cancel_row(caf::event_based_actor* self, gen_state& st, const gen_row& r) {
  // A row that stopped on a stop string is complete: its request counts as a success.
  if (r.id) self->send(st.frontend, actors::cancel_atom_v, *r.id, r.stopped);
}

/// Where a row's text ends once a stop string starts at `at`: before it, or after it
/// with include_stop_str_in_output.
size_t cut_at(const gen_state& st, const std::string& text, size_t at) {
  if (!st.g.include_stop_str_in_output) return at;
  for (auto& s : st.g.stop)
    if (text.compare(at, s.size(), s) == 0) return at + s.size();
  return at;
}

/// A row failed: every other row is cancelled and the request answers with the error
/// (the last event of a stream already under way).
void fail_generation(caf::event_based_actor* self, const std::shared_ptr<gen_state>& sp,
                     const caf::error& e) {
  auto& st = *sp;
  --st.left;
  if (st.failed) return;
  st.failed = true;
  for (auto& r : st.rows)
    if (!r.done) cancel_row(self, st, r);
  if (st.sse) {
    auto status = static_cast<int>(answer_of(e).status);
    send_event(st, openai_error(status, render(e), code_of(e)));
    if (st.api != text_api::triton) st.sse->send("[DONE]");
    st.sse->end();
  } else {
    st.reply(st.api == text_api::triton ? error_response(e) : openai_error_response(e));
  }
  self->quit();
}

}  // namespace

/// The actor behind one text request: sends one infer request per choice with itself as
/// the token sink, turns tokens into text as they come, cuts at stop strings (and
/// cancels the row there, so no step is spent past it), streams or answers at the end.
/// When the client goes away the session makes it exit, and the frontend, which watches
/// its requesters, cancels every row still queued or running.
caf::behavior generation(caf::event_based_actor* self, std::shared_ptr<gen_state> sp,
                         actors::frontend_actor fe, caf::timespan timeout) {
  auto& st = *sp;
  st.frontend = fe;
  st.left = st.rows.size();
  st.stops.stops = st.g.stop;
  // Tokens come one by one only where something acts on them before the end: a stream,
  // or stop strings (the row is cancelled where one appears). Otherwise the reply's
  // tokens are decoded once.
  const bool watch = st.g.stream || !st.g.stop.empty();
  for (size_t i = 0; i < st.rows.size(); ++i) {
    if (st.tok)
      st.rows[i].decoder = std::make_unique<text::stream_decoder>(st.tok, st.g.skip_special_tokens);
    actors::infer_request req;
    req.model = st.g.model;
    req.tokens = st.rows[i].prompt;
    req.max_tokens = st.g.max_tokens;
    req.sampling = st.g.sampling;
    req.sampling.seed = st.g.sampling.seed + i;
    req.deadline_ms = st.g.deadline_ms;
    req.drop_late = st.g.drop_late;
    req.stop_ids = st.stop_ids;
    if (req.sampling.min_tokens > 0) req.sampling.suppress = st.stop_ids;
    if (watch) {
      req.stream = caf::actor_cast<actors::token_sink_actor>(self);
      req.stream_row = static_cast<uint32_t>(i);
    }
    self->request(fe, timeout, actors::infer_atom_v, std::move(req))
        .then(
            [=](actors::infer_reply& rep) {
              auto& st = *sp;
              auto& r = st.rows[i];
              r.done = true;
              r.prompt_logprobs = std::move(rep.prompt_logprobs);
              if (st.g.sampling.prompt_logprobs >= 0 &&
                  r.prompt_logprobs.size() + 1 < r.prompt.size()) {
                // A model kind that computes only the last position's logits (toy,
                // TorchScript) scored nothing: say so rather than answer without scores.
                caf::error e = make_error(ec::invalid_request,
                                          "model " + st.g.model +
                                              " cannot score a prompt (echo with logprobs): "
                                              "its kind computes the last position only");
                return fail_generation(self, sp, e);
              }
              if (!r.stopped) {
                auto grown_from = r.text.size();
                if (!watch) {
                  if (r.decoder)
                    for (auto t : rep.tokens) r.text += r.decoder->push(t);
                  r.ids = rep.tokens;
                  r.logprobs = std::move(rep.logprobs);
                } else if (rep.stop_id >= 0 && rep.logprobs.size() > rep.tokens.size()) {
                  // Streamed tokens came one by one; the stop id's entry comes last.
                  r.logprobs.push_back(std::move(rep.logprobs.back()));
                }
                if (rep.stop_id >= 0) r.stop_id = rep.stop_id;
                if (r.decoder) r.text += r.decoder->finish();
                if (auto at = st.stops.find(r.text, grown_from)) {
                  r.text.resize(cut_at(st, r.text, *at));
                  r.stopped = true;
                }
                // The stop id was generated too, as vLLM counts it (not shown in the text).
                r.completion_tokens = rep.tokens.size() + (rep.stop_id >= 0 ? 1 : 0);
              }
              r.finish = r.stopped || rep.finish_reason == "stop" ? "stop" : "length";
              if (st.g.stream && !st.failed) {
                stream_text(st, i, true);
                send_role(st, i);
                send_event(st,
                           chunk_json(st, i, "", r.finish,
                                      logprobs_json(st, r, r.logprobs_sent, r.logprobs.size())));
                r.logprobs_sent = r.logprobs.size();
              }
              if (--st.left == 0 && !st.failed) finish_generation(self, st);
            },
            [=](caf::error& e) {
              sp->rows[i].done = true;
              fail_generation(self, sp, e);
            });
  }
  return {
      [=](actors::token_atom, uint64_t id, uint32_t row, int64_t token,
          actors::token_logprobs& lp) {
        auto& st = *sp;
        if (row >= st.rows.size()) return;
        auto& r = st.rows[row];
        r.id = id;
        if (r.done || r.stopped || st.failed) return;
        ++r.tokens;
        r.ids.push_back(token);
        if (st.g.sampling.logprobs >= 0) r.logprobs.push_back(std::move(lp));
        auto grown_from = r.text.size();
        if (r.decoder) r.text += r.decoder->push(token);
        if (auto at = st.stops.find(r.text, grown_from)) {
          r.text.resize(cut_at(st, r.text, *at));
          r.stopped = true;
          r.completion_tokens = r.tokens;
          cancel_row(self, st, r);
          if (st.g.stream) stream_text(st, row, true);
          return;
        }
        if (st.g.stream) stream_text(st, row, false);
      },
  };
}

}  // namespace computron::net
