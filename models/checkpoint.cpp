#include "models/checkpoint.hpp"
#include "models/gguf_model.hpp"

#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_file.hpp"
#include "models/weights.hpp"

namespace computron::models {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* index_file = "model.safetensors.index.json";
constexpr const char* single_file = "model.safetensors";

/// Our name for a tensor of a Hugging Face checkpoint: OPT's `model.decoder.` and the
/// Llama family's `model.` prefixes go; `lm_head.weight` stays as it is.
std::string our_name(const std::string& name, bool& opt_style) {
  for (std::string_view prefix : {"model.decoder.", "decoder."})
    if (name.rfind(prefix, 0) == 0) {
      opt_style = true;
      return name.substr(prefix.size());
    }
  if (name == "model.lm_head.weight") return "lm_head.weight";
  if (name.rfind("model.", 0) == 0) return name.substr(6);
  return name;
}

bool is_float(gpu::dtype t) {
  return t == gpu::dtype::f32 || t == gpu::dtype::bf16 || t == gpu::dtype::f16;
}

}  // namespace

caf::error checkpoint::add_file(const std::string& path) {
  auto f = safetensors_file::open(path);
  if (!f) return std::move(f.error());
  files_.push_back(std::make_unique<safetensors_file>(std::move(*f)));
  for (auto& [name, t] : files_.back()->tensors()) {
    auto ours = our_name(name, opt_style_);
    if (!tensors_.emplace(ours, &t).second)
      return make_error(ec::invalid_request,
                        fmt::format("checkpoint {}: tensor '{}' appears twice", path, ours));
    if (tensors_.size() == 1 || (!is_float(dtype_) && is_float(t.type))) dtype_ = t.type;
  }
  return {};
}

caf::expected<checkpoint> checkpoint::open(const std::string& path) {
  auto c = open_files(path);
  if (!c) return c;
  // OPT's head is tied to the token embedding: its lm_head.weight is a copy nobody reads.
  if (c->opt_style_) c->tensors_.erase("lm_head.weight");
  return c;
}

caf::expected<checkpoint> checkpoint::open_files(const std::string& path) {
  checkpoint c;
  c.source_ = path;
  std::error_code ec;
  if (is_gguf_file(path)) {
    // Dequantized once into memory the checkpoint keeps, under Hugging Face's names.
    auto g = read_gguf_tensors(path);
    if (!g) return g.error();
    c.gguf_ = *g;
    for (auto& t : c.gguf_->tensors)
      if (!c.tensors_.emplace(t.name, &t).second)
        return make_error(ec::invalid_request,
                          fmt::format("{}: two tensors are named '{}'", path, t.name));
    c.dtype_ = gpu::dtype::f32;
    return c;
  }
  if (!fs::is_directory(path, ec)) {
    if (auto err = c.add_file(path)) return err;
    return c;
  }
  auto dir = fs::path{path};
  if (fs::exists(dir / index_file)) {
    auto idx = read_json_file(dir / index_file);
    if (!idx) return std::move(idx.error());
    auto where = (dir / index_file).string();
    auto map = idx->find("weight_map");
    if (map == idx->end() || !map->is_object() || map->empty())
      return make_error(ec::invalid_request, where + ": no weight_map object");
    std::set<std::string> files;
    for (auto& [tensor, file] : map->items()) {
      if (!file.is_string())
        return make_error(ec::invalid_request,
                          fmt::format("{}: the file of '{}' is not a string", where, tensor));
      auto f = file.get<std::string>();
      // Shard names are plain file names beside the index, never paths out of the folder.
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        return make_error(ec::invalid_request,
                          fmt::format("{}: '{}' is not a file name in the folder", where, f));
      files.insert(f);
    }
    std::map<std::string, const safetensors_file*> by_file;
    for (auto& f : files) {
      if (!fs::exists(dir / f))
        return make_error(ec::io_error,
                          fmt::format("{} names shard {}, which is missing", where, f));
      if (auto err = c.add_file((dir / f).string())) return err;
      by_file[f] = c.files_.back().get();
    }
    // Every tensor the index promises must be in the shard it names.
    for (auto& [tensor, file] : map->items()) {
      if (by_file.at(file.get<std::string>())->find(tensor) == nullptr)
        return make_error(ec::invalid_request,
                          fmt::format("{} says tensor '{}' is in {}, which does not hold it", where,
                                      tensor, file.get<std::string>()));
    }
    return c;
  }
  if (fs::exists(dir / single_file)) {
    if (auto err = c.add_file((dir / single_file).string())) return err;
    return c;
  }
  if (auto err = check_checkpoint_files(path)) return err;
  return make_error(ec::io_error,
                    fmt::format("folder {} has neither {} nor {}", path, index_file, single_file));
}

const safetensor* checkpoint::find(std::string_view name) const {
  auto i = tensors_.find(name);
  return i == tensors_.end() ? nullptr : i->second;
}

caf::error write_hf_opt_folder(const std::string& folder, const opt_spec& spec, gpu::dtype type,
                               uint64_t seed, int files) {
  if (files < 1) return make_error(ec::invalid_request, "a checkpoint needs at least one file");
  auto table = shard_layout(spec, type, {1, 1}, {0, 0});
  if (!table) return std::move(table.error());
  std::vector<std::byte> host(table->total_bytes());
  if (auto err = fill_seeded(spec, {1, 1}, {0, 0}, *table, host.data(), seed)) return err;
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) return make_error(ec::io_error, "cannot create " + folder + ": " + ec.message());
  auto& entries = table->entries();
  std::vector<std::vector<safetensor>> groups(static_cast<size_t>(files));
  for (size_t i = 0; i < entries.size(); ++i) {
    auto& e = entries[i];
    bool opt = spec.family == model_family::opt;
    auto name = e.name == "lm_head.weight" ? e.name : (opt ? "model.decoder." : "model.") + e.name;
    safetensor t{name, e.type, e.shape, host.data() + e.offset_bytes, e.size_bytes};
    auto g = i * static_cast<size_t>(files) / entries.size();
    groups[g].push_back(t);
    if (opt && e.name == "embed_tokens.weight") {
      t.name = "lm_head.weight";  // tied: the same values, as transformers saves them
      groups.back().push_back(t);
    }
  }
  json map = json::object();
  for (int k = 0; k < files; ++k) {
    auto name = files == 1 ? std::string{single_file}
                           : fmt::format("model-{:05}-of-{:05}.safetensors", k + 1, files);
    if (auto err = write_safetensors((fs::path{folder} / name).string(),
                                     groups[static_cast<size_t>(k)], {{"format", "pt"}}))
      return err;
    for (auto& t : groups[static_cast<size_t>(k)]) map[t.name] = name;
  }
  if (files > 1) {
    json idx = {{"metadata", {{"total_size", table->total_bytes()}}}, {"weight_map", map}};
    std::ofstream out{fs::path{folder} / index_file};
    out << idx.dump(2);
    if (!out) return make_error(ec::io_error, "cannot write the index in " + folder);
  }
  const char* dtype_name = type == gpu::dtype::f16    ? "float16"
                           : type == gpu::dtype::bf16 ? "bfloat16"
                                                      : "float32";
  if (spec.family == model_family::llama) {
    // The Llama family's config.json as transformers writes it for this model_type.
    auto type = spec.model_type.empty() ? std::string{"llama"} : spec.model_type;
    const char* arch = type == "mistral" ? "MistralForCausalLM"
                       : type == "qwen2" ? "Qwen2ForCausalLM"
                       : type == "qwen3" ? "Qwen3ForCausalLM"
                                         : "LlamaForCausalLM";
    json rope = nullptr;
    if (!spec.rope.scaling.empty()) {
      rope = {{"rope_type", spec.rope.scaling}, {"factor", spec.rope.factor}};
      if (spec.rope.scaling == "llama3") {
        rope["low_freq_factor"] = spec.rope.low_freq_factor;
        rope["high_freq_factor"] = spec.rope.high_freq_factor;
        rope["original_max_position_embeddings"] = spec.rope.original_max_positions;
      }
    }
    json cfg = {{"_name_or_path", spec.name},
                {"architectures", {arch}},
                {"model_type", type},
                {"hidden_act", "silu"},
                {"hidden_size", spec.hidden},
                {"intermediate_size", spec.ffn},
                {"num_hidden_layers", spec.layers},
                {"num_attention_heads", spec.heads},
                {"num_key_value_heads", spec.kv_head_count()},
                {"head_dim", spec.head_size()},
                {"vocab_size", spec.vocab},
                {"max_position_embeddings", spec.max_positions},
                {"rms_norm_eps", spec.norm_eps},
                {"rope_theta", spec.rope.theta},
                {"rope_scaling", rope},
                {"attention_bias", type != "qwen2" && spec.qkv_bias},
                {"tie_word_embeddings", spec.tied_embeddings},
                {"torch_dtype", dtype_name}};
    if (type == "mistral") cfg["sliding_window"] = nullptr;
    std::ofstream out{fs::path{folder} / "config.json"};
    out << cfg.dump(2);
    if (!out) return make_error(ec::io_error, "cannot write config.json in " + folder);
    return {};
  }
  json cfg = {{"_name_or_path", spec.name},
              {"architectures", {"OPTForCausalLM"}},
              {"model_type", "opt"},
              {"activation_function", "relu"},
              {"do_layer_norm_before", true},
              {"enable_bias", true},
              {"hidden_size", spec.hidden},
              {"num_hidden_layers", spec.layers},
              {"num_attention_heads", spec.heads},
              {"ffn_dim", spec.ffn},
              {"vocab_size", spec.vocab},
              {"max_position_embeddings", spec.max_positions},
              {"word_embed_proj_dim", spec.hidden},
              {"torch_dtype", dtype_name},
              {"bos_token_id", 2},
              {"eos_token_id", 2},
              {"pad_token_id", 1}};
  std::ofstream out{fs::path{folder} / "config.json"};
  out << cfg.dump(2);
  if (!out) return make_error(ec::io_error, "cannot write config.json in " + folder);
  return {};
}

}  // namespace computron::models
