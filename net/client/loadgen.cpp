#include "net/client/loadgen.hpp"

#include <algorithm>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "net/client/http_client.hpp"

namespace computron::net {

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::string scrape_metrics(http_client& c) {
  auto r = c.request("GET", "/metrics", {}, 10s);
  return r && r->status == 200 ? r->body : std::string{};
}

/// Swap events from the server's trace timeline that end after `start`, on the client's
/// clock (seconds since `start`).
std::vector<workload::swap_event> fetch_swaps(http_client& c,
                                              std::chrono::steady_clock::time_point start) {
  std::vector<workload::swap_event> out;
  auto r = c.request("GET", "/v2/trace", {}, 30s);
  auto here = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!r || r->status != 200) return out;
  auto j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("traceEvents")) return out;
  // The server's JSON is trusted for shape only as far as json::value() checks it: a field
  // of another type throws, and an answer that is not ours yields no swaps.
  try {
    double server_now = j.value("otherData", json::object()).value("now_s", -1.0);
    if (server_now < 0) return out;
    const double shift = here - server_now;  // server time + shift = client time
    for (auto& e : j["traceEvents"]) {
      auto cat = e.value("cat", std::string{});
      if (cat != "load" && cat != "evict") continue;
      workload::swap_event s;
      s.load = cat == "load";
      auto name = e.value("name", std::string{});
      s.model = name.substr(name.find(' ') + 1);
      // Integers read only from integers: json::value<int>() of a float converts it, which
      // is undefined out of range.
      auto tid = e.find("tid");
      s.device = tid != e.end() && tid->is_number_integer() ? tid->get<int>() : 0;
      s.start_s = e.value("ts", 0.0) / 1e6 + shift;
      s.seconds = e.value("dur", 0.0) / 1e6;
      if (auto a = e.find("args"); a != e.end() && a->is_object())
        if (auto b = a->find("bytes"); b != a->end() && b->is_number_unsigned())
          s.bytes = b->get<uint64_t>();
      if (s.start_s + s.seconds >= 0) out.push_back(s);
    }
  } catch (const json::exception&) {
    return {};
  }
  return out;
}

/// A connection to a server that answers /v2/health/live, polled until `deadline`.
caf::expected<std::unique_ptr<http_client>> answering(
    const server_address& at, std::chrono::steady_clock::time_point deadline) {
  std::string why = "no answer";
  while (true) {
    auto c = http_client::connect(at.host, at.port, 2s);
    if (c) {
      auto live = (*c)->request("GET", "/v2/health/live", {}, 5s);
      if (live && live->status == 200) return c;
      why = live ? "not live (HTTP " + std::to_string(live->status) + ")" : render(live.error());
    } else {
      why = render(c.error());
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(ec::io_error, "cannot reach a ready server at http://" + at.host + ":" +
                                          std::to_string(at.port) + ": " + why);
    std::this_thread::sleep_for(200ms);  // polling a server we do not control
  }
}

/// The ready models' metadata: vocabulary, tokenizer and context. A model whose metadata
/// cannot be read, or that has no vocabulary, is left out.
std::vector<served_model> describe(http_client& c, const std::vector<std::string>& names) {
  std::vector<served_model> out;
  for (auto& name : names) {
    served_model s;
    s.name = name;
    auto info = c.request("GET", "/v2/models/" + name, {}, 10s);
    if (!info || info->status != 200) continue;
    auto j = json::parse(info->body, nullptr, false);
    if (!j.is_object()) continue;
    auto p = j.find("parameters");
    if (p == j.end() || !p->is_object()) continue;
    auto int_of = [&](const char* key) {
      auto v = p->find(key);
      return v != p->end() && v->is_number_integer() ? v->get<int64_t>() : int64_t{0};
    };
    s.vocab = int_of("vocab");
    s.max_model_len = int_of("max_positions");
    auto t = p->find("tokenizer");
    s.tokenizer = t != p->end() && t->is_boolean() && t->get<bool>();
    if (s.vocab > 0) out.push_back(s);
  }
  return out;
}

}  // namespace

caf::expected<server_address> parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind("https://", 0) == 0)
    return make_error(ec::invalid_request,
                      "--url " + url + ": https is not supported, use http://");
  if (url.rfind(scheme, 0) != 0)
    return make_error(ec::invalid_request, "--url " + url + ": expected http://HOST:PORT");
  auto rest = url.substr(scheme.size());
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    if (slash + 1 != rest.size())
      return make_error(ec::invalid_request,
                        "--url " + url + ": give no path, only http://HOST:PORT");
    rest.resize(slash);
  }
  server_address a;
  a.port = 80;
  auto colon = rest.rfind(':');
  a.host = rest.substr(0, colon);
  if (colon != std::string::npos) {
    auto p = rest.substr(colon + 1);
    int port = -1;
    try {
      size_t used = 0;
      port = std::stoi(p, &used);
      if (used != p.size()) port = -1;
    } catch (const std::exception&) {
    }
    if (port < 1 || port > 65535)
      return make_error(ec::invalid_request, "--url " + url + ": port '" + p + "' is not 1..65535");
    a.port = static_cast<uint16_t>(port);
  }
  if (a.host.empty()) return make_error(ec::invalid_request, "--url " + url + ": no host");
  return a;
}

caf::expected<std::vector<served_model>> discover(const server_address& at,
                                                  std::chrono::milliseconds wait,
                                                  const std::vector<std::string>& wanted) {
  const auto begin = std::chrono::steady_clock::now();
  const auto deadline = begin + wait;
  const auto where = "http://" + at.host + ":" + std::to_string(at.port);
  auto c = answering(at, deadline);
  if (!c) return c.error();
  while (true) {
    auto index = (*c)->request("POST", "/v2/repository/index", {}, 10s);
    if (!index || index->status != 200)
      return make_error(ec::io_error, where + ": the repository index failed");
    auto list = json::parse(index->body, nullptr, false);
    if (!list.is_array())
      return make_error(ec::io_error, where + ": the repository index is not a JSON array");
    std::vector<std::string> ready;
    std::string pending;  // "name (STATE: reason)" of each driven model not ready yet
    for (auto& m : list) {
      if (!m.is_object() || !m.contains("name") || !m["name"].is_string()) continue;
      auto name = m["name"].get<std::string>();
      auto state = m.value("state", std::string{});
      auto reason = m.value("reason", std::string{});
      if (state == "READY") {
        ready.push_back(name);
        continue;
      }
      const bool driven = wanted.empty()
                              ? state != "UNAVAILABLE"
                              : std::find(wanted.begin(), wanted.end(), name) != wanted.end();
      if (driven)
        pending += (pending.empty() ? "" : ", ") + name + " (" + state +
                   (reason.empty() ? "" : ": " + reason) + ")";
    }
    if (pending.empty()) return describe(**c, ready);
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(
          ec::io_error,
          fmt::format(
              "{}: not ready after {:.1f} s: {}", where,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(),
              pending));
    std::this_thread::sleep_for(200ms);  // polling a server we do not control
  }
}

server_account server_account::before(const server_address& at) {
  auto c = http_client::connect(at.host, at.port, 5s);
  return {c ? scrape_metrics(**c) : std::string{}};
}

void server_account::after(const server_address& at, std::chrono::steady_clock::time_point start,
                           std::vector<workload::device_traffic>& devices,
                           std::vector<workload::swap_event>& swaps) const {
  auto c = http_client::connect(at.host, at.port, 2s);
  if (!c || metrics_before.empty()) return;
  auto b = device_traffic(metrics_before);
  for (auto& [dev, a] : device_traffic(scrape_metrics(**c))) {
    auto d = a;
    auto& p = b[dev];
    d.shard_loads -= p.shard_loads;
    d.evictions -= p.evictions;
    d.bytes_loaded -= p.bytes_loaded;
    d.load_seconds -= p.load_seconds;
    d.evict_seconds -= p.evict_seconds;
    devices.push_back(d);
  }
  swaps = fetch_swaps(**c, start);
}

std::string error_message(const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end() && e->is_string()) return e->get<std::string>();
    if (e != j.end() && e->is_object()) {
      auto m = e->find("message");
      if (m != e->end() && m->is_string()) return m->get<std::string>();
    }
  }
  return body.size() > 300 ? body.substr(0, 300) : body;
}

std::string error_kind(const timed_result& r) {
  if (r.status == 200) return {};
  if (r.status > 0) return "http_" + std::to_string(r.status);
  if (r.error == "cancelled") return "cancelled";
  if (r.error == "timeout") return "timeout";
  if (r.error.rfind("connect", 0) == 0) return "connect";
  return "io";
}

caf::expected<loadgen_run> run_loadgen(const workload::schedule& s,
                                       const std::vector<served_model>& models,
                                       const loadgen_options& opts) {
  std::vector<std::string> names;
  for (auto& m : models) names.push_back(m.name);
  if (auto err = workload::check_models(s, names)) return err;
  if (opts.prompt_len < 1 || opts.max_tokens < 1)
    return make_error(ec::invalid_request, "prompt length and max tokens must be at least 1");
  std::vector<int64_t> vocab(s.models.size());
  for (size_t i = 0; i < s.models.size(); ++i)
    for (auto& m : models)
      if (m.name == s.models[i]) vocab[i] = m.vocab;
  std::vector<timed_request> reqs;
  reqs.reserve(s.arrivals.size());
  std::mt19937_64 rng{opts.seed};
  for (auto& a : s.arrivals) {
    auto len = a.prompt_len > 0 ? a.prompt_len : opts.prompt_len;
    std::uniform_int_distribution<int64_t> token(0, vocab[a.model] - 1);
    json ids = json::array();
    for (int64_t t = 0; t < len; ++t) ids.push_back(token(rng));
    json params{{"max_tokens", a.max_tokens > 0 ? a.max_tokens : opts.max_tokens}};
    if (opts.deadline_ms > 0) {
      params["deadline_ms"] = opts.deadline_ms;
      params["drop_late"] = true;
    }
    json body{
        {"inputs",
         {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {1, len}}, {"data", ids}}}},
        {"parameters", std::move(params)}};
    reqs.push_back({a.time_s, "POST", "/v2/models/" + s.models[a.model] + "/infer", body.dump()});
  }
  auto account = server_account::before(opts.server);
  open_loop_options o;
  o.host = opts.server.host;
  o.port = opts.server.port;
  o.max_connections = opts.max_connections;
  o.request_timeout = opts.request_timeout;
  o.on_progress = opts.on_progress;
  o.cancel = opts.cancel;
  const auto start = std::chrono::steady_clock::now();
  auto results = run_open_loop(reqs, o);
  if (!results) return results.error();
  loadgen_run run;
  for (size_t i = 0; i < results->size(); ++i) {
    auto& r = (*results)[i];
    workload::request_record rec;
    rec.model = s.models[s.arrivals[i].model];
    rec.arrival_s = s.arrivals[i].time_s;
    rec.sent_s = r.sent_s;
    rec.done_s = r.done_s;
    rec.status = r.status;
    rec.error_kind = error_kind(r);
    if (rec.error_kind.empty()) {
      auto j = json::parse(r.body, nullptr, false);
      if (!j.is_object() || !j.contains("outputs")) {
        rec.error_kind = "bad_response";
        rec.error = r.body.substr(0, 200);
      } else {
        try {
          auto p = j.value("parameters", json::object());
          rec.swapped = p.value("swapped", false);
          rec.queue_ms = p.value("queue_ms", 0.0);
          rec.load_ms = p.value("load_ms", 0.0);
          rec.compute_ms = p.value("compute_ms", 0.0);
        } catch (const json::exception&) {
          rec.error_kind = "bad_response";
          rec.error = r.body.substr(0, 200);
        }
      }
    } else {
      rec.error = error_message(r.body);
    }
    run.records.push_back(std::move(rec));
  }
  account.after(opts.server, start, run.devices, run.swaps);
  return run;
}

std::map<std::string, workload::device_traffic> device_traffic(const std::string& text) {
  std::map<std::string, workload::device_traffic> out;
  auto put = [&](const char* metric, double workload::device_traffic::*field) {
    for (auto& [dev, v] : prometheus_sum(text, metric, "device")) {
      out[dev].device = dev;
      out[dev].*field = v;
    }
  };
  put("computron_shard_loads_total", &workload::device_traffic::shard_loads);
  put("computron_shard_evictions_total", &workload::device_traffic::evictions);
  put("computron_bytes_loaded_total", &workload::device_traffic::bytes_loaded);
  put("computron_load_seconds_sum", &workload::device_traffic::load_seconds);
  put("computron_evict_seconds_sum", &workload::device_traffic::evict_seconds);
  return out;
}

std::map<std::string, double> prometheus_sum(const std::string& text, const std::string& metric,
                                             const std::string& label) {
  std::map<std::string, double> out;
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(metric, 0) != 0) continue;
    auto rest = line.substr(metric.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;
    std::string key;
    if (auto at = rest.find(label + "=\""); at != std::string::npos) {
      auto begin = at + label.size() + 2;
      key = rest.substr(begin, rest.find('"', begin) - begin);
    }
    try {
      out[key] += std::stod(rest.substr(rest.rfind(' ') + 1));
    } catch (const std::exception&) {
      // Not a sample line we understand; skip it.
    }
  }
  return out;
}

}  // namespace computron::net
