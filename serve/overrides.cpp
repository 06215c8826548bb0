// serve's flags over the serve config: the base config they start from, then each flag.
#include "serve/overrides.hpp"

#include <cmath>
#include <cstdint>

#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/model_spec.hpp"
#include "common/error.hpp"
#include "models/decoder_spec.hpp"
#include "models/gguf_model.hpp"
#include "serve/repository.hpp"

namespace computron::serve {

caf::expected<serve_config> base_serve_config(const serve_overrides& o) {
  auto repository = o.repository;
  if (!o.model_dir.empty()) {
    if (!repository.empty())
      return make_error(ec::invalid_configuration,
                        "MODEL_DIR and --repository both name what to serve: give one");
    std::error_code ec;
    if (std::filesystem::is_regular_file(o.model_dir, ec) && !models::is_gguf_file(o.model_dir))
      return make_error(ec::invalid_configuration,
                        o.model_dir +
                            " is a file but not a GGUF file: serve takes a GGUF file, a "
                            "model's folder (config.json, safetensors, tokenizer files) or a "
                            "repository of them");
    repository = o.model_dir;
  }
  // --repository is served instead of the config's `repository`, its models beside the
  // config's inline ones; without --config it replaces the built-in models.
  if (!o.config_path.empty())
    return load_serve_config(o.config_path, repository, o.served_model_name);
  if (repository.empty()) return default_serve_config();
  auto cfg = default_settings();
  cfg.served_name = o.served_model_name;
  // The built-in devices are sized for the embedded default; the models given are served
  // on devices that hold them (unless --capacity-mb says otherwise).
  cfg.size_devices_to_models = true;
  if (auto err = add_repository(cfg, repository)) return err;
  return cfg;
}

namespace {

/// vLLM's --dtype words in ours.
std::optional<std::string> dtype_of(const std::string& v) {
  if (v == "auto") return std::string{"auto"};
  if (v == "half" || v == "float16") return std::string{"f16"};
  if (v == "bfloat16") return std::string{"bf16"};
  if (v == "float" || v == "float32") return std::string{"f32"};
  return std::nullopt;
}

/// Caps the model's context at `n` positions; it cannot grow past its own.
std::string cap_positions(actors::model_config& m, int64_t n) {
  if (m.kind == "toy")
    return "--max-model-len: model " + m.name + " is a toy model, whose context is fixed";
  auto s = actors::decoder_spec_of(m);
  if (!s) return "--max-model-len: model " + m.name + ": " + render(s.error());
  if (n > s->max_positions)
    return fmt::format("--max-model-len {} exceeds the {} positions of model {}", n,
                       s->max_positions, m.name);
  s->max_positions = n;
  if (s->name.empty()) s->name = m.spec.empty() ? m.name : m.spec;
  m.arch = models::to_json(*s).dump();
  m.shape.clear();
  return {};
}

/// vLLM's flags in ours, kept in the config; over every model it serves now.
std::string keep_model_flags(serve_config& cfg, const serve_overrides& o) {
  if (!o.served_model_name.empty() && cfg.repository.empty())
    return "--served-model-name names the model of a folder given to serve (serve MODEL_DIR), "
           "and none is given";
  if (!o.dtype.empty()) {
    auto dtype = dtype_of(o.dtype);
    if (!dtype)
      return "--dtype takes auto, half, float16, bfloat16, float or float32, not '" + o.dtype + "'";
    cfg.flags.dtype = *dtype;
  }
  if (o.tensor_parallel_size > 0) cfg.flags.tp = o.tensor_parallel_size;
  if (o.pipeline_parallel_size > 0) cfg.flags.pp = o.pipeline_parallel_size;
  if (o.max_model_len > 0) cfg.flags.max_model_len = o.max_model_len;
  for (auto& m : cfg.models)
    if (auto why = apply_model_flags(m, cfg.flags); !why.empty()) return why;
  return {};
}

/// --lora-modules: each PEFT folder joins the served models as an adapter.
std::string add_lora_modules(serve_config& cfg, const std::vector<std::string>& modules) {
  for (auto& given : modules) {
    std::string name, path, base;
    if (!given.empty() && given.front() == '{') {
      auto j = nlohmann::json::parse(given, nullptr, false);
      if (j.is_discarded() || !j.is_object())
        return "--lora-modules: '" + given + "' is not a JSON object";
      for (auto& [key, v] : j.items()) {
        if (key != "name" && key != "path" && key != "base_model_name")
          return "--lora-modules: unknown key '" + key +
                 "' (a module has name, path and base_model_name)";
        if (!v.is_string()) return "--lora-modules: '" + key + "' must be a string";
      }
      name = j.value("name", "");
      path = j.value("path", "");
      base = j.value("base_model_name", "");
    } else if (auto eq = given.find('='); eq != std::string::npos) {
      name = given.substr(0, eq);
      path = given.substr(eq + 1);
    }
    if (name.empty() || path.empty())
      return "--lora-modules takes name=path or {\"name\": ..., \"path\": ...}, not '" + given +
             "'";
    for (auto& m : cfg.models)
      if (m.name == name) return "--lora-modules: a model named " + name + " is served already";
    auto m = read_adapter_source(path, name, base);
    if (!m) return "--lora-modules " + name + ": " + render(m.error());
    cfg.models.push_back(std::move(*m));
  }
  return {};
}

}  // namespace

std::string apply_model_flags(actors::model_config& m, const model_flags& f) {
  // An adapter runs inside its base's forward: its dtype, split and context are the base's.
  if (!m.base.empty()) return {};
  if (!f.dtype.empty()) m.dtype = f.dtype;
  if (f.tp > 0 || f.pp > 0) {
    if (f.tp > 0) m.tp = f.tp;
    if (f.pp > 0) m.pp = f.pp;
    // Devices listed for another tp x pp no longer fit: the registry places the model.
    if (m.devices.size() != static_cast<size_t>(m.tp * m.pp)) m.devices.clear();
  }
  if (f.max_model_len > 0) return cap_positions(m, f.max_model_len);
  return {};
}

std::string apply_overrides(serve_config& cfg, const serve_overrides& o) {
  if (o.capacity_mb > 0) {
    // Emulated memory only: a GPU's memory is what it is (the config's
    // devices.capacity_mb caps its weights arena), and nodes bring their own devices.
    if (cfg.runtime.devices.kind != "emulated")
      return "--capacity-mb sets the memory of emulated devices, and the devices are '" +
             cfg.runtime.devices.kind +
             "' (set devices.kind to emulated, or cap a GPU's weights arena with "
             "devices.capacity_mb in the config)";
    if (!o.nodes.empty() || !cfg.cluster.nodes.empty())
      return "--capacity-mb sets this process's emulated devices, and it serves with nodes "
             "(give each `computron node` --capacity-mb)";
    cfg.runtime.devices.emulated_capacity_bytes =
        static_cast<uint64_t>(std::llround(o.capacity_mb * 1048576.0));
    cfg.size_devices_to_models = false;
  }
  if (!o.host.empty()) cfg.http.host = o.host;
  if (o.port >= 0) cfg.http.port = static_cast<uint16_t>(o.port);
  if (o.devices > 0) cfg.runtime.devices.count = o.devices;
  if (!o.trace_file.empty()) cfg.trace_file = o.trace_file;
  if (!o.api_key.empty()) cfg.http.api_key = o.api_key;
  if (o.allow_runtime_lora_updating) cfg.http.runtime_lora_updates = true;
  if (o.max_lora_rank > 0) cfg.runtime.registry.max_lora_rank = o.max_lora_rank;
  if (!o.nodes.empty()) {
    auto nodes = net::parse_node_list(o.nodes);
    if (!nodes) return render(nodes.error());
    cfg.cluster.nodes = std::move(*nodes);
  }
  if (o.tls.enabled()) cfg.tls = o.tls;
  if (o.console_port >= -1) cfg.console_port = o.console_port;
  if (auto why = add_lora_modules(cfg, o.lora_modules); !why.empty()) return why;
  return keep_model_flags(cfg, o);
}

}  // namespace computron::serve
