#include "models/gguf_model.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/gguf.hpp"

namespace computron::models {

namespace {

namespace fs = std::filesystem;

caf::error bad(const std::string& path, const std::string& why) {
  return make_error(ec::invalid_configuration, path + ": " + why);
}

/// The architectures served, and the Hugging Face model_type each is.
bool served_architecture(const std::string& arch) {
  return arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "qwen3";
}

/// `key` of the architecture (`llama.block_count`), an integer of at least 1.
caf::error dimension(const gguf_file& f, const std::string& arch, const char* key, int64_t& out,
                     bool required) {
  auto full = arch + "." + key;
  if (!f.find(full)) return required ? bad(f.path(), "no " + full) : caf::error{};
  auto v = f.get_int(full);
  if (!v) return with_context(v.error(), f.path());
  if (*v < 1 || *v > (int64_t{1} << 31))
    return bad(f.path(), fmt::format("{} is {}: it must be a positive integer", full, *v));
  out = *v;
  return {};
}

/// Our name for a GGUF tensor name, or empty when no Llama-family tensor has it.
std::string our_name(const std::string& name) {
  static const std::vector<std::pair<std::string, std::string>> whole = {
      {"token_embd.weight", "embed_tokens.weight"},
      {"output_norm.weight", "norm.weight"},
      {"output.weight", "lm_head.weight"}};
  for (auto& [g, ours] : whole)
    if (name == g) return ours;
  static const std::vector<std::pair<std::string, std::string>> per_layer = {
      {"attn_norm", "input_layernorm"},    {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},      {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"}};
  static const std::regex layer{R"(blk\.(\d{1,6})\.([a-z_]+)\.(weight|bias))"};
  std::smatch m;
  if (!std::regex_match(name, m, layer)) return {};
  for (auto& [g, ours] : per_layer)
    if (m[2] == g) return "layers." + m[1].str() + "." + ours + "." + m[3].str();
  return {};
}

/// Undoes llama.cpp's reordering of a q or k projection's rows: within each head of `hd`
/// rows, GGUF row 2i + j holds Hugging Face row j * hd/2 + i.
caf::error unpermute(std::vector<float>& w, int64_t rows, int64_t cols, int64_t heads,
                     const std::string& name) {
  if (heads < 1 || rows % heads != 0 || (rows / heads) % 2 != 0)
    return make_error(ec::invalid_configuration,
                      fmt::format("tensor '{}': {} rows do not split into {} heads of an even "
                                  "size",
                                  name, rows, heads));
  const int64_t hd = rows / heads, half = hd / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        auto from = static_cast<size_t>((h * hd + 2 * i + j) * cols);
        auto to = static_cast<size_t>((h * hd + j * half + i) * cols);
        std::copy_n(w.begin() + static_cast<ptrdiff_t>(from), cols,
                    out.begin() + static_cast<ptrdiff_t>(to));
      }
  w = std::move(out);
  return {};
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in{path, std::ios::binary};
  char magic[4] = {};
  in.read(magic, 4);
  return in && std::memcmp(magic, "GGUF", 4) == 0;
}

caf::expected<hf_model_config> read_gguf_config(const std::string& path) {
  auto f = gguf_file::open(path);
  if (!f) return f.error();
  auto a = f->get_string("general.architecture");
  if (!a) return with_context(a.error(), path);
  std::string arch{*a};
  if (!served_architecture(arch))
    return bad(path, fmt::format("general.architecture '{}' is not served: Computron serves "
                                 "GGUF files of llama, mistral, qwen2 and qwen3",
                                 arch));
  hf_model_config c;
  auto& s = c.spec;
  s.family = model_family::llama;
  s.model_type = arch;
  s.name = fs::path{path}.stem().string();
  if (auto n = f->get_string("general.name")) s.name = std::string{*n};
  s.norm_eps = 1e-5;
  for (auto [key, slot, required] :
       {std::tuple{"embedding_length", &s.hidden, true}, std::tuple{"block_count", &s.layers, true},
        std::tuple{"attention.head_count", &s.heads, true},
        std::tuple{"feed_forward_length", &s.ffn, true},
        std::tuple{"context_length", &s.max_positions, true},
        std::tuple{"attention.head_count_kv", &s.kv_heads, false},
        std::tuple{"attention.key_length", &s.head_dim, false}})
    if (auto e = dimension(*f, arch, key, *slot, required)) return e;
  if (auto eps = f->get_float(arch + ".attention.layer_norm_rms_epsilon")) s.norm_eps = *eps;
  if (auto theta = f->get_float(arch + ".rope.freq_base")) s.rope.theta = *theta;
  if (auto type = f->get_string(arch + ".rope.scaling.type"); type && *type != "none") {
    if (*type != "linear")
      return bad(path, fmt::format("{}.rope.scaling.type '{}' is not implemented (linear is)", arch,
                                   *type));
    s.rope.scaling = "linear";
    if (auto factor = f->get_float(arch + ".rope.scaling.factor")) s.rope.factor = *factor;
  }
  if (f->find_tensor("rope_freqs.weight"))
    return bad(path,
               "rope_freqs.weight (Llama 3.1's rope scaling as a tensor) is not "
               "implemented for GGUF files");
  auto embed = f->find_tensor("token_embd.weight");
  if (!embed || embed->dims.size() != 2) return bad(path, "no two-dimensional token_embd.weight");
  s.vocab = embed->dims[1];
  s.tied_embeddings = f->find_tensor("output.weight") == nullptr;
  s.qkv_bias = f->find_tensor("blk.0.attn_q.bias") != nullptr;
  s.o_bias = f->find_tensor("blk.0.attn_output.bias") != nullptr;
  s.qk_norm = f->find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  c.dtype = "f32";
  if (auto e = validate(s, {1, 1})) return bad(path, to_string(e));
  return c;
}

caf::expected<std::shared_ptr<const gguf_tensors>> read_gguf_tensors(const std::string& path) {
  auto c = read_gguf_config(path);
  if (!c) return c.error();
  auto f = gguf_file::open(path);
  if (!f) return f.error();
  // Only the llama architecture went through llama.cpp's q/k reordering (Mistral is
  // converted as llama; the Qwen converters keep Hugging Face's order).
  const bool permuted = c->spec.model_type == "llama" || c->spec.model_type == "mistral";
  auto out = std::make_shared<gguf_tensors>();
  out->tensors.reserve(f->tensors().size());
  out->storage.reserve(f->tensors().size());
  for (auto& t : f->tensors()) {
    auto name = our_name(t.name);
    if (name.empty())
      return bad(path, "tensor '" + t.name + "' is not one a Llama-family model has");
    auto values = dequantize(t);
    if (!values) return with_context(values.error(), path);
    std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());
    if (permuted && (t.name.find(".attn_q.") != std::string::npos ||
                     t.name.find(".attn_k.") != std::string::npos)) {
      auto heads =
          t.name.find(".attn_q.") != std::string::npos ? c->spec.heads : c->spec.kv_head_count();
      auto rows = shape[0];
      auto cols = shape.size() > 1 ? shape[1] : 1;
      if (auto e = unpermute(*values, rows, cols, heads, t.name)) return with_context(e, path);
    }
    out->storage.push_back(std::move(*values));
    auto& data = out->storage.back();
    safetensor st;
    st.name = name;
    st.type = gpu::dtype::f32;
    st.shape = std::move(shape);
    st.data = reinterpret_cast<const std::byte*>(data.data());
    st.size_bytes = data.size() * sizeof(float);
    out->tensors.push_back(std::move(st));
  }
  return std::shared_ptr<const gguf_tensors>{std::move(out)};
}

}  // namespace computron::models
