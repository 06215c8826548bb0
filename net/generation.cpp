#include "net/generation.hpp"

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

json chunk_json(const gen_state& st, size_t row, const std::string& text, const json& finish) {
  if (st.api == text_api::triton) {
    json j{{"model_name", st.g.model}, {"model_version", "1"}, {"text_output", text}};
    if (!finish.is_null()) j["finish_reason"] = finish;
    return j;
  }
  return json{
      {"id", st.completion_id},
      {"object", "text_completion"},
      {"created", st.created},
      {"model", st.g.model},
      {"choices",
       json::array({json{
           {"index", row}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
}

json usage_json(const gen_state& st) {
  size_t prompt = 0, completion = 0;
  for (auto& r : st.rows) {
    prompt += r.prompt.size();
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

void send_event(gen_state& st, const json& j) {
  open_stream(st);
  st.sse->send(j.dump(-1, ' ', false, json::error_handler_t::replace));
}

/// Streams what of a row's text is safe to show (never the start of a stop string).
void stream_text(gen_state& st, size_t row, bool all) {
  auto& r = st.rows[row];
  auto upto = all ? r.text.size() : st.stops.safe_prefix(r.text);
  if (upto <= r.emitted) return;
  send_event(st, chunk_json(st, row, r.text.substr(r.emitted, upto - r.emitted), nullptr));
  r.emitted = upto;
}

/// Every row answered: the whole response, or the stream's end.
void finish_generation(caf::event_based_actor* self, gen_state& st) {
  if (st.g.stream) {
    if (st.api == text_api::openai) {
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
    json out{{"model_name", st.g.model},
             {"model_version", "1"},
             {"text_output", r.text},
             {"finish_reason", r.finish},
             {"usage", usage_json(st)}};
    response res{http::status::ok, 11};
    res.set(http::field::content_type, "application/json");
    res.body() = out.dump(-1, ' ', false, json::error_handler_t::replace);
    st.reply(std::move(res));
  } else {
    json choices = json::array();
    for (size_t i = 0; i < st.rows.size(); ++i)
      choices.push_back(json{{"index", i},
                             {"text", st.rows[i].text},
                             {"logprobs", nullptr},
                             {"finish_reason", st.rows[i].finish}});
    json out{{"id", st.completion_id}, {"object", "text_completion"}, {"created", st.created},
             {"model", st.g.model},    {"choices", choices},          {"usage", usage_json(st)}};
    response res{http::status::ok, 11};
    res.set(http::field::content_type, "application/json");
    res.body() = out.dump(-1, ' ', false, json::error_handler_t::replace);
    st.reply(std::move(res));
  }
  self->quit();
}

void cancel_row(caf::event_based_actor* self, gen_state& st, const gen_row& r) {
  if (r.id) self->send(st.frontend, actors::cancel_atom_v, *r.id);
}

}  // namespace

/// The actor behind one text request: sends one infer request per prompt with itself as
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
    st.rows[i].decoder = std::make_unique<models::stream_decoder>(st.tok);
    actors::infer_request req;
    req.model = st.g.model;
    req.tokens = st.rows[i].prompt;
    req.max_tokens = st.g.max_tokens;
    req.sampling = st.g.sampling;
    req.sampling.seed = st.g.sampling.seed + i;
    req.deadline_ms = st.g.deadline_ms;
    req.drop_late = st.g.drop_late;
    if (auto eos = st.tok->eos(); eos && *eos < st.vocab) req.eos = *eos;
    if (watch) {
      req.stream = caf::actor_cast<caf::actor>(self);
      req.stream_row = static_cast<uint32_t>(i);
    }
    self->request(fe, timeout, actors::infer_atom_v, std::move(req))
        .then(
            [=](actors::infer_reply& rep) {
              auto& st = *sp;
              auto& r = st.rows[i];
              r.done = true;
              if (!r.stopped) {
                auto grown_from = r.text.size();
                if (!watch)
                  for (auto t : rep.tokens) r.text += r.decoder->push(t);
                r.text += r.decoder->finish();
                if (auto at = st.stops.find(r.text, grown_from)) {
                  r.text.resize(*at);
                  r.stopped = true;
                }
                r.completion_tokens = rep.tokens.size();
              }
              r.finish = r.stopped || rep.finish_reason == "stop" ? "stop" : "length";
              if (st.g.stream && !st.failed) {
                stream_text(st, i, true);
                send_event(st, chunk_json(st, i, "", r.finish));
              }
              if (--st.left == 0 && !st.failed) finish_generation(self, st);
            },
            [=](caf::error& e) {
              auto& st = *sp;
              st.rows[i].done = true;
              --st.left;
              if (st.failed) return;
              st.failed = true;
              for (auto& r : st.rows)
                if (!r.done) cancel_row(self, st, r);
              if (st.sse) {
                // Mid-stream: the error is the last event.
                bool retry = false;
                auto status = static_cast<int>(status_of(e, retry));
                send_event(st, openai_error(status, render(e), code_of(e)));
                if (st.api == text_api::openai) st.sse->send("[DONE]");
                st.sse->end();
              } else {
                st.reply(st.api == text_api::openai ? openai_error_response(e) : error_response(e));
              }
              self->quit();
            });
  }
  return {
      [=](actors::token_atom, uint64_t id, uint32_t row, int64_t token) {
        auto& st = *sp;
        if (row >= st.rows.size()) return;
        auto& r = st.rows[row];
        r.id = id;
        if (r.done || r.stopped || st.failed) return;
        ++r.tokens;
        auto grown_from = r.text.size();
        r.text += r.decoder->push(token);
        if (auto at = st.stops.find(r.text, grown_from)) {
          r.text.resize(*at);
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
