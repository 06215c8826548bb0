#include "net/http/http_server_impl.hpp"

namespace computron::net {

void http_server::impl::route(const request& req, responder reply, sse_opener open_sse,
                              gone_hook on_gone) {
  auto method = req.method_string();
  auto target_in = req.target();
  auto target = std::string_view{target_in.data(), target_in.size()};
  auto matched = match_route(std::string_view{method.data(), method.size()}, target);
  const bool openai = openai_target(target);
  if (auto no = std::get_if<route_refusal>(&matched)) {
    if (openai)
      return reply(make_json(static_cast<http::status>(no->status),
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
      auto res =
          openai ? make_json(http::status::unauthorized, openai_error(401, why, "invalid_api_key"))
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
    case route_id::load_lora_adapter:
    case route_id::unload_lora_adapter:
      if (!opts.runtime_lora_updates) {
        // As an unknown route (vLLM does not register them unless told to), with a hint.
        std::string why =
            std::string{m.id == route_id::load_lora_adapter ? "/v1/load_lora_adapter"
                                                            : "/v1/unload_lora_adapter"} +
            " is off: adapters load at run time only on a server started with "
            "--allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)";
        return reply(make_json(http::status::not_found, openai_error(404, why, "not_found")));
      }
      return lora_adapter(req.body(), m.id == route_id::load_lora_adapter, std::move(reply));
    case route_id::model_card:
      return info_of(
          model,
          [reply, this](actors::model_info& i) {
            if (auto why = serving_error(i)) return reply(openai_error_response(why));
            reply(make_json(http::status::ok, model_card(i)));
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
      return reply(make_json(
          http::status::ok,
          json{{"name", "computron"}, {"version", "0.1.0"}, {"extensions", {"model_repository"}}}));
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
          [this](std::vector<actors::model_info>& ms) {
            // Only models that can serve: a failed registration or a model out of reach
            // is in the repository index, with its reason, not here.
            json data = json::array();
            for (auto& i : ms)
              if (!serving_error(i)) data.push_back(model_card(i));
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
                {"outputs", {{{"name", "output_ids"}, {"datatype", "INT64"}, {"shape", {-1, -1}}}}},
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
