#include "net/http_server.hpp"

#include <atomic>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "net/metrics.hpp"
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
response error_response(const caf::error& e) {
  auto status = http::status::internal_server_error;
  bool retry = false;
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
  auto res = make_error_response(status, render(e));
  if (retry) res.set(http::field::retry_after, "1");
  return res;
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
              {"max_positions", i.max_positions}};
}

/// Flattens nested JSON arrays of integers into `out`; false on anything else.
bool flatten_ints(const json& j, std::vector<int64_t>& out) {
  if (j.is_array()) {
    for (auto& x : j)
      if (!flatten_ints(x, out)) return false;
    return true;
  }
  if (!j.is_number_integer()) return false;
  out.push_back(j.get<int64_t>());
  return true;
}

struct parsed_infer {
  std::vector<std::vector<int64_t>> rows;
  int64_t max_tokens = 1;
  actors::row_sampling sampling;
  uint32_t deadline_ms = 0;
  std::string request_id;
};

/// Reads a KServe v2 infer body: one INT64/INT32 input of shape [batch, len] or [len]
/// holding token ids; max_tokens, temperature, top_k, top_p, seed and deadline_ms as
/// parameters. Errors name what is wrong.
caf::expected<parsed_infer> parse_infer(const std::string& body, uint32_t max_rows) {
  auto bad = [](std::string why) { return make_error(ec::invalid_request, std::move(why)); };
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return bad("the body is not valid JSON");
  if (!j.is_object()) return bad("the body must be a JSON object");
  parsed_infer p;
  if (auto id = j.find("id"); id != j.end() && id->is_string())
    p.request_id = id->get<std::string>();
  auto inputs = j.find("inputs");
  if (inputs == j.end() || !inputs->is_array() || inputs->empty())
    return bad("'inputs' must be a non-empty array");
  auto& in = (*inputs)[0];
  if (!in.is_object()) return bad("inputs[0] must be an object");
  auto dt = in.find("datatype");
  if (dt == in.end() || !dt->is_string() || (*dt != "INT64" && *dt != "INT32"))
    return bad("inputs[0].datatype must be INT64 or INT32 (token ids)");
  auto shape = in.find("shape");
  if (shape == in.end() || !shape->is_array() || shape->empty() || shape->size() > 2)
    return bad("inputs[0].shape must be [batch, length] or [length]");
  std::vector<int64_t> dims;
  for (auto& d : *shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      return bad("inputs[0].shape must hold non-negative integers");
    dims.push_back(d.get<int64_t>());
  }
  if (dims.size() == 1) dims.insert(dims.begin(), 1);
  if (dims[0] == 0 || dims[1] == 0) return bad("the batch is empty (shape has a zero)");
  if (dims[0] > max_rows)
    return bad("at most " + std::to_string(max_rows) + " sequences per request");
  auto data = in.find("data");
  std::vector<int64_t> flat;
  if (data == in.end() || !flatten_ints(*data, flat))
    return bad("inputs[0].data must hold integers");
  if (static_cast<int64_t>(flat.size()) != dims[0] * dims[1])
    return bad("inputs[0].data has " + std::to_string(flat.size()) + " elements; shape says " +
               std::to_string(dims[0] * dims[1]));
  for (int64_t r = 0; r < dims[0]; ++r)
    p.rows.emplace_back(flat.begin() + r * dims[1], flat.begin() + (r + 1) * dims[1]);
  if (auto params = j.find("parameters"); params != j.end()) {
    if (!params->is_object()) return bad("'parameters' must be an object");
    auto get_int = [&](const char* key, int64_t& out, int64_t lo, int64_t hi) -> caf::error {
      auto v = params->find(key);
      if (v == params->end()) return {};
      if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi)
        return bad(std::string{"parameter "} + key + " must be an integer in " +
                   std::to_string(lo) + ".." + std::to_string(hi));
      out = v->get<int64_t>();
      return {};
    };
    auto get_num = [&](const char* key, double& out) -> caf::error {
      auto v = params->find(key);
      if (v == params->end()) return {};
      if (!v->is_number()) return bad(std::string{"parameter "} + key + " must be a number");
      out = v->get<double>();
      return {};
    };
    int64_t seed = 0;
    int64_t deadline = 0;
    if (auto e = get_int("max_tokens", p.max_tokens, 1, 1 << 20)) return e;
    if (auto e = get_int("top_k", p.sampling.top_k, 0, 1 << 30)) return e;
    if (auto e = get_int("seed", seed, 0, INT64_MAX)) return e;
    if (auto e = get_int("deadline_ms", deadline, 0, 24 * 3600 * 1000)) return e;
    if (auto e = get_num("temperature", p.sampling.temperature)) return e;
    if (auto e = get_num("top_p", p.sampling.top_p)) return e;
    p.sampling.seed = static_cast<uint64_t>(seed);
    p.deadline_ms = static_cast<uint32_t>(deadline);
  }
  return p;
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
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
  uint16_t bound_port = 0;

  impl(caf::actor_system& s, actors::frontend_actor fe, std::shared_ptr<metrics> m,
       std::shared_ptr<trace_recorder> t, http_options o)
      : sys(s),
        frontend(std::move(fe)),
        metrics_(std::move(m)),
        trace(std::move(t)),
        opts(std::move(o)) {}

  /// Asks the frontend and answers with `ok(result)` or the error's response. Runs in
  /// a short-lived actor so that no I/O thread ever blocks on an actor.
  template <class T, class OnOk, class... Ts>
  void ask(responder reply, OnOk ok, Ts... xs) {
    auto fe = frontend;
    auto timeout = caf::timespan{opts.request_timeout};
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(fe, timeout, xs...)
          .then(
              [=](T& r) {
                reply(ok(r));
                self->quit();
              },
              [=](caf::error& e) {
                reply(error_response(e));
                self->quit();
              });
    });
  }

  void infer(const std::string& model, const std::string& body, responder reply) {
    auto p = parse_infer(body, opts.max_batch_rows);
    if (!p) {
      reply(error_response(p.error()));
      return;
    }
    auto fe = frontend;
    auto timeout = caf::timespan{opts.request_timeout};
    auto parsed = std::make_shared<parsed_infer>(std::move(*p));
    sys.spawn([=](caf::event_based_actor* self) {
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
        self->request(fe, timeout, actors::infer_atom_v, std::move(req))
            .then([=](actors::infer_reply& rep) { j->ok(r, std::move(rep)); },
                  [=](caf::error& e) { j->failed(std::move(e), r); });
      }
    });
  }

  /// Routes one request; every path ends in exactly one call of `reply`.
  void route(const request& req, responder reply) {
    auto target = std::string{req.target()};
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    auto method = req.method();
    auto is_get = method == http::verb::get;
    auto is_post = method == http::verb::post;
    auto wrong_method = [&] {
      reply(make_error_response(
          http::status::method_not_allowed,
          "method " + std::string{req.method_string()} + " is not allowed on " + target));
    };
    if (target == "/v2/health/live" || target == "/v2/health/ready") {
      if (!is_get) return wrong_method();
      auto key = target == "/v2/health/live" ? "live" : "ready";
      return reply(make_json(http::status::ok, json{{key, !stopped.load()}}));
    }
    if (target == "/v2") {
      if (!is_get) return wrong_method();
      return reply(make_json(
          http::status::ok,
          json{{"name", "computron"}, {"version", "0.1.0"}, {"extensions", {"model_repository"}}}));
    }
    if (target == "/v2/status") {
      if (!is_get) return wrong_method();
      return ask<caf::settings>(
          reply, [](caf::settings& s) { return make_json(http::status::ok, status_json(s)); },
          actors::report_atom_v);
    }
    if (target == "/metrics") {
      if (!is_get) return wrong_method();
      response res{http::status::ok, 11};
      res.set(http::field::content_type, "text/plain; version=0.0.4");
      res.body() = metrics_ ? metrics_->render() : std::string{};
      return reply(std::move(res));
    }
    if (target == "/v2/trace") {
      if (!is_get) return wrong_method();
      if (!trace) return reply(make_error_response(http::status::not_found, "tracing is off"));
      response res{http::status::ok, 11};
      res.set(http::field::content_type, "application/json");
      res.body() = trace->to_json();
      return reply(std::move(res));
    }
    if (target == "/v2/repository/index") {
      if (!is_post) return wrong_method();
      return ask<std::vector<actors::model_info>>(
          reply,
          [](std::vector<actors::model_info>& ms) {
            json out = json::array();
            for (auto& m : ms)
              out.push_back({{"name", m.config.name},
                             {"version", "1"},
                             {"state", "READY"},
                             {"residency", m.state}});
            return make_json(http::status::ok, out);
          },
          actors::list_atom_v);
    }
    const std::string repo = "/v2/repository/models/";
    if (target.rfind(repo, 0) == 0) {
      auto rest = target.substr(repo.size());
      auto slash = rest.find('/');
      if (slash == std::string::npos)
        return reply(make_error_response(http::status::not_found, "no route " + target));
      auto model = rest.substr(0, slash);
      auto verb = rest.substr(slash + 1);
      if (verb != "load" && verb != "unload")
        return reply(make_error_response(http::status::not_found, "no route " + target));
      if (!is_post) return wrong_method();
      auto ok = [](actors::model_info& i) { return make_json(http::status::ok, info_json(i)); };
      if (verb == "load") return ask<actors::model_info>(reply, ok, actors::load_atom_v, model);
      return ask<actors::model_info>(reply, ok, actors::unload_atom_v, model);
    }
    const std::string models = "/v2/models/";
    if (target.rfind(models, 0) == 0) {
      auto rest = target.substr(models.size());
      auto slash = rest.find('/');
      auto model = rest.substr(0, slash);
      auto verb = slash == std::string::npos ? std::string{} : rest.substr(slash + 1);
      if (model.empty())
        return reply(make_error_response(http::status::not_found, "no model named in " + target));
      if (verb.empty()) {
        if (!is_get) return wrong_method();
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
      }
      if (verb == "ready") {
        if (!is_get) return wrong_method();
        // Every registered model can serve (an offloaded one is swapped in on demand)
        // unless a device of it is on a node that is gone.
        return ask<actors::model_info>(
            reply,
            [](actors::model_info& i) {
              return make_json(http::status::ok, json{{"name", i.config.name},
                                                      {"ready", i.state != "unavailable"},
                                                      {"state", i.state}});
            },
            actors::info_atom_v, model);
      }
      if (verb == "infer") {
        if (!is_post) return wrong_method();
        return infer(model, req.body(), std::move(reply));
      }
    }
    reply(make_error_response(http::status::not_found, "no route " + target));
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
      return write(make_error_response(
          http::status::payload_too_large,
          "the body exceeds " + std::to_string(srv_.opts.max_body_bytes) + " bytes"));
    }
    if (ec) {
      keep_alive_ = false;
      return write(make_error_response(http::status::bad_request,
                                       "malformed HTTP request: " + ec.message()));
    }
    auto req = parser_->release();
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    // The connection waits for the answer without a read deadline.
    stream_.expires_never();
    auto self = shared_from_this();
    srv_.route(req, [self](response res) {
      asio::post(self->stream_.get_executor(),
                 [self, res = std::move(res)]() mutable { self->write(std::move(res)); });
    });
  }

  void write(response res) {
    res.version(version_);
    res.keep_alive(keep_alive_);
    res.set(http::field::server, "computron");
    res.prepare_payload();
    auto sp = std::make_shared<response>(std::move(res));
    http::async_write(stream_, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
      if (ec || sp->need_eof()) return self->close();
      self->read();
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
    std::shared_ptr<trace_recorder> trace, http_options opts) {
  if (opts.threads < 1) return make_error(ec::invalid_configuration, "http: at least one thread");
  auto p = std::make_unique<impl>(sys, std::move(frontend), std::move(m), std::move(trace),
                                  std::move(opts));
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
