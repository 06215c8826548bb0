// `computron bench exp1` and `computron bench exp2`: the original's two experiments run against a
// real `computron serve` on emulated devices, each cell beside the published figure.
#include "bench/experiments/experiments.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "bench/experiments/experiment_support.hpp"
#include "common/child_process.hpp"
#include "common/error.hpp"
#include "models/decoder_spec.hpp"
#include "net/client/http_client.hpp"
#include "net/client/loadgen.hpp"
#include "workload/arrivals.hpp"
#include "workload/report.hpp"

namespace computron::bench {

namespace detail {

namespace fs = std::filesystem;

std::string rates_label(const std::vector<double>& r) {
  bool all_same = std::all_of(r.begin(), r.end(), [&](double x) { return x == r[0]; });
  if (all_same && r.size() > 3) return fmt::format("({}x{})", r[0], r.size());
  return fmt::format("({})", fmt::join(r, ","));
}

std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string{"computron"} : p.string();
}

/// Checks the options and makes the output folder: the one asked for, or a fresh
/// temporary one.
caf::expected<std::filesystem::path> output_dir(const experiment_options& o,
                                                const std::string& name) {
  if (!(o.factor >= 1) || !std::isfinite(o.factor))
    return make_error(ec::invalid_request, "--factor must be at least 1");
  if (!(o.duration_s > 0) || !std::isfinite(o.duration_s))
    return make_error(ec::invalid_request, "--duration must be positive");
  std::error_code ec;
  fs::path dir = o.out_dir.empty()
                     ? fs::temp_directory_path() / fmt::format("computron-{}-{}", name, getpid())
                     : fs::path{o.out_dir};
  fs::create_directories(dir, ec);
  if (ec) return make_error(ec::io_error, "cannot create " + dir.string() + ": " + ec.message());
  return dir;
}

double mean(const std::vector<double>& xs) {
  return xs.empty() ? 0
                    : std::accumulate(xs.begin(), xs.end(), 0.0) / static_cast<double>(xs.size());
}

}  // namespace detail

namespace {

using namespace detail;

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

// The original's hardware and model (WORKLOADS.md).
constexpr double original_model_bytes = 25.7e9;
constexpr double original_link_gbps = 32.0;
constexpr double mib = 1048576.0;

struct exp1_row {
  int tp, pp;
  double offload, load, exec, response;
};

// Original's means, seconds (WORKLOADS.md, experiment 1).
const exp1_row original_exp1[] = {
    {1, 1, 1.238, 1.350, 0.040, 1.408}, {2, 1, 0.632, 0.732, 0.047, 0.801},
    {4, 1, 0.447, 0.689, 0.050, 0.761}, {1, 2, 0.621, 0.858, 0.049, 0.924},
    {1, 4, 0.380, 0.645, 0.061, 0.722}, {2, 2, 0.318, 0.423, 0.057, 0.502}};

struct exp2_group {
  size_t models;
  size_t capacity;  // models that fit at once
  int batch;
  std::vector<std::vector<double>> rate_lists;
  std::vector<std::vector<double>> original_mean;  // [rate list][cv]
};

const double exp2_cvs[] = {0.25, 1.0, 4.0};

const exp2_group exp2_groups[] = {
    {3,
     2,
     8,
     {{1, 1, 1}, {10, 1, 1}, {10, 10, 1}},
     {{1.262, 0.606, 0.518}, {1.172, 0.886, 0.550}, {1.014, 0.716, 0.374}}},
    {6,
     4,
     32,
     {{1, 1, 1, 1, 1, 1}, {10, 10, 1, 1, 1, 1}, {10, 10, 10, 10, 1, 1}},
     {{1.847, 1.282, 0.174}, {2.017, 1.413, 0.229}, {1.535, 1.470, 0.312}}}};

/// Bytes of one shard when the original's model is split `shards` ways and scaled down
/// by `factor`; a multiple of 4 KiB.
uint64_t shard_bytes(double factor, int shards) {
  auto b = static_cast<uint64_t>(original_model_bytes / factor / shards);
  return b / 4096 * 4096;
}

struct server {
  std::unique_ptr<child_process> proc;
  net::server_address at;
  std::vector<net::served_model> models;
};

/// Writes `config` to dir/name.json and starts `computron serve` on it (a free port).
caf::expected<server> start_server(const json& config, const fs::path& dir,
                                   const std::string& name) {
  auto path = dir / (name + ".json");
  {
    std::ofstream out{path};
    out << config.dump(2) << '\n';
    if (!out) return make_error(ec::io_error, "cannot write " + path.string());
  }
  server s;
  s.proc = std::make_unique<child_process>(std::vector<std::string>{
      self_exe(), "--log-level", "warn", "serve", "--config", path.string(), "--port", "0"});
  // The server fills every model's host copy before it listens: allow for gigabytes.
  auto deadline = std::chrono::steady_clock::now() + 300s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto line = s.proc->read_line(5s);
    if (!line) {
      if (s.proc->exited())
        return make_error(ec::io_error,
                          fmt::format("the server on {} exited ({}) before it listened",
                                      path.string(), s.proc->exit_status()));
      continue;
    }
    auto at = line->find("listening on http://");
    if (at == std::string::npos) continue;
    auto url = line->substr(at + 13);
    url = url.substr(0, url.find(' '));
    auto addr = net::parse_url(url);
    if (!addr) return addr.error();
    s.at = *addr;
    auto models = net::discover(s.at, 30s);
    if (!models) return models.error();
    s.models = std::move(*models);
    return s;
  }
  return make_error(ec::io_error, "the server on " + path.string() + " did not start in 300 s");
}

json server_config(size_t devices, double capacity_bytes, double link_gbps, int batch,
                   int window_ms, const std::string& policy, json models, bool overlap) {
  return {{"comment", "written by computron bench exp1/exp2"},
          {"devices",
           {{"kind", "emulated"},
            {"count", devices},
            {"capacity_mb", capacity_bytes / mib},
            {"link_gbps", link_gbps}}},
          {"http", {{"host", "127.0.0.1"}, {"port", 0}, {"threads", 2}}},
          {"scheduler",
           {{"policy", policy}, {"max_transfers_per_link", 1}, {"compute_while_loading", overlap}}},
          {"batching",
           {{"max_batch_size", batch},
            {"batch_window_ms", window_ms},
            {"max_queue", 4096},
            {"deadline_ms", 600000}}},
          {"frontend", {{"max_outstanding_per_model", 4096}, {"max_outstanding", 16384}}},
          {"chunk_mb", 32},
          {"models", std::move(models)}};
}

json toy_model(const std::string& name, int tp, int pp, uint64_t seed, uint64_t bytes,
               double compute_ms) {
  std::vector<int> devices;
  for (int i = 0; i < tp * pp; ++i) devices.push_back(i);
  return {{"name", name},
          {"kind", "toy"},
          {"tp", tp},
          {"pp", pp},
          {"devices", devices},
          {"seed", seed},
          {"toy_shard_bytes", bytes},
          {"toy_compute_ms", compute_ms}};
}

/// OPT-13B's bytes on its devices over its checkpoint's at tp x pp in f16 (the layout's:
/// vocabulary-parallel embedding and head, the tied head's last-stage slice at pp > 1).
double opt13b_bytes_over_weights(int tp, int pp) {
  auto spec = models::find_spec("opt-13b");
  if (!spec) return 0;
  uint64_t on_devices = 0;
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < tp; ++r) {
      auto b = models::shard_bytes(*spec, gpu::dtype::f16, {tp, pp}, {r, s});
      if (!b) return 0;
      on_devices += *b;
    }
  return static_cast<double>(on_devices) /
         static_cast<double>(models::weight_bytes(*spec, gpu::dtype::f16));
}

std::map<std::string, workload::device_traffic> scrape(net::http_client& c) {
  auto r = c.request("GET", "/metrics", {}, 10s);
  if (!r || r->status != 200) return {};
  return net::device_traffic(r->body);
}

std::string scale_line(double factor) {
  return fmt::format(
      "scale factor {}: OPT-13B 25.7 GB -> {:.1f} MB, 32 GB/s per GPU -> {:.3f} GB/s per emulated "
      "link (swap times kept); exec emulated at the original's measured time",
      factor, original_model_bytes / factor / 1e6, original_link_gbps / factor);
}

}  // namespace

namespace {

/// One experiment-1 cell on one server: the measured requests' response, lease wait
/// (load) and compute (exec), and the transfers between them from /metrics.
struct exp1_cell {
  std::vector<double> response, load, exec;
  double offload_s = 0;
  double link_efficiency = 0;
};

caf::expected<exp1_cell> run_exp1_cell(const experiment_options& o, const exp1_row& ref,
                                       bool overlap, const fs::path& dir, const std::string& name) {
  const double link = original_link_gbps / o.factor;
  const int requests = 24, warmup = 4, batch = 4, prompt = 8;
  const int shards = ref.tp * ref.pp;
  const auto bytes = shard_bytes(o.factor, shards);
  json models =
      json::array({toy_model("opt-13b-a", ref.tp, ref.pp, o.seed, bytes, ref.exec * 1e3),
                   toy_model("opt-13b-b", ref.tp, ref.pp, o.seed + 1, bytes, ref.exec * 1e3)});
  // Room for one model's shard per device, not two.
  auto cfg = server_config(static_cast<size_t>(shards), static_cast<double>(bytes) * 1.5, link,
                           batch, 5, "lru", models, overlap);
  // A layer may start once the chunk holding its last byte arrived: chunks well below a
  // toy layer's bytes (an eighth of a shard), as OPT-13B's 640 MB layers are to 32 MiB.
  cfg["chunk_mb"] = 4;
  auto srv = start_server(cfg, dir, name);
  if (!srv) return srv.error();
  auto client = net::http_client::connect(srv->at.host, srv->at.port, 5s);
  if (!client) return client.error();
  std::mt19937_64 rng{o.seed};
  std::uniform_int_distribution<int64_t> token(0, srv->models.front().vocab - 1);
  exp1_cell out;
  std::map<std::string, workload::device_traffic> before;
  for (int i = 0; i < requests; ++i) {
    if (i == warmup) before = scrape(**client);
    json ids = json::array();
    for (int t = 0; t < batch * prompt; ++t) ids.push_back(token(rng));
    json body{{"inputs",
               {{{"name", "input_ids"},
                 {"datatype", "INT64"},
                 {"shape", {batch, prompt}},
                 {"data", ids}}}},
              {"parameters", {{"max_tokens", 1}}}};
    auto model = i % 2 == 0 ? "opt-13b-a" : "opt-13b-b";
    auto t0 = std::chrono::steady_clock::now();
    auto r = (*client)->request("POST", std::string{"/v2/models/"} + model + "/infer", body.dump(),
                                300s);
    auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!r || r->status != 200)
      return make_error(ec::io_error,
                        fmt::format("request {} failed: {}", i, r ? r->body : render(r.error())));
    if (i < warmup) continue;
    auto p = json::parse(r->body).value("parameters", json::object());
    out.response.push_back(secs);
    out.load.push_back(p.value("load_ms", 0.0) / 1e3);
    out.exec.push_back(p.value("compute_ms", 0.0) / 1e3);
  }
  auto after = scrape(**client);
  double evictions = 0, evict_s = 0, bytes_in = 0, load_s = 0;
  for (auto& [dev, a] : after) {
    auto& b = before[dev];
    evictions += a.evictions - b.evictions;
    evict_s += a.evict_seconds - b.evict_seconds;
    bytes_in += a.bytes_loaded - b.bytes_loaded;
    load_s += a.load_seconds - b.load_seconds;
  }
  srv->proc->stop(30s);
  // Shards of one model evict in parallel: a model's offload is one shard's eviction.
  out.offload_s = evictions > 0 ? evict_s / evictions : 0;
  out.link_efficiency = load_s > 0 ? bytes_in / load_s / 1e9 / link : 0;
  return out;
}

}  // namespace

int run_experiment1(const experiment_options& o) {
  auto dir = output_dir(o, "exp1");
  if (!dir) {
    std::cerr << "computron bench exp1: " << render(dir.error()) << '\n';
    return dir.error().code() == static_cast<uint8_t>(ec::invalid_request) ? 2 : 1;
  }
  if (!o.json) {
    std::cout << "Experiment 1: two OPT-13B models, room for one, 24 alternating blocking "
                 "requests of batch 4 (first 4 dropped)\n"
              << scale_line(o.factor) << "\n"
              << "each cell runs twice: waiting for whole loads (load, exec and 'off' from it), "
              << (o.compute_while_loading ? "then computing while loading (response)"
                                          : "and again so (--no-overlap)")
              << "\n";
    // The toy shards carry the checkpoint's bytes split evenly; the real layout's bytes
    // over them, per split, say how close that is.
    std::cout << "OPT-13B's bytes on its devices over its checkpoint's (f16):";
    for (auto& ref : original_exp1)
      std::cout << fmt::format(" ({},{}) {:.4f}", ref.tp, ref.pp,
                               opt13b_bytes_over_weights(ref.tp, ref.pp));
    std::cout
        << "\n\n"
        << fmt::format(
               "{:<8} {:>15} {:>15} {:>13} {:>15} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6} {:>7}\n",
               "(TP,PP)", "offload s/orig", "load s/orig", "exec s/orig", "response s/orig",
               "ratio", "off s", "r/(l+e)", "r/bound", "r/pipe", "link", "x(1,1)");
  }
  json rows = json::array();
  double load_11 = 0;
  for (auto& ref : original_exp1) {
    auto name = fmt::format("exp1-tp{}-pp{}", ref.tp, ref.pp);
    // The reference: every batch waits for its whole load, so its lease wait is the load
    // and its compute the exec, as in the original.
    auto off = run_exp1_cell(o, ref, false, *dir, name + (o.compute_while_loading ? "-off" : ""));
    if (!off) {
      std::cerr << "computron bench exp1: " << render(off.error()) << '\n';
      return 1;
    }
    auto on = o.compute_while_loading ? run_exp1_cell(o, ref, true, *dir, name) : off;
    if (!on) {
      std::cerr << "computron bench exp1: " << render(on.error()) << '\n';
      return 1;
    }
    const double m_load = mean(off->load), m_exec = mean(off->exec);
    const double m_resp = mean(on->response), m_off = mean(off->response);
    if (ref.tp == 1 && ref.pp == 1) load_11 = m_load;
    const double speedup = m_load > 0 && load_11 > 0 ? load_11 / m_load : 0;
    const double p99 = workload::percentile(on->response, 0.99);
    // The target: max(load, exec) plus one layer's share of exec (+5%).
    const double layers = static_cast<double>(ref.pp * actors::toy_layers_per_stage);
    const double bound = std::max(m_load, m_exec) + m_exec / layers;
    // What a pipeline can reach when every stage's load ends at once: stage k+1 starts
    // only after stage k's last layer, which waits for stage k's last bytes.
    const double pipe = std::max(m_load, m_exec / ref.pp) +
                        m_exec * static_cast<double>(ref.pp - 1) / ref.pp + m_exec / layers;
    rows.push_back({{"tp", ref.tp},
                    {"pp", ref.pp},
                    {"opt13b_bytes_over_weights", opt13b_bytes_over_weights(ref.tp, ref.pp)},
                    {"offload_s", on->offload_s},
                    {"load_s", m_load},
                    {"exec_s", m_exec},
                    {"response_s", m_resp},
                    {"response_p99_s", p99},
                    {"response_without_overlap_s", m_off},
                    {"compute_while_loading", o.compute_while_loading},
                    {"response_over_load_plus_exec", m_resp / (m_load + m_exec)},
                    {"overlap_bound_s", bound},
                    {"response_over_bound", m_resp / bound},
                    {"pipeline_bound_s", pipe},
                    {"response_over_pipeline_bound", m_resp / pipe},
                    {"link_efficiency", on->link_efficiency},
                    {"load_speedup_vs_1x1", speedup},
                    {"original",
                     {{"offload_s", ref.offload},
                      {"load_s", ref.load},
                      {"exec_s", ref.exec},
                      {"response_s", ref.response}}},
                    {"response_ratio", m_resp / ref.response},
                    {"shard_bytes", shard_bytes(o.factor, ref.tp * ref.pp)}});
    if (!o.json)
      std::cout << fmt::format(
                       "({},{})    {:>6.3f}/{:<6.3f}  {:>6.3f}/{:<6.3f}  {:>5.3f}/{:<5.3f}  "
                       "{:>6.3f}/{:<6.3f}  {:>7.2f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>5.0f}% "
                       "{:>6.2f}x\n",
                       ref.tp, ref.pp, on->offload_s, ref.offload, m_load, ref.load, m_exec,
                       ref.exec, m_resp, ref.response, m_resp / ref.response, m_off,
                       m_resp / (m_load + m_exec), m_resp / bound, m_resp / pipe,
                       100 * on->link_efficiency, speedup)
                << std::flush;
  }
  if (o.json) {
    std::cout << json{{"experiment", 1},
                      {"factor", o.factor},
                      {"model_bytes", original_model_bytes / o.factor},
                      {"link_gbps", original_link_gbps / o.factor},
                      {"rows", rows}}
                     .dump()
              << '\n';
  } else {
    std::cout << "\nratio: our response / the original's (lower is better). load, exec: lease "
                 "wait and compute of the run that waits for whole loads; off s: its response. "
                 "r/(l+e): response / (load + exec). r/bound: response / (max(load, exec) + one "
                 "layer's share of exec), the target is at most 1.05. r/pipe: response / the "
                 "least a pipeline can take when all its stages' loads end together (load + "
                 "(pp-1)/pp exec + one layer). link: achieved share of the emulated link during "
                 "loads. x(1,1): load time of (1,1) / this one.\n"
              << "configs in " << dir->string() << '\n';
  }
  return 0;
}

int run_experiment2(const experiment_options& o) {
  if (o.drop_late && !(o.slo_s >= 0.001)) {
    std::cerr << "computron bench exp2: --drop-late needs --slo (of at least 0.001 s)\n";
    return 2;
  }
  auto dir = output_dir(o, "exp2");
  if (!dir) {
    std::cerr << "computron bench exp2: " << render(dir.error()) << '\n';
    return dir.error().code() == static_cast<uint8_t>(ec::invalid_request) ? 2 : 1;
  }
  const double link = original_link_gbps / o.factor;
  const auto bytes = shard_bytes(o.factor, 4);
  const double exec_ms = original_exp1[5].exec * 1e3;  // (2,2)
  if (!o.json)
    std::cout << fmt::format(
                     "Experiment 2: OPT-13B TP2 x PP2, Gamma arrivals, {:.0f} s per cell, policy "
                     "{}, batch window {} ms, seed {}; one unmeasured warm-up request per model "
                     "first, in "
                     "order (the original's clients sent theirs at once)\n{}\n\n{:<18} {:>5} {:>8} "
                     "{:>8} {:>7} {:>8} {:>8} {:>9} "
                     "{:>7}\n",
                     o.duration_s, o.policy, o.batch_window_ms, o.seed, scale_line(o.factor),
                     "rates", "cv", "mean s", "orig s", "ratio", "p99 s", "max s", "ok/sent",
                     "swaps")
              << std::flush;
  json cells = json::array();
  size_t cell = 0;
  double slo_sum = 0;
  for (auto& g : exp2_groups) {
    for (size_t ri = 0; ri < g.rate_lists.size(); ++ri) {
      for (size_t ci = 0; ci < 3; ++ci, ++cell) {
        auto label = fmt::format("{} cv {}", rates_label(g.rate_lists[ri]), exp2_cvs[ci]);
        if (!o.only.empty() && label.find(o.only) == std::string::npos) continue;
        json models = json::array();
        std::vector<std::string> names;
        for (size_t m = 0; m < g.models; ++m) {
          names.push_back(fmt::format("opt-13b-{}", static_cast<char>('a' + m)));
          models.push_back(toy_model(names.back(), 2, 2, o.seed * 100 + m, bytes, exec_ms));
        }
        auto cfg = server_config(
            4, static_cast<double>(bytes) * (static_cast<double>(g.capacity) + 0.5), link, g.batch,
            o.batch_window_ms, o.policy, models, o.compute_while_loading);
        auto name = fmt::format("exp2-cell{:02}", cell);
        auto srv = start_server(cfg, *dir, name);
        if (!srv) {
          std::cerr << "computron bench exp2: " << render(srv.error()) << '\n';
          return 1;
        }
        // Warm-up as the original's clients did: one unmeasured request per model before
        // the arrivals start. One after the other (the original sent them at once), so
        // that which models are resident at the start is the same in every run: the
        // last `capacity` ones.
        for (uint32_t m = 0; m < names.size(); ++m) {
          workload::schedule warm{names, {{0.0, m, 0, 0}}, 1.0};
          net::loadgen_options wo;
          wo.server = srv->at;
          auto warmed = net::run_loadgen(warm, srv->models, wo);
          if (!warmed || !warmed->records.front().ok()) {
            std::cerr << "computron bench exp2: the warm-up request to " << names[m] << " failed\n";
            return 1;
          }
        }
        auto sched = workload::generate(
            {names, g.rate_lists[ri], exp2_cvs[ci], o.duration_s, o.seed * 1000 + cell});
        if (!sched) {
          std::cerr << "computron bench exp2: " << render(sched.error()) << '\n';
          return 1;
        }
        net::loadgen_options lo;
        lo.server = srv->at;
        lo.seed = o.seed + cell;
        lo.max_connections = 1024;
        if (o.drop_late) lo.deadline_ms = static_cast<uint32_t>(std::lround(o.slo_s * 1000));
        auto run = net::run_loadgen(*sched, srv->models, lo);
        srv->proc->stop(30s);
        if (!run) {
          std::cerr << "computron bench exp2: " << render(run.error()) << '\n';
          return 1;
        }
        auto s = workload::summarize_run(names, run->records, o.slo_s, run->devices);
        slo_sum += s.overall.slo_attainment;
        json extra{{"cell", label}, {"config", name + ".json"}};
        if (auto err = workload::write_report((*dir / name).string(), s, run->records, run->swaps,
                                              extra.dump()))
          std::cerr << "computron bench exp2: " << render(err) << '\n';
        double loads = 0;
        for (auto& d : s.devices) loads = std::max(loads, d.shard_loads);
        const double orig = g.original_mean[ri][ci];
        cells.push_back({{"rates", g.rate_lists[ri]},
                         {"cv", exp2_cvs[ci]},
                         {"models", g.models},
                         {"capacity", g.capacity},
                         {"batch", g.batch},
                         {"sent", s.overall.sent},
                         {"ok", s.overall.ok},
                         {"failed", s.overall.failed},
                         {"mean_s", s.overall.latency.mean},
                         {"p50_s", s.overall.latency.p50},
                         {"p99_s", s.overall.latency.p99},
                         {"max_s", s.overall.latency.max},
                         {"original_mean_s", orig},
                         {"ratio", s.overall.latency.mean / orig},
                         {"model_loads", loads},
                         {"slo_attainment", s.overall.slo_attainment},
                         {"report", (*dir / name).string()}});
        if (!o.json)
          std::cout << fmt::format(
                           "{:<18} {:>5} {:>8.3f} {:>8.3f} {:>7.2f} {:>8.3f} {:>8.3f} {:>4}/{:<4} "
                           "{:>7.0f}\n",
                           rates_label(g.rate_lists[ri]), exp2_cvs[ci], s.overall.latency.mean,
                           orig, s.overall.latency.mean / orig, s.overall.latency.p99,
                           s.overall.latency.max, s.overall.ok, s.overall.sent, loads)
                    << std::flush;
      }
    }
  }
  if (o.json) {
    std::cout << json{{"experiment", 2},
                      {"factor", o.factor},
                      {"model_bytes", original_model_bytes / o.factor},
                      {"link_gbps", link},
                      {"policy", o.policy},
                      {"seed", o.seed},
                      {"duration_s", o.duration_s},
                      {"batch_window_ms", o.batch_window_ms},
                      {"slo_s", o.slo_s},
                      {"drop_late", o.drop_late},
                      {"cells", cells}}
                     .dump()
              << '\n';
  } else {
    if (o.slo_s > 0 && !cells.empty())
      std::cout << fmt::format("\nSLO {} s{}: attainment {:.4f} (mean over {} cells)\n", o.slo_s,
                               o.drop_late ? ", drop_late" : "",
                               slo_sum / static_cast<double>(cells.size()), cells.size());
    std::cout << "\nratio: our mean / the original's (target <= 0.5). swaps: model loads (per "
                 "device). Reports and configs in "
              << dir->string() << '\n';
  }
  return 0;
}

}  // namespace computron::bench
