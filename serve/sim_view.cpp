// The serve config as the simulator sees it (devices, options, every model's shards and
// compute), and the simulator's cost model read from a file or calibrated against what a
// running server or `computron bench exp1` measured.
#include "serve/sim_view.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "net/client/http_client.hpp"
#include "net/client/loadgen.hpp"
#include "sched/placement.hpp"

namespace computron::serve {

namespace {

using json = nlohmann::json;

/// Decoder layers in a shard's layout (tensors named "layers.N.<...>"): the steps at
/// which a forward on a loading shard waits for its bytes.
int decoder_layers(const gpu::tensor_table& t) {
  std::set<std::string> seen;
  for (auto& e : t.entries()) {
    if (e.name.rfind("layers.", 0) != 0) continue;
    auto dot = e.name.find('.', 7);
    if (dot != std::string::npos) seen.insert(e.name.substr(7, dot - 7));
  }
  return static_cast<int>(seen.size());
}

caf::expected<std::string> read_text(const std::string& path) {
  std::ifstream in{path};
  if (!in) return make_error(ec::io_error, "cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// GET `path` from the server as JSON (or its text).
caf::expected<std::string> get_text(net::http_client& c, const std::string& url,
                                    const std::string& path) {
  auto r = c.request("GET", path, {}, std::chrono::seconds(10));
  if (!r) return r.error();
  if (r->status != 200)
    return make_error(ec::io_error, fmt::format("GET {}{} answered {}", url, path, r->status));
  return r->body;
}

/// From a running server: /metrics gives bytes, seconds and evictions per device;
/// /v2/status gives every device's nominal link (so the efficiency is the server's own,
/// whatever links the sim config gives) and the compute per forward step the manager
/// measured for each model, which replaces the cost model's estimate for that model.
caf::expected<calibration> calibrate_from_server(const std::string& url, const sim::sim_config& cfg,
                                                 sim::cost_model c) {
  auto at = net::parse_url(url);
  if (!at) return at.error();
  auto client = net::http_client::connect(at->host, at->port, std::chrono::seconds(5));
  if (!client) return client.error();
  auto metrics = get_text(**client, url, "/metrics");
  if (!metrics) return metrics.error();
  auto status_text = get_text(**client, url, "/v2/status");
  if (!status_text) return status_text.error();
  auto status = json::parse(*status_text, nullptr, false);
  if (status.is_discarded() || !status.is_object())
    return make_error(ec::io_error, "GET " + url + "/v2/status is not a JSON object");
  // Nominal link per device index, as the server sees it.
  std::map<std::string, double> link_of;
  if (auto d = status.find("devices"); d != status.end() && d->is_array())
    for (auto& dev : *d)
      if (dev.is_object() && dev.contains("device") && dev.value("link-gbps", 0.0) > 0)
        link_of[dev["device"].dump()] = dev["link-gbps"].get<double>();
  double bytes = 0, nominal_s = 0, load_s = 0, evictions = 0, evict_s = 0;
  for (auto& [dev, t] : net::device_traffic(*metrics)) {
    auto l = link_of.find(dev);
    double link = l != link_of.end()     ? l->second
                  : !cfg.devices.empty() ? cfg.devices.front().link_gbps
                                         : 0.0;
    if (link > 0 && t.load_seconds > 0) {
      bytes += t.bytes_loaded;
      nominal_s += t.bytes_loaded / (link * 1e9);
      load_s += t.load_seconds;
    }
    evictions += t.evictions;
    evict_s += t.evict_seconds;
  }
  calibration out;
  out.cost = c;
  if (load_s > 0 && nominal_s > 0) out.cost.link_efficiency = std::min(1.0, nominal_s / load_s);
  if (evictions > 0) out.cost.evict_s = evict_s / evictions;
  if (auto m = status.find("manager"); m != status.end() && m->is_object())
    if (auto ms = m->find("models"); ms != m->end() && ms->is_array())
      for (auto& x : *ms)
        if (x.is_object() && x.value("step-ms", 0.0) > 0 && x.contains("model") &&
            x["model"].is_string()) {
          auto name = x["model"].get<std::string>();
          auto fixed = x.value("step-fixed-ms", 0.0), per_token = x.value("step-per-token-ms", 0.0);
          if (per_token > 0 || fixed > 0) {
            out.step_s[name] = fixed / 1e3;
            out.step_per_token_s[name] = per_token / 1e3;
          } else {
            out.step_s[name] = x["step-ms"].get<double>() / 1e3;
          }
        }
  return out;
}

/// From `computron bench exp1 --json`: the link efficiency its loads achieved and its
/// mean eviction time.
caf::expected<calibration> calibrate_from_file(const std::string& path, sim::cost_model c) {
  auto text = read_text(path);
  if (!text) return text.error();
  auto j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(ec::invalid_request, path + " is not a JSON object");
  if (j.contains("cost")) {
    auto cost = read_cost(j["cost"].dump(), c);
    if (!cost) return cost.error();
    return calibration{*cost, {}};
  }
  if (!j.contains("rows") || !j["rows"].is_array() || j["rows"].empty())
    return make_error(ec::invalid_request,
                      path + " has neither \"cost\" nor the \"rows\" of bench exp1 --json");
  double eff = 0, off = 0;
  size_t n = 0;
  for (auto& row : j["rows"]) {
    eff += row.value("link_efficiency", 0.0);
    off += row.value("offload_s", 0.0);
    ++n;
  }
  if (eff > 0) c.link_efficiency = std::min(1.0, eff / static_cast<double>(n));
  if (off > 0) c.evict_s = off / static_cast<double>(n);
  return calibration{c, {}};
}

}  // namespace

caf::expected<sim::cost_model> read_cost(const std::string& json_text, sim::cost_model c) {
  auto j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(ec::invalid_request, "the cost model must be a JSON object");
  std::pair<const char*, double*> fields[] = {{"link_efficiency", &c.link_efficiency},
                                              {"load_overhead_s", &c.load_overhead_s},
                                              {"evict_s", &c.evict_s},
                                              {"stage_overhead_s", &c.stage_overhead_s},
                                              {"request_overhead_s", &c.request_overhead_s},
                                              {"lease_overhead_s", &c.lease_overhead_s},
                                              {"tflops", &c.tflops}};
  for (auto& [key, value] : j.items()) {
    bool known = false;
    for (auto& [name, field] : fields)
      if (key == name) {
        if (!value.is_number() || !(value.get<double>() >= 0))
          return make_error(ec::invalid_request,
                            "cost model: " + key + " must be a number, 0 or more");
        *field = value.get<double>();
        known = true;
      }
    if (!known) return make_error(ec::invalid_request, "cost model: unknown field '" + key + "'");
  }
  return c;
}

caf::expected<sim::sim_config> sim_config_from(const serve_config& cfg,
                                               const actors::engine_registry& engines,
                                               const sim::cost_model& cost, double capacity_gb,
                                               double link_gbps) {
  auto bad = [](std::string why) { return make_error(ec::invalid_configuration, std::move(why)); };
  sim::sim_config out;
  auto& d = cfg.runtime.devices;
  int count = d.count > 0 ? d.count : 1;
  uint64_t capacity = d.emulated_capacity_bytes;
  double link = d.emulated_link_gbps;
  if (d.kind == "cuda") {
    capacity = d.cuda_capacity_bytes;
    link = 0;
  }
  if (capacity_gb > 0) capacity = static_cast<uint64_t>(capacity_gb * 1e9);
  if (link_gbps > 0) link = link_gbps;
  if (capacity == 0)
    return bad(
        "the simulator needs each device's capacity: set devices.capacity_mb or --capacity-gb");
  if (!(link > 0)) return bad("the simulator needs each device's link rate: --link-gbps");
  for (int i = 0; i < count; ++i) out.devices.push_back({capacity, link});
  std::vector<gpu::device_kind> kinds(static_cast<size_t>(count), d.kind == "cuda"
                                                                      ? gpu::device_kind::cuda
                                                                      : gpu::device_kind::emulated);
  out.workspace_bytes = cfg.runtime.scheduler.workspace_bytes;
  out.chunk_bytes = cfg.runtime.worker.chunk_bytes;
  out.scheduler = cfg.runtime.scheduler.ledger;
  out.batching = cfg.runtime.manager.batching;
  out.gpulets = cfg.runtime.manager.gpulets;
  out.cost = cost;
  if (!(cost.tflops > 0)) return bad("the simulator needs a compute rate: tflops above 0");
  const double flops = cost.tflops * 1e12;
  // What the models placed so far take of each device: the runtime's registry places a
  // model without devices by the same rule, in the same order.
  std::vector<uint64_t> placed(static_cast<size_t>(count), 0);
  const std::vector<uint64_t> usable(
      static_cast<size_t>(count),
      capacity > out.workspace_bytes ? capacity - out.workspace_bytes : 0);
  // Models as resolved so far: an adapter takes its base's kind, shape, dtype and devices,
  // as registration gives them (actors/registration.cpp).
  std::map<std::string, actors::model_config> resolved;
  // Models first, then adapters, as serve registers them.
  std::vector<actors::model_config> in_order;
  for (bool adapters : {false, true})
    for (auto& m : cfg.models)
      if (m.base.empty() != adapters) in_order.push_back(m);
  for (auto model : in_order) {
    if (!model.base.empty()) {
      // The base by registration's rule.
      std::vector<sched::base_candidate> served;
      for (auto& [name, m] : resolved) served.push_back({name, m.weights_path});
      auto b = resolved.find(sched::match_base(model.base, served));
      if (b == resolved.end())
        return bad("adapter " + model.name + " names base " + model.base +
                   ", which is none of the models, or more than one");
      auto a = b->second;
      a.name = model.name;
      a.base = b->first;
      a.weights_path = model.weights_path;
      a.checkpoint_dtype.clear();
      a.seed = model.seed;
      a.max_lora_rank = cfg.runtime.registry.max_lora_rank;
      a.pinned = model.pinned;
      a.priority = model.priority;
      a.toy_shard_bytes = model.toy_shard_bytes > 0
                              ? model.toy_shard_bytes
                              : std::max<uint64_t>(1, b->second.toy_shard_bytes / 16);
      auto base_sim = std::find_if(out.models.begin(), out.models.end(),
                                   [&](auto& x) { return x.name == b->first; });
      if (base_sim == out.models.end()) return bad("adapter " + model.name + ": no base");
      sim::sim_model m = *base_sim;
      m.name = a.name;
      m.base = a.base;
      m.pinned = a.pinned;
      m.priority = a.priority;
      m.kv_block_bytes.clear();
      m.shard_bytes.clear();
      for (int32_t k = 0; k < a.pp; ++k)
        for (int32_t r = 0; r < a.tp; ++r) {
          auto layout = engines.at(a.kind)->layout(actors::shard_spec{a, r, k, {}});
          if (!layout) return with_context(layout.error(), "adapter " + a.name);
          m.shard_bytes.push_back(layout->total_bytes());
        }
      out.models.push_back(std::move(m));
      continue;
    }
    model = actors::resolve_dtype(std::move(model), kinds);
    if (model.devices.empty() && model.tp >= 1 && model.pp >= 1 && model.tp * model.pp <= count &&
        engines.count(model.kind) > 0) {
      std::vector<uint64_t> bytes;
      for (int32_t k = 0; k < model.pp; ++k)
        for (int32_t r = 0; r < model.tp; ++r) {
          auto layout = engines.at(model.kind)->layout(actors::shard_spec{model, r, k, {}});
          bytes.push_back(layout ? layout->total_bytes() : 0);
        }
      model.devices = sched::spread_placement(bytes.size(), usable, placed);
    }
    if (auto err = actors::validate_model(engines, model, kinds)) return err;
    for (size_t i = 0; i < model.devices.size(); ++i) {
      auto layout =
          engines.at(model.kind)
              ->layout(actors::shard_spec{model,
                                          static_cast<int32_t>(i % static_cast<size_t>(model.tp)),
                                          static_cast<int32_t>(i / static_cast<size_t>(model.tp)),
                                          {}});
      if (layout) placed[static_cast<size_t>(model.devices[i])] += layout->total_bytes();
    }
    auto& eng = *engines.at(model.kind);
    sim::sim_model m;
    m.name = model.name;
    m.tp = model.tp;
    m.pp = model.pp;
    m.devices = model.devices;
    m.pinned = model.pinned;
    m.priority = model.priority;
    m.slo_s = static_cast<double>(model.slo_ms) / 1e3;
    uint64_t total = 0;
    for (int32_t k = 0; k < model.pp; ++k)
      for (int32_t r = 0; r < model.tp; ++r) {
        auto layout = eng.layout(actors::shard_spec{model, r, k, {}});
        if (!layout) return layout.error();
        m.shard_bytes.push_back(layout->total_bytes());
        total += layout->total_bytes();
        // KV blocks as the runtime counts them (none for a kind without blocks).
        if (cfg.runtime.registry.kv_in_ledger)
          m.kv_block_bytes.push_back(eng.kv_block_bytes(actors::shard_spec{model, r, k, {}}));
        if (k == 0 && r == 0) m.layers = std::max(1, decoder_layers(*layout));
      }
    if (std::find(m.kv_block_bytes.begin(), m.kv_block_bytes.end(), 0) != m.kv_block_bytes.end())
      m.kv_block_bytes.clear();
    if (model.kind == "toy") {
      m.layers = actors::toy_layers_per_stage;
      m.step_s = model.toy_compute_ms / 1e3;
    } else {
      // Two flops per weight per token over every device of the model at once.
      double bytes_per_weight = model.dtype == "f32" ? 4 : 2;
      double weights = static_cast<double>(total) / bytes_per_weight;
      m.step_per_token_s = 2 * weights / (flops * static_cast<double>(m.devices.size()));
    }
    resolved[model.name] = model;
    out.models.push_back(std::move(m));
  }
  if (auto err = sim::check(out)) return err;
  return out;
}

caf::expected<sim::cost_model> read_cost_file(const std::string& path, sim::cost_model base) {
  auto text = read_text(path);
  if (!text) return text.error();
  auto c = read_cost(*text, base);
  if (!c) return make_error(ec::invalid_request, path + ": " + render(c.error()));
  return c;
}

caf::expected<calibration> calibrate(const std::string& source, const sim::sim_config& cfg,
                                     sim::cost_model base) {
  return source.rfind("http", 0) == 0 ? calibrate_from_server(source, cfg, base)
                                      : calibrate_from_file(source, base);
}

}  // namespace computron::serve
