#pragma once

// The HTTP server's state, shared by its two files (internal to net/): http_server.cpp
// routes requests and runs the listener, inference_routes.cpp answers the inference,
// text and tokenizer routes.
#include "net/http/http_server.hpp"

#include <fmt/ranges.h>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <caf/all.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <variant>
#include <vector>
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

  /// When the server started (Unix seconds): every model card's `created`, as vLLM's
  /// cards carry the time the server made them.
  int64_t started = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();

  /// One model as /v1/models lists it.
  json model_card(const actors::model_info& i) const {
    // A LoRA adapter's card, as vLLM's: its folder as root, its base as parent.
    const bool adapter = !i.config.base.empty();
    return json{{"id", i.config.name},
                {"object", "model"},
                {"created", started},
                {"owned_by", "computron"},
                {"root", adapter ? i.config.weights_path : i.config.name},
                {"parent", adapter ? json(i.config.base) : json(nullptr)},
                {"max_model_len", i.max_positions}};
  }

  /// The largest max_tokens a body may ask for: the configured limit, else as many as an
  /// int32 holds (the model's context then refuses what it cannot hold, with its size).
  int64_t max_tokens_cap() const {
    return opts.max_tokens > 0 ? opts.max_tokens : std::numeric_limits<int32_t>::max();
  }

  /// What info_of asks the frontend for: the model with its residency (the index's
  /// routes), or as registered (the text routes, which need only its files and sizes and
  /// so never wait on the swap scheduler; a model the scheduler cannot serve is refused
  /// by its generation request, with the scheduler's reason).
  enum class lookup : uint8_t { with_residency, as_registered };

  /// One model as the index lists it: as the frontend knows it, else (a name the manager
  /// does not know) as the registry reads its folder, where there is a registry. The
  /// registry reads folders on its own thread, so only unknown names go there.
  template <class OnOk, class OnErr>
  void info_of(const std::string& model, OnOk ok, OnErr on_err,
               lookup how = lookup::with_residency) {
    auto timeout = caf::timespan{opts.request_timeout};
    auto fe = frontend;
    auto repo = registry;
    sys.spawn([=](caf::event_based_actor* self) {
      auto found = [=](actors::model_info& i) {
        self->quit();
        ok(i);
      };
      auto not_found = [=](caf::error& e) {
        if (!repo || !is(e, ec::unknown_model)) {
          self->quit();
          return on_err(e);
        }
        self->request(repo, timeout, actors::info_atom_v, model).then(found, [=](caf::error& e2) {
          self->quit();
          on_err(e2);
        });
      };
      if (how == lookup::as_registered)
        self->request(fe, timeout, actors::describe_atom_v, model).then(found, not_found);
      else
        self->request(fe, timeout, actors::info_atom_v, model).then(found, not_found);
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

  void infer(const std::string& model, const std::string& body, responder reply, gone_hook on_gone);
  /// A text request (OpenAI completions and chat, Triton generate): read strictly, then
  /// the model's text files, then a generation actor does the rest.
  void text_request(text_api api, const std::string& model, const std::string& body, bool stream,
                    responder reply, sse_opener open_sse, gone_hook on_gone);
  /// Calls `ok(info, text)` with a model that can serve text, else `fail` with why
  /// (defined beside its only users, in inference_routes.cpp).
  template <class OnOk, class OnErr>
  void with_text(const std::string& model, OnOk ok, OnErr fail);
  /// POST /tokenize and /detokenize, as vLLM serves them.
  void tokenize(const std::string& body, bool forward, responder reply);
  /// POST /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM serves them
  /// (lora_routes.cpp).
  void lora_adapter(const std::string& body, bool load, responder reply);

  /// Routes one request; every path ends in exactly one call of `reply`, or in a stream
  /// opened with `open_sse` and ended. Inference registers with `on_gone`.
  void route(const request& req, responder reply, sse_opener open_sse, gone_hook on_gone);
};

}  // namespace computron::net
