#include "net/http_server.hpp"

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "models/tokenizer.hpp"
#include "net/llm_api.hpp"
#include "net/metrics.hpp"
#include "net/routes.hpp"
#include "net/trace.hpp"

namespace computron::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using response = http::response<http::string_body>;
using request = http::request<http::string_body>;
/// Hands a response back to the connection (from any thread).
using responder = std::function<void(response)>;

namespace {

response make_json(http::status status, const json& body) {
  response res{status, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = body.dump();
  return res;
}

response make_error_response(http::status status, const std::string& message) {
  return make_json(status, json{{"error", message}});
}

/// The HTTP status of an error, and whether a retry may succeed (Retry-After).
http::status status_of(const caf::error& e, bool& retry) {
  auto status = http::status::internal_server_error;
  retry = false;
  if (e.category() == error_category) {
    switch (static_cast<ec>(e.code())) {
      case ec::invalid_request:
      case ec::invalid_configuration:
        status = http::status::bad_request;
        break;
      case ec::unknown_model:
        status = http::status::not_found;
        break;
      case ec::overloaded:
        status = http::status::too_many_requests;
        retry = true;
        break;
      case ec::invalid_state:
        status = http::status::conflict;
        break;
      case ec::deadline_exceeded:
      case ec::unavailable:
        status = http::status::service_unavailable;
        retry = true;
        break;
      case ec::out_of_device_memory:
        // The model cannot fit on its devices: retrying will not help.
        status = http::status::service_unavailable;
        break;
      default:
        break;
    }
  } else if (e == caf::sec::request_timeout || e == caf::sec::request_receiver_down) {
    status = http::status::service_unavailable;
    retry = true;
  }
  return status;
}

response error_response(const caf::error& e) {
  bool retry = false;
  auto res = make_error_response(status_of(e, retry), render(e));
  if (retry) res.set(http::field::retry_after, "1");
  return res;
}

/// The error's name as OpenAI's `code` ("model_not_found" as OpenAI calls it).
std::string code_of(const caf::error& e) {
  if (e.category() != error_category) return "server_error";
  auto c = static_cast<ec>(e.code());
  return c == ec::unknown_model ? "model_not_found" : to_string(c);
}

/// An error in OpenAI's shape, with the same HTTP status as the KServe routes.
response openai_error_response(const caf::error& e, const std::string& param = {}) {
  bool retry = false;
  auto status = status_of(e, retry);
  auto res =
      make_json(status, openai_error(static_cast<int>(status), render(e), code_of(e), param));
  if (retry) res.set(http::field::retry_after, "1");
  return res;
}

response openai_bad_request(const request_error& e) {
  return make_json(http::status::bad_request,
                   openai_error(400, "invalid_request: " + e.message, "invalid_request", e.param));
}

json info_json(const actors::model_info& i) {
  return json{{"name", i.config.name},
              {"kind", i.config.kind},
              {"spec", i.config.spec},
              {"dtype", i.config.dtype},
              {"tp", i.config.tp},
              {"pp", i.config.pp},
              {"devices", i.config.devices},
              {"state", i.state},
              {"bytes", i.bytes},
              {"queued", i.queued},
              {"pinned", i.config.pinned},
              {"served", i.served},
              {"loads", i.loads},
              {"evictions", i.evictions},
              {"vocab", i.vocab},
              {"max_positions", i.max_positions},
              {"tokenizer", !i.config.tokenizer.empty()},
              {"reason", i.reason}};
}

/// Triton's model state (READY, LOADING, UNLOADING, UNAVAILABLE) and its reason, from
/// ours. A registered model is READY whether or not it is resident: it is swapped in on
/// demand.
std::pair<std::string, std::string> triton_state(const actors::model_info& i) {
  if (i.state == "registering") return {"LOADING", ""};
  if (i.state == "unregistering") return {"UNLOADING", ""};
  if (i.state == "failed") return {"UNAVAILABLE", i.reason};
  if (i.state == "unloaded" || i.state == "unregistered") return {"UNAVAILABLE", "unloaded"};
  if (i.state == "unavailable")
    return {"UNAVAILABLE", i.reason.empty() ? "a device of it is unreachable" : i.reason};
  return {"READY", ""};
}

/// A response written in pieces: Server-Sent Events over chunked encoding. Any thread.
class sse_channel {
 public:
  virtual ~sse_channel() = default;
  /// Sends one event, "data: <payload>\n\n".
  virtual void send(std::string payload) = 0;
  /// Ends the response; the connection closes after it.
  virtual void end() = 0;
};

/// Starts a streamed response (200, text/event-stream) on the request's connection.
using sse_opener = std::function<std::shared_ptr<sse_channel>()>;
/// Registers what to do if the client goes away before its answer is written (called
/// at most once, from an I/O thread; at once if it is already gone). Work that takes a
/// while registers one, so nobody keeps computing an answer nobody will read.
using gone_hook = std::function<void(std::function<void()>)>;

/// Makes an actor that serves one request exit; the frontend then cancels its requests.
std::function<void()> exit_on_gone(caf::actor a) {
  return [a = std::move(a)] { caf::anon_send_exit(a, caf::exit_reason::user_shutdown); };
}

/// Which text API a generation answers in.
enum class text_api { openai, triton };

/// One prompt of a text request while it generates.
struct gen_row {
  std::vector<int64_t> prompt;
  std::unique_ptr<models::stream_decoder> decoder;
  /// The generated text, cut before a stop string once one appeared.
  std::string text;
  /// Bytes of `text` already streamed.
  size_t emitted = 0;
  size_t tokens = 0;
  size_t completion_tokens = 0;
  bool stopped = false;
  bool done = false;
  std::string finish;
  /// The frontend's request id, known from the first token.
  std::optional<uint64_t> id;
};

struct gen_state {
  generation_request g;
  text_api api = text_api::openai;
  std::shared_ptr<const models::tokenizer> tok;
  /// The model's vocabulary: the tokenizer's EOS stops generation only inside it.
  int64_t vocab = 0;
  models::stop_matcher stops;
  std::vector<gen_row> rows;
  size_t left = 0;
  std::string completion_id;
  int64_t created = 0;
  responder reply;
  sse_opener open_sse;
  std::shared_ptr<sse_channel> sse;
  /// Takes cancels of rows cut at a stop string.
  actors::frontend_actor frontend;
  bool failed = false;
};

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

}  // namespace

namespace {

json settings_json(const caf::config_value& v) {
  auto& d = v.get_data();
  if (auto x = caf::get_if<caf::config_value::integer>(&d)) return *x;
  if (auto x = caf::get_if<caf::config_value::boolean>(&d)) return *x;
  if (auto x = caf::get_if<caf::config_value::real>(&d)) return *x;
  if (auto x = caf::get_if<std::string>(&d)) return *x;
  if (auto x = caf::get_if<caf::config_value::list>(&d)) {
    json out = json::array();
    for (auto& e : *x) out.push_back(settings_json(e));
    return out;
  }
  if (auto x = caf::get_if<caf::config_value::dictionary>(&d)) {
    json out = json::object();
    for (auto& [k, e] : *x) out[k] = settings_json(e);
    return out;
  }
  return caf::to_string(v);
}

/// The merged status (every actor's report) plus a per-node summary an operator reads
/// first: which nodes answer, their devices' memory and link, what is resident.
json status_json(const caf::settings& s) {
  json all = json::object();
  for (auto& [k, v] : s) all[k] = settings_json(v);
  json nodes = json::object();
  if (all.contains("devices") && all["devices"].is_array()) {
    for (auto& d : all["devices"]) {
      auto name = d.value("node", std::string{"local"});
      auto& n = nodes[name];
      if (!n.contains("online")) n["online"] = true;
      if (!d.value("online", true) || d.contains("error")) n["online"] = false;
      n["devices"].push_back(d.value("device", int64_t{-1}));
    }
  }
  json list = json::array();
  for (auto& [name, n] : nodes.items()) {
    json e = n;
    e["node"] = name;
    list.push_back(std::move(e));
  }
  all["nodes"] = std::move(list);
  return all;
}

}  // namespace

struct http_server::impl {
  caf::actor_system& sys;
  actors::frontend_actor frontend;
  std::shared_ptr<metrics> metrics_;
  std::shared_ptr<trace_recorder> trace;
  http_options opts;
  /// Model control (index, load, unload, unregister); null: over the frontend only.
  actors::repository_actor repository;
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
  uint16_t bound_port = 0;
  /// Tokenizers by path, read once (a GPT-2 vocabulary takes a moment to parse).
  std::mutex tokenizers_mtx;
  std::map<std::string, std::shared_ptr<const models::tokenizer>> tokenizers;

  impl(caf::actor_system& s, actors::frontend_actor fe, std::shared_ptr<metrics> m,
       std::shared_ptr<trace_recorder> t, http_options o, actors::repository_actor r)
      : sys(s),
        frontend(std::move(fe)),
        metrics_(std::move(m)),
        trace(std::move(t)),
        opts(std::move(o)),
        repository(std::move(r)) {}

  /// Asks the frontend and answers with `ok(result)` or the error's response. Runs in
  /// a short-lived actor so that no I/O thread ever blocks on an actor.
  template <class T, class OnOk, class... Ts>
  void ask(responder reply, OnOk ok, Ts... xs) {
    ask_with<T>(
        reply, ok, [](const caf::error& e) { return error_response(e); }, xs...);
  }

  /// ask() with OpenAI's error shape.
  template <class T, class OnOk, class... Ts>
  void ask_openai(responder reply, OnOk ok, Ts... xs) {
    ask_with<T>(
        reply, ok, [](const caf::error& e) { return openai_error_response(e); }, xs...);
  }

  template <class T, class OnOk, class OnErr, class... Ts>
  void ask_with(responder reply, OnOk ok, OnErr on_err, Ts... xs) {
    ask_actor<T>(frontend, reply, ok, on_err, xs...);
  }

  /// ask() of any actor (the frontend, the repository).
  template <class T, class Handle, class OnOk, class OnErr, class... Ts>
  void ask_actor(Handle target, responder reply, OnOk ok, OnErr on_err, Ts... xs) {
    auto timeout = caf::timespan{opts.request_timeout};
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(target, timeout, xs...)
          .then(
              [=](T& r) {
                reply(ok(r));
                self->quit();
              },
              [=](caf::error& e) {
                reply(on_err(e));
                self->quit();
              });
    });
  }

  void infer(const std::string& model, const std::string& body, responder reply,
             gone_hook on_gone) {
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded())
      return reply(make_error_response(http::status::bad_request,
                                       "invalid_request: the body is not valid JSON"));
    auto p = parse_infer_body(j, opts.max_batch_rows, opts.max_tokens);
    if (auto e = std::get_if<request_error>(&p))
      return reply(
          make_error_response(http::status::bad_request, "invalid_request: " + e->message));
    auto fe = frontend;
    auto timeout = caf::timespan{opts.request_timeout};
    auto parsed = std::make_shared<infer_body>(std::move(std::get<infer_body>(p)));
    auto asker = sys.spawn([=](caf::event_based_actor* self) {
      auto rows = parsed->rows.size();
      auto j = actors::make_join<actors::infer_reply>(
          rows,
          [=](std::vector<actors::infer_reply> rs) {
            json data = json::array();
            double queue_ms = 0, load_ms = 0, compute_ms = 0, total_ms = 0;
            bool swapped = false;
            uint32_t batch = 0;
            for (auto& r : rs) {
              for (auto t : r.tokens) data.push_back(t);
              queue_ms = std::max(queue_ms, r.queue_ms);
              load_ms = std::max(load_ms, r.load_ms);
              compute_ms = std::max(compute_ms, r.compute_ms);
              total_ms = std::max(total_ms, r.total_ms);
              swapped = swapped || r.swapped;
              batch = std::max(batch, r.batch_size);
            }
            json out{{"model_name", model},
                     {"outputs", json::array({json{{"name", "output_ids"},
                                                   {"datatype", "INT64"},
                                                   {"shape", {rows, parsed->max_tokens}},
                                                   {"data", data}}})},
                     {"parameters",
                      {{"queue_ms", queue_ms},
                       {"load_ms", load_ms},
                       {"compute_ms", compute_ms},
                       {"total_ms", total_ms},
                       {"batch_size", batch},
                       {"swapped", swapped}}}};
            if (!parsed->request_id.empty()) out["id"] = parsed->request_id;
            reply(make_json(http::status::ok, out));
            self->quit();
          },
          [=](caf::error e, size_t) {
            reply(error_response(e));
            self->quit();
          });
      for (size_t r = 0; r < rows; ++r) {
        actors::infer_request req;
        req.model = model;
        req.tokens = parsed->rows[r];
        req.max_tokens = parsed->max_tokens;
        req.sampling = parsed->sampling;
        req.sampling.seed = parsed->sampling.seed + r;
        req.deadline_ms = parsed->deadline_ms;
        req.drop_late = parsed->drop_late;
        self->request(fe, timeout, actors::infer_atom_v, std::move(req))
            .then([=](actors::infer_reply& rep) { j->ok(r, std::move(rep)); },
                  [=](caf::error& e) { j->failed(std::move(e), r); });
      }
    });
    on_gone(exit_on_gone(asker));
  }

  caf::expected<std::shared_ptr<const models::tokenizer>> tokenizer_of(
      const actors::model_info& i) {
    const auto& path = i.config.tokenizer;
    if (path.empty())
      return make_error(ec::invalid_request,
                        "model " + i.config.name +
                            " has no tokenizer, so it takes token ids only: send them to "
                            "/v2/models/" +
                            i.config.name +
                            "/infer, or give the model a tokenizer (configs/README.md)");
    if (path == "bytes") return models::tokenizer::bytes();
    std::lock_guard<std::mutex> guard{tokenizers_mtx};
    if (auto t = tokenizers.find(path); t != tokenizers.end()) return t->second;
    auto t = models::tokenizer::open(path);
    if (!t) return with_context(t.error(), "model " + i.config.name);
    tokenizers.emplace(path, *t);
    return *t;
  }

  /// A text request (OpenAI completions, Triton generate): read strictly, then the
  /// model's tokenizer, then a generation actor does the rest.
  void text_request(text_api api, const std::string& model, const std::string& body, bool stream,
                    responder reply, sse_opener open_sse, gone_hook on_gone) {
    auto bad = [&](const request_error& e) {
      reply(api == text_api::openai
                ? openai_bad_request(e)
                : make_error_response(http::status::bad_request, "invalid_request: " + e.message));
    };
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded()) return bad({"the body is not valid JSON", ""});
    auto parsed = api == text_api::openai
                      ? parse_completion(j, opts.max_batch_rows, opts.max_tokens)
                      : parse_generate(j, model, stream, opts.max_tokens);
    if (auto e = std::get_if<request_error>(&parsed)) return bad(*e);
    auto g = std::make_shared<generation_request>(std::move(std::get<generation_request>(parsed)));
    auto fe = frontend;
    auto timeout = caf::timespan{opts.request_timeout};
    auto fail = [api, reply](const caf::error& e) {
      reply(api == text_api::openai ? openai_error_response(e) : error_response(e));
    };
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(fe, caf::timespan{std::chrono::seconds(10)}, actors::info_atom_v, g->model)
          .then(
              [=](actors::model_info& info) {
                self->quit();
                auto tok = tokenizer_of(info);
                if (!tok) return fail(tok.error());
                auto st = std::make_shared<gen_state>();
                st->g = std::move(*g);
                st->api = api;
                st->tok = *tok;
                st->vocab = info.vocab;
                st->reply = reply;
                st->open_sse = open_sse;
                st->created = std::chrono::duration_cast<std::chrono::seconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
                static std::atomic<uint64_t> next_completion{1};
                st->completion_id = "cmpl-" + std::to_string(next_completion++);
                for (auto& p : st->g.prompts) {
                  gen_row r;
                  if (auto text = std::get_if<std::string>(&p))
                    r.prompt = (*tok)->encode(*text);
                  else
                    r.prompt = std::get<std::vector<int64_t>>(p);
                  st->rows.push_back(std::move(r));
                }
                on_gone(exit_on_gone(self->home_system().spawn(generation, st, fe, timeout)));
              },
              [=](caf::error& e) {
                fail(e);
                self->quit();
              });
    });
  }

  /// Routes one request; every path ends in exactly one call of `reply`, or in a stream
  /// opened with `open_sse` and ended. Inference registers with `on_gone`.
  void route(const request& req, responder reply, sse_opener open_sse, gone_hook on_gone) {
    auto method = req.method_string();
    auto target_in = req.target();
    auto matched = match_route(std::string_view{method.data(), method.size()},
                               std::string_view{target_in.data(), target_in.size()});
    if (auto no = std::get_if<route_refusal>(&matched))
      return reply(make_error_response(static_cast<http::status>(no->status), no->message));
    auto& m = std::get<route_match>(matched);
    const auto& model = m.model;
    switch (m.id) {
      case route_id::live:
        return reply(make_json(http::status::ok, json{{"live", !stopped.load()}}));
      case route_id::ready:
        // Ready when every model the server was asked to serve can: none is registering,
        // failed to register, or has a device out of reach. Models only in the repository
        // (never loaded, or unregistered) do not count. 503 otherwise, with the reasons.
        if (stopped.load())
          return reply(make_json(http::status::service_unavailable,
                                 json{{"ready", false}, {"reason", "the server is stopping"}}));
        return ask<std::vector<actors::model_info>>(
            reply,
            [](std::vector<actors::model_info>& ms) {
              json not_ready = json::array();
              for (auto& i : ms) {
                auto [state, reason] = triton_state(i);
                if (state != "READY")
                  not_ready.push_back(
                      {{"name", i.config.name}, {"state", state}, {"reason", reason}});
              }
              if (not_ready.empty()) return make_json(http::status::ok, json{{"ready", true}});
              return make_json(http::status::service_unavailable,
                               json{{"ready", false}, {"not_ready", not_ready}});
            },
            actors::list_atom_v);
      case route_id::server:
        return reply(make_json(http::status::ok, json{{"name", "computron"},
                                                      {"version", "0.1.0"},
                                                      {"extensions", {"model_repository"}}}));
      case route_id::status:
        return ask<caf::settings>(
            reply, [](caf::settings& s) { return make_json(http::status::ok, status_json(s)); },
            actors::report_atom_v);
      case route_id::metrics: {
        response res{http::status::ok, 11};
        res.set(http::field::content_type, "text/plain; version=0.0.4");
        res.body() = metrics_ ? metrics_->render() : std::string{};
        return reply(std::move(res));
      }
      case route_id::trace: {
        if (!trace) return reply(make_error_response(http::status::not_found, "tracing is off"));
        response res{http::status::ok, 11};
        res.set(http::field::content_type, "application/json");
        res.body() = trace->to_json();
        return reply(std::move(res));
      }
      case route_id::repository_index: {
        // Body: nothing, or {"ready": true} for the READY ones only (Triton's filter).
        auto filter = index_filter(req.body());
        if (auto why = std::get_if<std::string>(&filter))
          return reply(make_error_response(http::status::bad_request, "invalid_request: " + *why));
        auto ok = [only_ready = std::get<bool>(filter)](std::vector<actors::model_info>& ms) {
          json out = json::array();
          for (auto& i : ms) {
            auto [state, reason] = triton_state(i);
            if (only_ready && state != "READY") continue;
            json e{{"name", i.config.name}, {"version", "1"}, {"state", state}, {"reason", reason}};
            if (state == "READY" || state == "UNLOADING") e["residency"] = i.state;
            out.push_back(std::move(e));
          }
          return make_json(http::status::ok, out);
        };
        if (repository)
          return ask_actor<std::vector<actors::model_info>>(
              repository, reply, ok, [](const caf::error& e) { return error_response(e); },
              actors::list_atom_v);
        return ask<std::vector<actors::model_info>>(reply, ok, actors::list_atom_v);
      }
      case route_id::models_list:
        return ask_openai<std::vector<actors::model_info>>(
            reply,
            [](std::vector<actors::model_info>& ms) {
              json data = json::array();
              for (auto& i : ms)
                data.push_back(json{{"id", i.config.name},
                                    {"object", "model"},
                                    {"created", 0},
                                    {"owned_by", "computron"},
                                    {"max_model_len", i.max_positions}});
              return make_json(http::status::ok, json{{"object", "list"}, {"data", data}});
            },
            actors::list_atom_v);
      case route_id::completions:
        return text_request(text_api::openai, {}, req.body(), false, std::move(reply),
                            std::move(open_sse), std::move(on_gone));
      case route_id::chat_completions: {
        // No model here declares a chat template (OPT has none): say so for a known model,
        // 404 for an unknown one, as OpenAI would.
        auto j = json::parse(req.body(), nullptr, false);
        auto name = j.is_object() && j.contains("model") && j["model"].is_string()
                        ? j["model"].get<std::string>()
                        : std::string{};
        if (name.empty()) return reply(openai_bad_request({"'model' must name a model", "model"}));
        return ask_openai<actors::model_info>(
            reply,
            [](actors::model_info& i) {
              return make_json(
                  http::status::bad_request,
                  openai_error(400,
                               "invalid_request: model " + i.config.name +
                                   " declares no chat template; send a prompt to /v1/completions",
                               "invalid_request", "messages"));
            },
            actors::info_atom_v, name);
      }
      case route_id::repository_load:
      case route_id::repository_unload: {
        bool load = m.id == route_id::repository_load;
        auto ok = [](actors::model_info& i) { return make_json(http::status::ok, info_json(i)); };
        auto fail = [](const caf::error& e) { return error_response(e); };
        // load: no parameters (a model's settings come from its folder). unload:
        // "unregister" also frees its host memory and forgets it until the next load;
        // "unload_dependents" is accepted and has nothing to do (no ensembles here).
        auto params = load ? control_parameters(req.body(), {})
                           : control_parameters(req.body(), {"unregister", "unload_dependents"});
        if (auto why = std::get_if<std::string>(&params))
          return reply(make_error_response(http::status::bad_request, "invalid_request: " + *why));
        bool unregister = std::get<json>(params).value("unregister", false);
        if (repository) {
          if (load)
            return ask_actor<actors::model_info>(repository, reply, ok, fail, actors::load_atom_v,
                                                 model);
          return ask_actor<actors::model_info>(repository, reply, ok, fail, actors::unload_atom_v,
                                               model, unregister);
        }
        if (unregister)
          return reply(make_error_response(http::status::bad_request,
                                           "invalid_request: this server has no model control "
                                           "(unregister needs a repository actor)"));
        if (load) return ask<actors::model_info>(reply, ok, actors::load_atom_v, model);
        return ask<actors::model_info>(reply, ok, actors::unload_atom_v, model);
      }
      case route_id::model_metadata:
        return ask<actors::model_info>(
            reply,
            [](actors::model_info& i) {
              auto j = json{
                  {"name", i.config.name},
                  {"versions", {"1"}},
                  {"platform", "computron_" + i.config.kind},
                  {"inputs", {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {-1, -1}}}}},
                  {"outputs",
                   {{{"name", "output_ids"}, {"datatype", "INT64"}, {"shape", {-1, -1}}}}},
                  {"parameters", info_json(i)}};
              return make_json(http::status::ok, j);
            },
            actors::info_atom_v, model);
      case route_id::model_ready:
        // Every registered model can serve (an offloaded one is swapped in on demand)
        // unless a device of it is on a node that is gone. 200 when it can serve, else 503
        // with the reason (Kubernetes probes read the status).
        return ask<actors::model_info>(
            reply,
            [](actors::model_info& i) {
              auto [state, reason] = triton_state(i);
              bool ready = state == "READY";
              json j{{"name", i.config.name}, {"ready", ready}, {"state", i.state}};
              if (!ready) j["reason"] = reason;
              return make_json(ready ? http::status::ok : http::status::service_unavailable, j);
            },
            actors::info_atom_v, model);
      case route_id::infer:
        return infer(model, req.body(), std::move(reply), std::move(on_gone));
      case route_id::generate:
      case route_id::generate_stream:
        return text_request(text_api::triton, model, req.body(), m.id == route_id::generate_stream,
                            std::move(reply), std::move(open_sse), std::move(on_gone));
    }
    reply(make_error_response(http::status::internal_server_error, "unrouted " + m.target));
  }
};

namespace {

class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, http_server::impl& srv) : stream_(std::move(socket)), srv_(srv) {}

  void run() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(srv_.opts.max_body_bytes);
    stream_.expires_after(srv_.opts.idle_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted)
      return close();
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      linger_ = true;
      return write(make_error_response(
          http::status::payload_too_large,
          "the body exceeds " + std::to_string(srv_.opts.max_body_bytes) + " bytes"));
    }
    if (ec) {
      keep_alive_ = false;
      linger_ = true;
      return write(make_error_response(http::status::bad_request,
                                       "malformed HTTP request: " + ec.message()));
    }
    auto req = parser_->release();
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    answered_ = false;
    // The connection waits for the answer without a read deadline.
    stream_.expires_never();
    auto self = shared_from_this();
    auto seq = ++requests_;
    srv_.route(
        req,
        [self](response res) {
          asio::post(self->stream_.get_executor(),
                     [self, res = std::move(res)]() mutable { self->write(std::move(res)); });
        },
        [self]() -> std::shared_ptr<sse_channel> {
          asio::post(self->stream_.get_executor(), [self] { self->start_sse(); });
          return std::make_shared<channel>(self);
        },
        [self, seq](std::function<void()> f) {
          asio::post(self->stream_.get_executor(),
                     [self, seq, f = std::move(f)]() mutable { self->on_gone(seq, std::move(f)); });
        });
  }

  /// Request `seq`'s gone hook. A hook that comes after its answer was written (or for
  /// an earlier request of this connection) has nothing left to stop.
  void on_gone(uint64_t seq, std::function<void()> f) {
    if (seq != requests_ || answered_) return;
    if (gone_) return f();
    on_gone_ = std::move(f);
    watch();
  }

  /// Reads while an answer is being worked on: end of stream or an error is the client
  /// gone (as nginx's 499: a client that half-closes its side counts as gone). Bytes are
  /// the next request (pipelining): they are kept for read(), and the watch ends.
  void watch() {
    if (watching_ || gone_) return;
    watching_ = true;
    stream_.socket().async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    if (sse_started_) {
      buffer_.consume(buffer_.size());  // bytes after a streamed request: ignored
      if (sse_ended_ || ec == asio::error::operation_aborted) return;
      if (ec) return client_gone();
      return watch();
    }
    if (after_watch_ != after::nothing) {
      // The answer was written meanwhile, and the watch cancelled to go on.
      auto next = std::exchange(after_watch_, after::nothing);
      if (next == after::read && (!ec || ec == asio::error::operation_aborted)) return read();
      return close();
    }
    if (ec && ec != asio::error::operation_aborted) client_gone();
  }

  void client_gone() {
    if (gone_) return;
    gone_ = true;
    if (sse_started_) return sse_lost();
    if (auto f = std::exchange(on_gone_, nullptr)) f();
  }

  /// The session's side of a streamed response; its calls hop onto the session's strand.
  class channel final : public sse_channel {
   public:
    explicit channel(std::shared_ptr<session> s) : s_(std::move(s)) {}
    ~channel() override { end(); }
    void send(std::string payload) override {
      auto framed = std::make_shared<std::string>("data: " + std::move(payload) + "\n\n");
      asio::post(s_->stream_.get_executor(), [s = s_, framed] {
        s->sse_out_.push_back(framed);
        s->pump_sse();
      });
    }
    void end() override {
      asio::post(s_->stream_.get_executor(), [s = s_] {
        s->sse_ending_ = true;
        s->pump_sse();
      });
    }

   private:
    std::shared_ptr<session> s_;
  };

  /// Writes the stream's head (200, text/event-stream, chunked), then its events in
  /// order. A read waits meanwhile: the client closing its side is how a disconnect shows.
  void start_sse() {
    keep_alive_ = false;
    auto head = std::make_shared<http::response<http::empty_body>>(http::status::ok, version_);
    head->set(http::field::server, "computron");
    head->set(http::field::content_type, "text/event-stream");
    head->set(http::field::cache_control, "no-cache");
    head->keep_alive(false);
    head->chunked(true);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*head);
    sse_writing_ = true;
    sse_started_ = true;
    http::async_write_header(stream_, *sr,
                             [self = shared_from_this(), head, sr](beast::error_code ec, size_t) {
                               self->sse_writing_ = false;
                               if (ec) return self->sse_lost();
                               self->watch();
                               self->pump_sse();
                             });
  }

  void pump_sse() {
    if (sse_writing_ || sse_gone_ || sse_ended_) return;
    if (!sse_out_.empty()) {
      auto data = sse_out_.front();
      sse_out_.pop_front();
      sse_writing_ = true;
      asio::async_write(stream_, http::make_chunk(asio::buffer(*data)),
                        [self = shared_from_this(), data](beast::error_code ec, size_t) {
                          self->sse_writing_ = false;
                          if (ec) return self->sse_lost();
                          self->pump_sse();
                        });
      return;
    }
    if (!sse_ending_) return;
    sse_ended_ = true;
    sse_writing_ = true;
    asio::async_write(stream_, http::make_chunk_last(),
                      [self = shared_from_this()](beast::error_code, size_t) {
                        self->sse_writing_ = false;
                        self->close();
                      });
  }

  void sse_lost() {
    if (sse_gone_ || sse_ended_) return;
    sse_gone_ = true;
    sse_out_.clear();
    if (auto f = std::exchange(on_gone_, nullptr)) f();
    close();
  }

  void write(response res) {
    answered_ = true;
    on_gone_ = nullptr;
    res.version(version_);
    res.keep_alive(keep_alive_);
    res.set(http::field::server, "computron");
    res.prepare_payload();
    auto sp = std::make_shared<response>(std::move(res));
    http::async_write(stream_, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
      if (!ec && self->linger_) {
        self->close();
        self->linger_since_ = std::chrono::steady_clock::now();
        return self->drain();
      }
      bool next = !ec && !sp->need_eof();
      if (self->watching_) {
        // The watch's read must end before the next one starts: cancel it and go on from
        // its handler (the only operation left on the socket is that read).
        self->after_watch_ = next ? after::read : after::close;
        beast::error_code ignored;
        self->stream_.socket().cancel(ignored);
        return;
      }
      if (!next) return self->close();
      self->read();
    });
  }

  /// A lingering close, as nginx does after refusing a request early: the client may
  /// still be sending the body we refused, and closing with unread bytes makes the
  /// kernel reset the connection, which can discard our reply before the client reads
  /// it. So the write side is shut and what arrives is read and dropped until the client
  /// closes, for at most 30 s and 1 GiB; then the session ends and the socket closes.
  void drain() {
    constexpr uint64_t max_bytes = 1ull << 30;
    auto elapsed = std::chrono::steady_clock::now() - linger_since_;
    if (drained_ > max_bytes || elapsed > std::chrono::seconds(30)) return;
    if (drain_buf_.empty()) drain_buf_.resize(64 * 1024);
    stream_.expires_after(std::chrono::seconds(5));
    stream_.async_read_some(asio::buffer(drain_buf_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (!ec) self->drain();
                            });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http_server::impl& srv_;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  // A lingering close after an early refusal (413, malformed request).
  bool linger_ = false;
  std::chrono::steady_clock::time_point linger_since_{};
  uint64_t drained_ = 0;
  std::vector<char> drain_buf_;
  // A streamed response (Server-Sent Events), touched only on the strand.
  std::deque<std::shared_ptr<std::string>> sse_out_;
  bool sse_writing_ = false;
  bool sse_ending_ = false;
  bool sse_ended_ = false;
  bool sse_gone_ = false;
  bool sse_started_ = false;
  // The client's side while an answer is worked on (watch()).
  uint64_t requests_ = 0;
  bool answered_ = false;
  bool watching_ = false;
  bool gone_ = false;
  std::function<void()> on_gone_;
  enum class after { nothing, read, close } after_watch_ = after::nothing;
};

void accept(http_server::impl& srv) {
  srv.acceptor.async_accept(asio::make_strand(srv.ioc),
                            [&srv](beast::error_code ec, tcp::socket socket) {
                              if (ec) {
                                if (srv.stopped) return;
                                log::warn("http: accept failed: {}", ec.message());
                              } else {
                                std::make_shared<session>(std::move(socket), srv)->run();
                              }
                              accept(srv);
                            });
}

}  // namespace

http_server::http_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

http_server::~http_server() {
  stop();
}

uint16_t http_server::port() const {
  return impl_->bound_port;
}

void http_server::stop() {
  if (impl_->stopped.exchange(true)) return;
  asio::post(impl_->ioc, [this] {
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
}

caf::expected<std::unique_ptr<http_server>> http_server::start(
    caf::actor_system& sys, actors::frontend_actor frontend, std::shared_ptr<metrics> m,
    std::shared_ptr<trace_recorder> trace, http_options opts, actors::repository_actor repository) {
  if (opts.threads < 1) return make_error(ec::invalid_configuration, "http: at least one thread");
  auto p = std::make_unique<impl>(sys, std::move(frontend), std::move(m), std::move(trace),
                                  std::move(opts), std::move(repository));
  auto& o = p->opts;
  beast::error_code ec;
  auto addr = asio::ip::make_address(o.host, ec);
  if (ec)
    return make_error(ec::invalid_configuration,
                      "http: bad host address '" + o.host + "': " + ec.message());
  tcp::endpoint ep{addr, o.port};
  p->acceptor.open(ep.protocol(), ec);
  if (!ec) p->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) p->acceptor.bind(ep, ec);
  if (!ec) p->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error(ec::io_error, "http: cannot listen on " + o.host + ":" +
                                        std::to_string(o.port) + ": " + ec.message());
  p->bound_port = p->acceptor.local_endpoint().port();
  accept(*p);
  for (int i = 0; i < o.threads; ++i) p->threads.emplace_back([ioc = &p->ioc] { ioc->run(); });
  return std::unique_ptr<http_server>{new http_server(std::move(p))};
}

}  // namespace computron::net
