#include "net/http/http_server.hpp"

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>
#include <vector>

#include <fmt/ranges.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "net/http/generation.hpp"
#include "net/http/http_transport.hpp"
#include "net/http/llm_api.hpp"
#include "net/http/replies.hpp"
#include "net/http/routes.hpp"
#include "net/http/text_models.hpp"
#include "net/metrics.hpp"
#include "net/trace.hpp"
#include "text/tokenizer.hpp"

namespace computron::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using request = http::request<http::string_body>;

using namespace replies;

struct http_server::impl {
  caf::actor_system& sys;
  actors::frontend_actor frontend;
  std::shared_ptr<metrics> metrics_;
  std::shared_ptr<trace_recorder> trace;
  http_options opts;
  /// Model control (index, load, unload, unregister); null: over the frontend only.
  actors::registry_actor registry;
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
  /// The connections' side: accepts and reads requests, hands them to route().
  std::unique_ptr<transport::listener> listen;
  uint16_t bound_port = 0;
  /// Tokenizers, chat templates and generation defaults: serve's directory, where
  /// registration opened them.
  text_models texts;

  impl(caf::actor_system& s, actors::frontend_actor fe, std::shared_ptr<metrics> m,
       std::shared_ptr<trace_recorder> t, http_options o, actors::registry_actor r,
       std::shared_ptr<text::text_directory> d)
      : sys(s),
        frontend(std::move(fe)),
        metrics_(std::move(m)),
        trace(std::move(t)),
        opts(std::move(o)),
        registry(std::move(r)),
        texts(std::move(d)) {}

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

  /// ask() of any actor (the frontend, the registry).
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

  /// The largest max_tokens a body may ask for: the configured limit, else as many as an
  /// int32 holds (the model's context then refuses what it cannot hold, with its size).
  int64_t max_tokens_cap() const {
    return opts.max_tokens > 0 ? opts.max_tokens : std::numeric_limits<int32_t>::max();
  }

  /// One model as the index lists it: as the frontend knows it, else (a name the manager
  /// does not know) as the registry reads its folder, where there is a registry. The
  /// registry reads folders on its own thread, so only unknown names go there.
  template <class OnOk, class OnErr>
  void info_of(const std::string& model, OnOk ok, OnErr on_err) {
    auto timeout = caf::timespan{opts.request_timeout};
    auto fe = frontend;
    auto repo = registry;
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(fe, timeout, actors::info_atom_v, model)
          .then(
              [=](actors::model_info& i) {
                self->quit();
                ok(i);
              },
              [=](caf::error& e) {
                if (!repo || !is(e, ec::unknown_model)) {
                  self->quit();
                  return on_err(e);
                }
                self->request(repo, timeout, actors::info_atom_v, model)
                    .then(
                        [=](actors::model_info& i) {
                          self->quit();
                          ok(i);
                        },
                        [=](caf::error& e2) {
                          self->quit();
                          on_err(e2);
                        });
              });
    });
  }

  /// `e` as the client should read it: a model the manager does not know but the
  /// repository lists (an unreadable folder, one not loaded) gets the index's reason
  /// instead of "no model named". Calls `done` with the error to answer, from any thread.
  void explain(const std::string& model, caf::error e, std::function<void(caf::error)> done) {
    if (!registry || !is(e, ec::unknown_model)) return done(std::move(e));
    info_of(
        model,
        [=](actors::model_info& i) {
          auto why = serving_error(i);
          done(why ? why : e);
        },
        [=](const caf::error&) { done(e); });
  }

  void infer(const std::string& model, const std::string& body, responder reply,
             gone_hook on_gone) {
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded())
      return reply(make_error_response(http::status::bad_request,
                                       "invalid_request: the body is not valid JSON"));
    auto p = parse_infer_body(j, opts.max_batch_rows, max_tokens_cap());
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
            explain(model, std::move(e), [reply](caf::error x) { reply(error_response(x)); });
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

  /// A text request (OpenAI completions and chat, Triton generate): read strictly, then
  /// the model's text files, then a generation actor does the rest.
  void text_request(text_api api, const std::string& model, const std::string& body, bool stream,
                    responder reply, sse_opener open_sse, gone_hook on_gone) {
    auto bad = [&](const request_error& e) {
      reply(api != text_api::triton
                ? openai_bad_request(e)
                : make_error_response(http::status::bad_request, "invalid_request: " + e.message));
    };
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded()) return bad({"the body is not valid JSON", ""});
    auto parsed = api == text_api::openai
                      ? parse_completion(j, opts.max_batch_rows, max_tokens_cap())
                  : api == text_api::chat ? parse_chat(j, opts.max_batch_rows, max_tokens_cap())
                                          : parse_generate(j, model, stream, max_tokens_cap());
    if (auto e = std::get_if<request_error>(&parsed)) return bad(*e);
    auto g = std::make_shared<generation_request>(std::move(std::get<generation_request>(parsed)));
    auto fe = frontend;
    auto timeout = caf::timespan{opts.request_timeout};
    auto limit = max_tokens_cap();
    auto fail = [api, reply](const caf::error& e) {
      reply(api == text_api::triton ? error_response(e) : openai_error_response(e));
    };
    // The model as the index lists it: one that cannot serve answers with the reason
    // before its tokenizer is looked at.
    info_of(
        g->model,
        [=](actors::model_info& info) {
          if (auto why = serving_error(info)) return fail(why);
          auto text = texts.of(info);
          if (!text) return fail(text.error());
          auto st = std::make_shared<gen_state>();
          st->g = std::move(*g);
          st->api = api;
          st->tok = (*text)->tok;
          st->vocab = info.vocab;
          st->reply = reply;
          st->open_sse = open_sse;
          st->created = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
          st->completion_id =
              !st->g.request_id.empty()
                  ? st->g.request_id
                  : fresh_completion_id(api == text_api::chat ? "chatcmpl-" : "cmpl-");
          if (!st->g.ignored.empty())
            log::debug("{} request for {}: ignored {}",
                       api == text_api::chat ? "chat" : "completion", st->g.model,
                       fmt::join(st->g.ignored, ", "));
          if (auto err = prepare_rows(*st, **text, info, limit)) return fail(err);
          on_gone(exit_on_gone(sys.spawn(generation, st, fe, timeout)));
        },
        [=](const caf::error& e) { fail(e); });
  }

  /// Calls `ok(info, text)` with a model that can serve text, else `fail` with why.
  template <class OnOk, class OnErr>
  void with_text(const std::string& model, OnOk ok, OnErr fail) {
    info_of(
        model,
        [=](actors::model_info& info) {
          if (auto why = serving_error(info)) return fail(why);
          auto text = texts.of(info);
          if (!text) return fail(text.error());
          ok(info, **text);
        },
        [=](const caf::error& e) { fail(e); });
  }

  /// POST /tokenize and /detokenize, as vLLM serves them.
  void tokenize(const std::string& body, bool forward, responder reply) {
    auto fail = [reply](const caf::error& e) { reply(openai_error_response(e)); };
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded()) return reply(openai_bad_request({"the body is not valid JSON", ""}));
    if (!forward) {
      auto d = parse_detokenize(j);
      if (auto e = std::get_if<request_error>(&d)) return reply(openai_bad_request(*e));
      auto req = std::get<detokenize_body>(d);
      return with_text(
          req.model,
          [=](const actors::model_info& info, const model_text& text) {
            reply(detokenize_reply(req, info, text));
          },
          fail);
    }
    auto t = parse_tokenize(j);
    if (auto e = std::get_if<request_error>(&t)) return reply(openai_bad_request(*e));
    auto req = std::get<tokenize_body>(t);
    with_text(
        req.g.model,
        [=](const actors::model_info& info, const model_text& text) {
          reply(tokenize_reply(req, info, text));
        },
        fail);
  }

  /// Routes one request; every path ends in exactly one call of `reply`, or in a stream
  /// opened with `open_sse` and ended. Inference registers with `on_gone`.
  void route(const request& req, responder reply, sse_opener open_sse, gone_hook on_gone) {
    auto method = req.method_string();
    auto target_in = req.target();
    auto target = std::string_view{target_in.data(), target_in.size()};
    auto matched = match_route(std::string_view{method.data(), method.size()}, target);
    const bool openai = openai_target(target);
    if (auto no = std::get_if<route_refusal>(&matched)) {
      if (openai)
        return reply(
            make_json(static_cast<http::status>(no->status),
                      openai_error(no->status, no->message,
                                   no->status == 404 ? "not_found" : "method_not_allowed")));
      return reply(make_error_response(static_cast<http::status>(no->status), no->message));
    }
    auto& m = std::get<route_match>(matched);
    const auto& model = m.model;
    if (!opts.api_key.empty() && !open_route(m.id)) {
      auto auth = req[http::field::authorization];
      if (!bearer_matches(std::string_view{auth.data(), auth.size()}, opts.api_key)) {
        const std::string why = "a valid API key is required (Authorization: Bearer KEY)";
        auto res = openai ? make_json(http::status::unauthorized,
                                      openai_error(401, why, "invalid_api_key"))
                          : make_error_response(http::status::unauthorized, why);
        res.set(http::field::www_authenticate, "Bearer");
        return reply(std::move(res));
      }
    }
    switch (m.id) {
      case route_id::health:
        return reply(make_json(http::status::ok, json::object()));
      case route_id::version:
        return reply(make_json(http::status::ok, json{{"version", "0.1.0"}}));
      case route_id::tokenize:
      case route_id::detokenize:
        return tokenize(req.body(), m.id == route_id::tokenize, std::move(reply));
      case route_id::model_card:
        return info_of(
            model,
            [reply](actors::model_info& i) {
              if (auto why = serving_error(i)) return reply(openai_error_response(why));
              reply(make_json(http::status::ok, json{{"id", i.config.name},
                                                     {"object", "model"},
                                                     {"created", 0},
                                                     {"owned_by", "computron"},
                                                     {"max_model_len", i.max_positions}}));
            },
            [reply](const caf::error& e) { reply(openai_error_response(e)); });
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
            if (state == "READY" || state == "UNLOADING") e["residency"] = to_string(i.state);
            out.push_back(std::move(e));
          }
          return make_json(http::status::ok, out);
        };
        if (registry)
          return ask_actor<std::vector<actors::model_info>>(
              registry, reply, ok, [](const caf::error& e) { return error_response(e); },
              actors::list_atom_v);
        return ask<std::vector<actors::model_info>>(reply, ok, actors::list_atom_v);
      }
      case route_id::models_list:
        return ask_openai<std::vector<actors::model_info>>(
            reply,
            [](std::vector<actors::model_info>& ms) {
              // Only models that can serve: a failed registration or a model out of reach
              // is in the repository index, with its reason, not here.
              json data = json::array();
              for (auto& i : ms)
                if (!serving_error(i))
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
      case route_id::chat_completions:
        return text_request(text_api::chat, {}, req.body(), false, std::move(reply),
                            std::move(open_sse), std::move(on_gone));
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
        if (registry) {
          if (load)
            return ask_actor<actors::model_info>(registry, reply, ok, fail, actors::load_atom_v,
                                                 model);
          return ask_actor<actors::model_info>(registry, reply, ok, fail, actors::unload_atom_v,
                                               model, unregister);
        }
        if (unregister)
          return reply(make_error_response(http::status::bad_request,
                                           "invalid_request: this server has no model control "
                                           "(unregister needs a registry)"));
        if (load) return ask<actors::model_info>(reply, ok, actors::load_atom_v, model);
        return ask<actors::model_info>(reply, ok, actors::unload_atom_v, model);
      }
      case route_id::model_metadata:
        // Registered models (a failed one too: its parameters say why); a folder that is
        // not registered is a 404 that says so.
        return info_of(
            model,
            [reply](actors::model_info& i) {
              if (auto why = serving_error(i); why && is(why, ec::unknown_model))
                return reply(error_response(why));
              auto j = json{
                  {"name", i.config.name},
                  {"versions", {"1"}},
                  {"platform", "computron_" + i.config.kind},
                  {"inputs", {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {-1, -1}}}}},
                  {"outputs",
                   {{{"name", "output_ids"}, {"datatype", "INT64"}, {"shape", {-1, -1}}}}},
                  {"parameters", info_json(i)}};
              reply(make_json(http::status::ok, j));
            },
            [reply](const caf::error& e) { reply(error_response(e)); });
      case route_id::model_ready:
        // Every registered model can serve (an offloaded one is swapped in on demand)
        // unless a device of it is on a node that is gone. 200 when it can serve, else 503
        // with the reason (Kubernetes probes read the status).
        // A folder that is not registered is a 404 that says so.
        return info_of(
            model,
            [reply](actors::model_info& i) {
              if (auto why = serving_error(i); why && is(why, ec::unknown_model))
                return reply(error_response(why));
              auto [state, reason] = triton_state(i);
              bool ready = state == "READY";
              json j{{"name", i.config.name}, {"ready", ready}, {"state", to_string(i.state)}};
              if (!ready) j["reason"] = reason;
              reply(make_json(ready ? http::status::ok : http::status::service_unavailable, j));
            },
            [reply](const caf::error& e) { reply(error_response(e)); });
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

http_server::http_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

http_server::~http_server() {
  stop();
  // An actor that answered a request may still hold its answer paths, and with them the
  // connection, whose socket closes through the I/O context: the context waits for them,
  // a bounded while (they go as the actor is cleaned up, usually within microseconds).
  if (!impl_->listen) return;
  for (int i = 0; i < 200 && impl_->listen->held.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (auto n = impl_->listen->held.load(); n > 0) {
    log::warn(
        "http: {} requests still held 2 s after the server stopped; the server's I/O "
        "state is left behind rather than freed under them",
        n);
    (void)impl_.release();
  }
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
    std::shared_ptr<trace_recorder> trace, http_options opts, actors::registry_actor registry,
    std::shared_ptr<text::text_directory> texts) {
  if (opts.threads < 1) return make_error(ec::invalid_configuration, "http: at least one thread");
  auto p = std::make_unique<impl>(sys, std::move(frontend), std::move(m), std::move(trace),
                                  std::move(opts), std::move(registry), std::move(texts));
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
  p->listen = std::unique_ptr<transport::listener>(new transport::listener{
      p->ioc, p->acceptor, p->stopped, p->opts,
      [srv = p.get()](const request& req, responder reply, sse_opener open_sse, gone_hook on_gone) {
        // An exception here is a bug; it must not end the process from an I/O thread.
        // The request still gets its one answer (a 500) unless it had one already. Every
        // answer is counted by status, refusals included.
        auto family = std::string{route_family(req.method_string(), req.target())};
        auto g = transport::guard_answer(req, std::move(reply), std::move(open_sse),
                                         [srv, family](int status) {
                                           if (srv->metrics_)
                                             srv->metrics_->http_response(family, status);
                                         });
        auto once = g.reply;
        auto opener = g.open_sse;
        try {
          srv->route(req, once, std::move(opener), std::move(on_gone));
        } catch (const std::exception& e) {
          log::error("http: {} {} threw: {}", std::string{req.method_string()},
                     std::string{req.target()}, e.what());
          once(make_error_response(http::status::internal_server_error,
                                   std::string{"internal error: "} + e.what()));
        }
      }});
  transport::accept(*p->listen);
  for (int i = 0; i < o.threads; ++i) p->threads.emplace_back([ioc = &p->ioc] { ioc->run(); });
  return std::unique_ptr<http_server>{new http_server(std::move(p))};
}

}  // namespace computron::net
