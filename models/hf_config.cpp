// Hugging Face config.json readers: which family a folder holds and its shape. Every field
// is type-checked before it is read (the hf_folder fuzz target feeds these), and what the
// forward does not implement is refused here, naming the field and value, rather than
// served wrong.
#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_file.hpp"
#include "models/checkpoint.hpp"

namespace computron::models {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// One config.json with typed field readers whose errors name the file and the field.
struct config_reader {
  std::string path;
  json j;

  caf::error bad(const std::string& why) const {
    return make_error(ec::invalid_configuration, path + ": " + why);
  }

  /// A field transformers writes as a string; json::value() would throw on another type
  /// (found by the hf_folder fuzz target: "model_type": 64).
  caf::expected<std::string> text(const char* key, std::string fallback) const {
    auto it = j.find(key);
    if (it == j.end()) return fallback;
    if (!it->is_string()) return bad(std::string{"field "} + key + " must be a string");
    return it->get<std::string>();
  }

  /// A positive integer dimension; absent or null leaves `out` when not required.
  caf::error dim(const char* key, int64_t& out, bool required) const {
    auto it = j.find(key);
    if (it == j.end() || (!required && it->is_null()))
      return required ? bad(std::string{"no field "} + key) : caf::error{};
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (1ll << 31))
      return bad(std::string{"field "} + key + " must be a positive integer");
    out = it->get<int64_t>();
    return {};
  }

  caf::error number(const json& o, const std::string& where, const char* key, double& out) const {
    auto it = o.find(key);
    if (it == o.end() || it->is_null()) return {};
    if (!it->is_number() || !(it->get<double>() > 0) || it->get<double>() > 1e30)
      return bad(fmt::format("field {}{} must be a positive number", where, key));
    out = it->get<double>();
    return {};
  }

  caf::error flag(const char* key, bool& out) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return {};
    if (!it->is_boolean()) return bad(std::string{"field "} + key + " must be true or false");
    out = it->get<bool>();
    return {};
  }

  /// The checkpoint's dtype (`torch_dtype`, or `dtype` in newer files) as "f16", "bf16",
  /// "f32"; empty when it says none.
  caf::expected<std::string> dtype() const {
    for (const char* key : {"torch_dtype", "dtype"}) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_string()) continue;
      auto d = it->get<std::string>();
      if (d == "float16") return std::string{"f16"};
      if (d == "bfloat16") return std::string{"bf16"};
      if (d == "float32") return std::string{"f32"};
      return bad(fmt::format("{} '{}' is not float16, bfloat16 or float32", key, d));
    }
    return std::string{};
  }

  /// A quantized checkpoint (AWQ, GPTQ, FP8, bitsandbytes, compressed-tensors ...) is
  /// refused here, naming its method: its tensors are packed integers or FP8 with scales,
  /// which would otherwise fail later as "missing tensor" or "not a valid safetensors".
  caf::error unquantized() const {
    for (const char* key : {"quantization_config", "compression_config"}) {
      auto it = j.find(key);
      if (it == j.end() || it->is_null()) continue;
      std::string method = "an unnamed method";
      if (it->is_object())
        if (auto m = it->find("quant_method"); m != it->end() && m->is_string())
          method = "'" + m->get<std::string>() + "'";
      return bad(
          fmt::format("{} names {}: quantized checkpoints are not supported yet; serve the model's "
                      "float16, bfloat16 or float32 weights",
                      key, method));
    }
    return {};
  }

  /// The model_type and every string of `architectures`.
  caf::expected<std::pair<std::string, std::vector<std::string>>> identity() const {
    auto model_type = text("model_type", "");
    if (!model_type) return std::move(model_type.error());
    std::vector<std::string> archs;
    if (auto a = j.find("architectures"); a != j.end() && a->is_array())
      for (auto& x : *a)
        if (x.is_string()) archs.push_back(x.get<std::string>());
    return std::pair{std::move(*model_type), std::move(archs)};
  }
};

caf::expected<config_reader> open_config(const std::string& folder) {
  auto path = (fs::path{folder} / "config.json").string();
  auto j = read_json_file(path);
  if (!j) return std::move(j.error());
  config_reader r{path, std::move(*j)};
  if (!r.j.is_object()) return r.bad("not a JSON object");
  if (auto e = r.unquantized()) return e;
  return r;
}

/// The Llama family's model types and their architectures.
const std::vector<std::pair<std::string, std::string>>& llama_types() {
  static const std::vector<std::pair<std::string, std::string>> t = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"}};
  return t;
}

/// Rotary settings from `rope_scaling` (transformers 4) or `rope_parameters`
/// (transformers 5, which also moves rope_theta there).
caf::error read_rope(const config_reader& r, rope_config& rope) {
  if (auto e = r.number(r.j, "", "rope_theta", rope.theta)) return e;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = r.j.find(key);
    if (it == r.j.end() || it->is_null()) continue;
    auto where = std::string{key} + ".";
    if (!it->is_object()) return r.bad(fmt::format("field {} must be an object or null", key));
    auto& o = *it;
    if (auto e = r.number(o, where, "rope_theta", rope.theta)) return e;
    std::string type;
    for (const char* tk : {"rope_type", "type"}) {
      auto t = o.find(tk);
      if (t == o.end()) continue;
      if (!t->is_string()) return r.bad(fmt::format("field {}{} must be a string", where, tk));
      type = t->get<std::string>();
      break;
    }
    if (type.empty() || type == "default") continue;
    if (type != "linear" && type != "llama3")
      return r.bad(fmt::format(
          "{}rope_type '{}' is not implemented (linear and llama3 are; yarn, longrope and "
          "dynamic scaling are not)",
          where, type));
    rope.scaling = type;
    if (auto e = r.number(o, where, "factor", rope.factor)) return e;
    if (type == "llama3") {
      if (auto e = r.number(o, where, "low_freq_factor", rope.low_freq_factor)) return e;
      if (auto e = r.number(o, where, "high_freq_factor", rope.high_freq_factor)) return e;
      if (auto it = o.find("original_max_position_embeddings"); it != o.end()) {
        // An integer in range before it converts (a float past int64 would be undefined).
        if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (1ll << 31))
          return r.bad(where + "original_max_position_embeddings must be a positive integer");
        rope.original_max_positions = it->get<int64_t>();
      }
      if (!(rope.high_freq_factor > rope.low_freq_factor))
        return r.bad(where + "high_freq_factor must exceed low_freq_factor");
    }
  }
  return {};
}

}  // namespace

bool is_hf_folder(const std::string& folder) {
  auto j = read_json_file(fs::path{folder} / "config.json");
  return j && j->is_object() && (j->contains("architectures") || j->contains("model_type"));
}

caf::expected<hf_model_config> read_hf_llama_config(const std::string& folder) {
  auto r = open_config(folder);
  if (!r) return std::move(r.error());
  auto id = r->identity();
  if (!id) return std::move(id.error());
  auto& [model_type, archs] = *id;
  std::string type;
  for (auto& [t, arch] : llama_types())
    if (model_type == t || std::find(archs.begin(), archs.end(), arch) != archs.end()) type = t;
  if (type.empty())
    return r->bad(
        fmt::format("model_type '{}' is not of the Llama family (llama, mistral, qwen2, "
                    "qwen3)",
                    model_type));
  hf_model_config c;
  auto& s = c.spec;
  s.family = model_family::llama;
  s.model_type = type;
  auto name = r->text("_name_or_path", type);
  if (!name) return std::move(name.error());
  s.name = name->empty() ? type : *name;
  s.norm_eps = 1e-6;  // LlamaConfig's, Qwen's and Mistral's default
  if (auto e = r->dim("hidden_size", s.hidden, true)) return e;
  if (auto e = r->dim("num_hidden_layers", s.layers, true)) return e;
  if (auto e = r->dim("num_attention_heads", s.heads, true)) return e;
  if (auto e = r->dim("intermediate_size", s.ffn, true)) return e;
  if (auto e = r->dim("vocab_size", s.vocab, true)) return e;
  if (auto e = r->dim("max_position_embeddings", s.max_positions, true)) return e;
  if (auto e = r->dim("num_key_value_heads", s.kv_heads, false)) return e;
  if (auto e = r->dim("head_dim", s.head_dim, false)) return e;
  if (auto e = r->number(r->j, "", "rms_norm_eps", s.norm_eps)) return e;
  if (auto e = read_rope(*r, s.rope)) return e;
  auto act = r->text("hidden_act", "silu");
  if (!act) return std::move(act.error());
  if (*act != "silu")
    return r->bad("hidden_act '" + *act + "' is not implemented (the SwiGLU MLP uses silu)");
  bool mlp_bias = false;
  if (auto e = r->flag("mlp_bias", mlp_bias)) return e;
  if (mlp_bias) return r->bad("mlp_bias: true is not implemented");
  bool attention_bias = false;
  if (auto e = r->flag("attention_bias", attention_bias)) return e;
  // Qwen2 always has q/k/v biases and never an output bias; the others follow the flag.
  s.qkv_bias = type == "qwen2" || attention_bias;
  s.o_bias = type != "qwen2" && attention_bias;
  s.qk_norm = type == "qwen3";
  s.tied_embeddings = false;  // every family's default (transformers' own is true)
  if (auto e = r->flag("tie_word_embeddings", s.tied_embeddings)) return e;
  // A sliding window only matters past its length: cap the positions there, so the
  // window never applies (Mistral v0.1: 4096 of 32768). Qwen's window is off unless
  // use_sliding_window says so.
  bool window_on = type == "mistral";
  if (auto e = r->flag("use_sliding_window", window_on)) return e;
  // MistralConfig's default window is 4096 when the key is absent; null means none.
  int64_t window = type == "mistral" && !r->j.contains("sliding_window") ? 4096 : 0;
  if (window_on)
    if (auto e = r->dim("sliding_window", window, false)) return e;
  if (window > 0 && window < s.max_positions) s.max_positions = window;
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  auto d = r->dtype();
  if (!d) return std::move(d.error());
  c.dtype = std::move(*d);
  if (auto e = validate(s, {1, 1})) return r->bad(to_string(e));
  return c;
}

caf::expected<hf_model_config> read_hf_config(const std::string& folder) {
  auto r = open_config(folder);
  if (!r) return std::move(r.error());
  auto id = r->identity();
  if (!id) return std::move(id.error());
  auto& [model_type, archs] = *id;
  if (model_type == "opt" || std::find(archs.begin(), archs.end(), "OPTForCausalLM") != archs.end())
    return read_hf_opt_config(folder);
  for (auto& [t, arch] : llama_types())
    if (model_type == t || std::find(archs.begin(), archs.end(), arch) != archs.end())
      return read_hf_llama_config(folder);
  std::string names;
  for (auto& a : archs) names += (names.empty() ? "" : ", ") + a;
  return r->bad(fmt::format(
      "model_type '{}' (architectures [{}]) is not served: Computron serves opt, llama, mistral, "
      "qwen2 and qwen3 (OPTForCausalLM, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
      "Qwen3ForCausalLM)",
      model_type, names));
}

caf::error check_checkpoint_files(const std::string& folder) {
  auto dir = fs::path{folder};
  if (fs::exists(dir / "model.safetensors.index.json") || fs::exists(dir / "model.safetensors"))
    return {};
  if (fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json"))
    return make_error(
        ec::invalid_configuration,
        fmt::format("folder {} holds pytorch_model.bin but no safetensors: Computron reads "
                    "safetensors only (they map without unpickling); convert the folder with "
                    "transformers: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, "
                    "safe_serialization=True)",
                    folder));
  return make_error(ec::io_error,
                    fmt::format("folder {} has neither model.safetensors.index.json nor "
                                "model.safetensors",
                                folder));
}

caf::expected<hf_opt_config> read_hf_opt_config(const std::string& folder) {
  auto r = open_config(folder);
  if (!r) return std::move(r.error());
  auto id = r->identity();
  if (!id) return std::move(id.error());
  auto& [model_type, archs] = *id;
  bool opt =
      model_type == "opt" || std::find(archs.begin(), archs.end(), "OPTForCausalLM") != archs.end();
  if (!opt)
    return r->bad(
        "architectures/model_type do not name an OPT model (OPTForCausalLM); only OPT is "
        "served");
  hf_model_config c;
  auto name = r->text("_name_or_path", "opt");
  if (!name) return std::move(name.error());
  c.spec.name = std::move(*name);
  if (c.spec.name.empty()) c.spec.name = "opt";
  c.spec.model_type = "opt";
  if (auto e = r->dim("hidden_size", c.spec.hidden, true)) return e;
  if (auto e = r->dim("num_hidden_layers", c.spec.layers, true)) return e;
  if (auto e = r->dim("num_attention_heads", c.spec.heads, true)) return e;
  if (auto e = r->dim("ffn_dim", c.spec.ffn, true)) return e;
  if (auto e = r->dim("vocab_size", c.spec.vocab, true)) return e;
  if (auto e = r->dim("max_position_embeddings", c.spec.max_positions, true)) return e;
  int64_t proj = c.spec.hidden;
  if (auto e = r->dim("word_embed_proj_dim", proj, false)) return e;
  if (proj != c.spec.hidden)
    return r->bad(
        fmt::format("word_embed_proj_dim {} differs from hidden_size {} (projected "
                    "embeddings, as in OPT-350m, are not implemented)",
                    proj, c.spec.hidden));
  auto require = [&](const char* key, bool want, const char* why) -> caf::error {
    bool have = want;
    if (auto e = r->flag(key, have)) return e;
    if (have != want) return r->bad(fmt::format("{}: {} is not implemented ({})", key, have, why));
    return {};
  };
  if (auto e = require("do_layer_norm_before", true, "post-LayerNorm, as in OPT-350m")) return e;
  if (auto e = require("enable_bias", true, "linear layers without bias")) return e;
  if (auto e = require("layer_norm_elementwise_affine", true, "layer norms without weights"))
    return e;
  if (auto a = r->j.find("activation_function"); a != r->j.end())
    if (!a->is_string() || a->get<std::string>() != "relu")
      return r->bad("activation_function " + a->dump() + " is not implemented (relu is)");
  if (c.spec.hidden % c.spec.heads != 0)
    return r->bad(fmt::format("hidden_size {} is not a multiple of num_attention_heads {}",
                              c.spec.hidden, c.spec.heads));
  auto d = r->dtype();
  if (!d) return std::move(d.error());
  c.dtype = std::move(*d);
  return c;
}

}  // namespace computron::models
