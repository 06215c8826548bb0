#include "apps/computron/sim_cli.hpp"

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/opt_engine.hpp"
#include "common/error.hpp"
#include "net/client/http_client.hpp"
#include "net/client/llm_lengths.hpp"
#include "net/client/loadgen.hpp"
#include "workload/report.hpp"

namespace computron::app {

namespace {

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

using json = nlohmann::json;

constexpr int exit_failed = 1;
constexpr int exit_usage = 2;
constexpr int exit_some_failed = 3;

int usage(const std::string& why) {
  std::cerr << "computron sim: " << why << '\n';
  return exit_usage;
}

caf::expected<std::string> read_text(const std::string& path) {
  std::ifstream in{path};
  if (!in) return make_error(ec::io_error, "cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// What a running server measured: the cost model's link efficiency and eviction time,
/// and each model's compute per forward step (seconds; 0: none measured yet): a step's
/// fixed cost and its cost per token where the server fitted them, else one mean.
struct calibration {
  sim::cost_model cost;
  std::map<std::string, double> step_s;
  std::map<std::string, double> step_per_token_s{};
};

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
  out.cost = cost;
  if (!(cost.tflops > 0)) return bad("the simulator needs a compute rate: tflops above 0");
  const double flops = cost.tflops * 1e12;
  for (auto model : cfg.models) {
    model = actors::resolve_dtype(std::move(model), kinds);
    if (auto err = actors::validate_model(engines, model, kinds)) return err;
    auto& eng = *engines.at(model.kind);
    sim::sim_model m;
    m.name = model.name;
    m.tp = model.tp;
    m.pp = model.pp;
    m.devices = model.devices;
    m.pinned = model.pinned;
    m.priority = model.priority;
    uint64_t total = 0;
    for (int32_t k = 0; k < model.pp; ++k)
      for (int32_t r = 0; r < model.tp; ++r) {
        auto layout = eng.layout(actors::shard_spec{model, r, k, {}});
        if (!layout) return layout.error();
        m.shard_bytes.push_back(layout->total_bytes());
        total += layout->total_bytes();
        // KV blocks as the runtime counts them (none for a kind without blocks).
        if (cfg.runtime.manager.kv_in_ledger)
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
    out.models.push_back(std::move(m));
  }
  if (auto why = sim::check(out); !why.empty()) return bad(why);
  return out;
}

int run_sim_cli(const sim_cli& cli) {
  if (auto why = check_workload_flags(cli.workload); !why.empty()) return usage(why);
  // 0 (or absent) means the default; a negative or NaN value is a mistake, not a default.
  for (auto [flag, v] :
       {std::pair{"--tflops", cli.tflops}, std::pair{"--capacity-gb", cli.capacity_gb},
        std::pair{"--link-gbps", cli.link_gbps}})
    if (!(v >= 0)) return usage(fmt::format("{} must be above 0 (or absent), got {}", flag, v));
  serve_config cfg = default_serve_config();
  if (!cli.config.empty()) {
    auto c = load_serve_config(cli.config);
    if (!c) return usage(render(c.error()));
    cfg = std::move(*c);
  }
  if (!cli.repository.empty()) {
    auto models = load_repository(cli.repository);
    if (!models) return usage(render(models.error()));
    if (cli.config.empty()) cfg.models.clear();
    for (auto& m : *models) cfg.models.push_back(m);
  }
  sim::cost_model cost;
  if (cli.profile == "a100")
    cost = sim::profile_a100_pcie4();
  else if (cli.profile != "emulated")
    return usage("--profile must be emulated or a100, got '" + cli.profile + "'");
  if (!cli.cost_file.empty()) {
    auto text = read_text(cli.cost_file);
    if (!text) return usage(render(text.error()));
    auto c = read_cost(*text, cost);
    if (!c) return usage(cli.cost_file + ": " + render(c.error()));
    cost = *c;
  }
  if (cli.tflops > 0) cost.tflops = cli.tflops;
  auto sc = sim_config_from(cfg, actors::all_engines(), cost, cli.capacity_gb, cli.link_gbps);
  if (!sc) return usage(render(sc.error()));
  // Models whose step time a server measured (--calibrate URL), for the output.
  std::map<std::string, double> measured_steps, measured_per_token;
  if (!cli.calibrate.empty()) {
    auto c = cli.calibrate.rfind("http", 0) == 0 ? calibrate_from_server(cli.calibrate, *sc, cost)
                                                 : calibrate_from_file(cli.calibrate, cost);
    if (!c) return usage("--calibrate " + cli.calibrate + ": " + render(c.error()));
    sc->cost = c->cost;
    for (auto& m : sc->models)
      if (auto i = c->step_s.find(m.name); i != c->step_s.end()) {
        m.step_s = i->second;
        auto t = c->step_per_token_s.find(m.name);
        m.step_per_token_s = t == c->step_per_token_s.end() ? 0 : t->second;
        measured_steps[m.name] = i->second;
        measured_per_token[m.name] = m.step_per_token_s;
      }
  }
  sc->prompt_len = cli.workload.prompt_len;
  sc->max_tokens = cli.workload.max_tokens;
  sc->warm_up = cli.warm_up;
  if (cli.workload.drop_late)
    sc->drop_late_deadline_ms = static_cast<int64_t>(std::lround(cli.workload.slo_s * 1000));
  std::vector<std::string> known;
  for (auto& m : sc->models) known.push_back(m.name);
  std::string described;
  auto sched = make_schedule(cli.workload, known, &described);
  if (!sched) return usage(render(sched.error()));
  // Mixed lengths as `computron loadgen` draws them (same flags and seed, same requests).
  if (cli.workload.prompt_dist != "fixed" || cli.workload.output_dist != "fixed" ||
      !cli.workload.lengths_csv.empty()) {
    std::vector<net::length_pair> rows;
    if (!cli.workload.lengths_csv.empty()) {
      auto r = net::read_length_pairs(cli.workload.lengths_csv);
      if (!r) return usage(render(r.error()));
      rows = std::move(*r);
    }
    auto prompt =
        net::parse_length_dist(cli.workload.prompt_dist, cli.workload.prompt_len, "--prompt-dist");
    if (!prompt) return usage(render(prompt.error()));
    auto output =
        net::parse_length_dist(cli.workload.output_dist, cli.workload.max_tokens, "--output-dist");
    if (!output) return usage(render(output.error()));
    net::assign_lengths(*sched, {*prompt, *output, std::move(rows)}, cli.workload.seed);
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string error;
  auto result = sim::run(*sc, *sched, &error);
  if (!error.empty()) return usage(error);
  auto wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto summary =
      workload::summarize_run(sched->models, result.records, cli.workload.slo_s, result.devices);
  json extra{{"simulated", true},
             {"workload", json::parse(described)},
             {"profile", cli.profile},
             {"cost",
              {{"link_efficiency", sc->cost.link_efficiency},
               {"load_overhead_s", sc->cost.load_overhead_s},
               {"evict_s", sc->cost.evict_s},
               {"stage_overhead_s", sc->cost.stage_overhead_s},
               {"request_overhead_s", sc->cost.request_overhead_s},
               {"lease_overhead_s", sc->cost.lease_overhead_s},
               {"tflops", sc->cost.tflops}}},
             {"measured_step_s", measured_steps},
             {"measured_step_per_token_s", measured_per_token},
             {"events", result.events},
             {"scheduler",
              {{"policy", sc->scheduler.policy},
               {"prefetch", sc->scheduler.prefetch},
               {"prefetches", result.prefetches},
               {"prefetch_hits", result.prefetch_hits},
               {"dispatch", sc->batching.dispatch},
               {"drop_late", sc->drop_late_deadline_ms > 0}}},
             {"simulator_wall_s", wall}};
  if (cli.workload.json) {
    std::cout << workload::to_json(summary, extra.dump()) << '\n';
  } else {
    std::cout << fmt::format(
        "computron sim: {} requests to {} models, {:.1f} simulated s in {:.3f} s ({:.0f} "
        "requests/s simulated)\n",
        sched->arrivals.size(), sched->models.size(), result.simulated_s, wall,
        wall > 0 ? static_cast<double>(sched->arrivals.size()) / wall : 0.0);
    std::cout << workload::to_table(summary);
  }
  if (!cli.workload.report_dir.empty()) {
    if (auto err = workload::write_report(cli.workload.report_dir, summary, result.records,
                                          result.swaps, extra.dump())) {
      std::cerr << "computron sim: " << render(err) << '\n';
      return exit_failed;
    }
    if (!cli.workload.json) std::cout << "report written to " << cli.workload.report_dir << '\n';
  }
  return summary.overall.failed > 0 ? exit_some_failed : 0;
}

}  // namespace computron::app
