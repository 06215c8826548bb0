#include "tests/support/llama_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "common/error.hpp"
#include "gpu/weight_store.hpp"
#include "models/safetensors.hpp"
#include "models/weights.hpp"

namespace computron::test {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("llama_reference: " + what);
}

/// A key that may be absent or null reads as `fallback`, as transformers' defaults do.
template <class T>
T get_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

int64_t positive(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
    fail(std::string{"config needs a positive integer "} + key);
  return it->get<int64_t>();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t count_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// y = W x (+ b), W row-major [y.size(), x.size()].
std::vector<double> linear(const std::vector<double>& w, const std::vector<double>& x,
                           const std::vector<double>* bias) {
  size_t cols = x.size(), rows = w.size() / cols;
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    double s = bias ? (*bias)[r] : 0.0;
    for (size_t c = 0; c < cols; ++c) s += w[r * cols + c] * x[c];
    y[r] = s;
  }
  return y;
}

double silu(double z) {
  return z / (1.0 + std::exp(-z));
}

/// splitmix64: a tiny, well-mixed generator, so the written values never depend on a
/// standard library's distribution code.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

const char* architecture_of(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  fail("unknown model_type '" + model_type + "' (llama, mistral, qwen2, qwen3)");
}

/// The config.json transformers 4.5x writes for these options (keys sorted, as it sorts).
json make_config(const tiny_llama_options& o) {
  const std::string& t = o.model_type;
  json c = {{"architectures", {architecture_of(t)}},
            {"model_type", t},
            {"hidden_size", o.hidden},
            {"intermediate_size", o.ffn},
            {"num_hidden_layers", o.layers},
            {"num_attention_heads", o.heads},
            {"num_key_value_heads", o.kv_heads},
            {"max_position_embeddings", o.max_positions},
            {"rms_norm_eps", o.rms_norm_eps},
            {"rope_theta", o.rope_theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", o.tie_word_embeddings},
            {"vocab_size", o.vocab},
            {"torch_dtype", o.dtype},
            {"bos_token_id", 1},
            {"eos_token_id", 2},
            {"initializer_range", 0.02},
            {"attention_dropout", 0.0},
            {"use_cache", true},
            {"transformers_version", "4.51.3"}};
  int64_t head_dim = o.head_dim != 0 ? o.head_dim : o.hidden / o.heads;
  if (o.head_dim != 0 || t == "qwen3" || t == "mistral") c["head_dim"] = head_dim;
  // MistralConfig has no rope_scaling attribute: it appears only when given (as any extra
  // kwarg would); the others always write it.
  if (t != "mistral" || !o.rope_scaling.is_null()) c["rope_scaling"] = o.rope_scaling;
  if (t == "llama") {
    c["attention_bias"] = o.attention_bias;
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
  } else if (t == "qwen3") {
    c["attention_bias"] = o.attention_bias;
  } else if (t == "mistral" && o.attention_bias) {
    fail("mistral has no attention biases");
  }
  if (t == "mistral") c["sliding_window"] = o.sliding_window;
  if (t == "qwen2" || t == "qwen3") {
    c["use_sliding_window"] = false;
    c["sliding_window"] = o.sliding_window;
    c["max_window_layers"] = o.layers;
  }
  return c;
}

gpu::dtype storage_of(const std::string& name) {
  if (name == "float32") return gpu::dtype::f32;
  if (name == "bfloat16") return gpu::dtype::bf16;
  if (name == "float16") return gpu::dtype::f16;
  fail("dtype '" + name + "' is not float32, bfloat16 or float16");
}

/// The tensor's values, drawn from a stream seeded by `seed` and its name, stored as `type`.
std::vector<std::byte> seeded_bytes(const std::string& name, int64_t count, uint64_t seed,
                                    double scale, gpu::dtype type) {
  uint64_t state = seed ^ fnv1a(name);
  bool norm = ends_with(name, "norm.weight");
  std::vector<std::byte> out(static_cast<size_t>(count) * gpu::size_of(type));
  for (int64_t i = 0; i < count; ++i) {
    double u = 2.0 * static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53 - 1.0;
    auto v = static_cast<float>((norm ? 1.0 : 0.0) + scale * u);
    auto* dst = out.data() + static_cast<size_t>(i) * gpu::size_of(type);
    if (type == gpu::dtype::f32) {
      std::memcpy(dst, &v, 4);
    } else {
      uint16_t bits = type == gpu::dtype::bf16 ? models::to_bf16(v) : models::to_f16(v);
      std::memcpy(dst, &bits, 2);
    }
  }
  return out;
}

void write_json(const std::string& path, const json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2) << "\n";
  if (!out) fail("cannot write " + path);
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read " + path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail(path + ": " + e.what());
  }
}

std::vector<double> to_doubles(const models::safetensor& t) {
  auto n = static_cast<size_t>(count_of(t.shape));
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t.type == gpu::dtype::f32) {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      out[i] = f;
    } else if (t.type == gpu::dtype::bf16 || t.type == gpu::dtype::f16) {
      uint16_t bits;
      std::memcpy(&bits, t.data + 2 * i, 2);
      out[i] = t.type == gpu::dtype::bf16 ? models::from_bf16(bits) : models::from_f16(bits);
    } else {
      fail("tensor '" + t.name + "' is " + gpu::to_string(t.type) + ", not a float type");
    }
  }
  return out;
}

}  // namespace

std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const json& rope_scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0) fail("rotary head_dim must be positive and even");
  std::vector<double> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  if (rope_scaling.is_null()) return inv;
  if (!rope_scaling.is_object()) fail("rope_scaling is not an object");
  // transformers reads "rope_type" and falls back to the older "type".
  std::string type = get_or<std::string>(rope_scaling, "rope_type",
                                         get_or<std::string>(rope_scaling, "type", "default"));
  if (type == "default") return inv;
  if (!rope_scaling.contains("factor")) fail("rope_scaling '" + type + "' needs a factor");
  double factor = rope_scaling.at("factor").get<double>();
  if (type == "linear") {
    for (auto& f : inv) f /= factor;
    return inv;
  }
  if (type != "llama3") fail("rope_scaling type '" + type + "' is not default, linear or llama3");
  double low = rope_scaling.at("low_freq_factor").get<double>();
  double high = rope_scaling.at("high_freq_factor").get<double>();
  double old_len = rope_scaling.at("original_max_position_embeddings").get<double>();
  double low_wavelen = old_len / low, high_wavelen = old_len / high;
  const double pi = std::acos(-1.0);
  for (auto& f : inv) {
    double wavelen = 2 * pi / f;
    if (wavelen > low_wavelen) {
      f /= factor;
    } else if (wavelen >= high_wavelen) {
      double smooth = (old_len / wavelen - low) / (high - low);
      f = (1 - smooth) * f / factor + smooth * f;
    }
  }
  return inv;
}

llama_config parse_llama_config(const json& j) {
  llama_config c;
  c.model_type = get_or<std::string>(j, "model_type", "");
  architecture_of(c.model_type);  // throws on an unknown type
  c.hidden = positive(j, "hidden_size");
  c.ffn = positive(j, "intermediate_size");
  c.layers = positive(j, "num_hidden_layers");
  c.heads = positive(j, "num_attention_heads");
  c.vocab = positive(j, "vocab_size");
  c.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? positive(j, "num_key_value_heads")
                   : c.heads;
  if (c.heads % c.kv_heads != 0)
    fail("num_attention_heads is not a multiple of num_key_value_heads");
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = positive(j, "head_dim");
  } else {
    if (c.hidden % c.heads != 0) fail("hidden_size is not a multiple of num_attention_heads");
    c.head_dim = c.hidden / c.heads;
  }
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6);
  if (get_or<std::string>(j, "hidden_act", "silu") != "silu") fail("hidden_act is not silu");
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false);

  // transformers 5 moved theta and scaling into one "rope_parameters" object.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const auto& rp = j["rope_parameters"];
    c.inv_freq = rope_inv_freq(c.head_dim, get_or<double>(rp, "rope_theta", 10000.0), rp);
  } else {
    json scaling = j.contains("rope_scaling") ? j["rope_scaling"] : json(nullptr);
    c.inv_freq = rope_inv_freq(c.head_dim, get_or<double>(j, "rope_theta", 10000.0), scaling);
  }

  const std::string& t = c.model_type;
  bool attention_bias = get_or<bool>(j, "attention_bias", false);
  c.qkv_bias = t == "qwen2" || ((t == "llama" || t == "qwen3") && attention_bias);
  c.o_bias = (t == "llama" || t == "qwen3") && attention_bias;
  c.mlp_bias = t == "llama" && get_or<bool>(j, "mlp_bias", false);
  c.qk_norm = t == "qwen3";

  c.window.assign(static_cast<size_t>(c.layers), 0);
  auto window_value = [&]() -> int64_t {
    auto w = get_or<int64_t>(j, "sliding_window", 0);
    if (w <= 0) fail("sliding attention needs a positive sliding_window");
    return w;
  };
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    const auto& types = j["layer_types"];
    if (static_cast<int64_t>(types.size()) != c.layers) fail("layer_types has the wrong length");
    for (size_t l = 0; l < types.size(); ++l)
      if (types[l] == "sliding_attention") c.window[l] = window_value();
  } else if (t == "mistral") {
    // MistralConfig defaults sliding_window to 4096; an explicit null turns it off.
    int64_t w = j.contains("sliding_window") ? get_or<int64_t>(j, "sliding_window", 0) : 4096;
    std::fill(c.window.begin(), c.window.end(), w);
  } else if ((t == "qwen2" || t == "qwen3") && get_or<bool>(j, "use_sliding_window", false) &&
             get_or<int64_t>(j, "sliding_window", 0) > 0) {
    auto first = get_or<int64_t>(j, "max_window_layers", 28);
    for (int64_t l = first; l < c.layers; ++l) c.window[static_cast<size_t>(l)] = window_value();
  }
  return c;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_tensor_shapes(
    const llama_config& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  int64_t q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  out.push_back({"model.embed_tokens.weight", {c.vocab, c.hidden}});
  for (int64_t l = 0; l < c.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    auto proj = [&](const std::string& name, int64_t rows, int64_t cols, bool bias) {
      out.push_back({p + name + ".weight", {rows, cols}});
      if (bias) out.push_back({p + name + ".bias", {rows}});
    };
    proj("self_attn.q_proj", q, c.hidden, c.qkv_bias);
    proj("self_attn.k_proj", kv, c.hidden, c.qkv_bias);
    proj("self_attn.v_proj", kv, c.hidden, c.qkv_bias);
    proj("self_attn.o_proj", c.hidden, q, c.o_bias);
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    proj("mlp.gate_proj", c.ffn, c.hidden, c.mlp_bias);
    proj("mlp.up_proj", c.ffn, c.hidden, c.mlp_bias);
    proj("mlp.down_proj", c.hidden, c.ffn, c.mlp_bias);
    out.push_back({p + "input_layernorm.weight", {c.hidden}});
    out.push_back({p + "post_attention_layernorm.weight", {c.hidden}});
  }
  out.push_back({"model.norm.weight", {c.hidden}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab, c.hidden}});
  return out;
}

void write_tiny_llama_folder(const std::string& dir, const tiny_llama_options& o) {
  json config = make_config(o);
  auto shapes = llama_tensor_shapes(parse_llama_config(config));
  gpu::dtype type = storage_of(o.dtype);
  auto n = static_cast<int64_t>(shapes.size());
  if (o.files < 1 || o.files > n) fail("files must be between 1 and the tensor count");
  std::filesystem::create_directories(dir);

  std::vector<std::vector<std::byte>> bytes;
  bytes.reserve(shapes.size());
  std::vector<std::vector<models::safetensor>> shards(static_cast<size_t>(o.files));
  json weight_map = json::object();
  uint64_t total = 0;
  auto shard_name = [&](int64_t k) {
    if (o.files == 1) return std::string{"model.safetensors"};
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05lld-of-%05d.safetensors",
                  static_cast<long long>(k + 1), o.files);
    return std::string{buf};
  };
  for (int64_t i = 0; i < n; ++i) {
    const auto& [name, shape] = shapes[static_cast<size_t>(i)];
    bytes.push_back(seeded_bytes(name, count_of(shape), o.seed, o.scale, type));
    // Consecutive runs in module order, as save_pretrained fills one shard after another.
    int64_t k = i * o.files / n;
    shards[static_cast<size_t>(k)].push_back(
        {name, type, shape, bytes.back().data(), static_cast<uint64_t>(bytes.back().size())});
    weight_map[name] = shard_name(k);
    total += bytes.back().size();
  }
  for (int64_t k = 0; k < o.files; ++k) {
    auto path = dir + "/" + shard_name(k);
    if (auto err =
            models::write_safetensors(path, shards[static_cast<size_t>(k)], {{"format", "pt"}}))
      fail("writing " + path + ": " + render(err));
  }
  if (o.files > 1)
    write_json(dir + "/model.safetensors.index.json",
               {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  write_json(dir + "/config.json", config);
  write_json(dir + "/generation_config.json", {{"_from_model_config", true},
                                               {"bos_token_id", 1},
                                               {"eos_token_id", 2},
                                               {"transformers_version", "4.51.3"}});
}

std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& weight,
                             double eps) {
  if (x.size() != weight.size()) fail("rms_norm: weight size differs from the input's");
  double ss = 0;
  for (double v : x) ss += v * v;
  double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * weight[i];
  return out;
}

std::vector<double> apply_rotary(const std::vector<double>& x, int64_t position,
                                 const std::vector<double>& inv_freq) {
  size_t half = inv_freq.size();
  if (x.size() != 2 * half) fail("apply_rotary: the vector is not 2 * inv_freq long");
  std::vector<double> out(x.size());
  for (size_t i = 0; i < half; ++i) {
    double angle = static_cast<double>(position) * inv_freq[i];
    double c = std::cos(angle), s = std::sin(angle);
    out[i] = x[i] * c - x[i + half] * s;
    out[i + half] = x[i + half] * c + x[i] * s;
  }
  return out;
}

llama_reference::llama_reference(llama_config config,
                                 std::map<std::string, std::vector<double>> weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  auto shapes = llama_tensor_shapes(config_);
  if (static_cast<int64_t>(config_.inv_freq.size()) * 2 != config_.head_dim)
    fail("config inv_freq does not cover head_dim");
  if (static_cast<int64_t>(config_.window.size()) != config_.layers)
    fail("config window has no entry per layer");
  for (const auto& [name, shape] : shapes) {
    auto it = weights_.find(name);
    if (it == weights_.end()) fail("missing tensor '" + name + "'");
    if (static_cast<int64_t>(it->second.size()) != count_of(shape))
      fail("tensor '" + name + "' has " + std::to_string(it->second.size()) + " values, not " +
           std::to_string(count_of(shape)));
  }
  if (weights_.size() != shapes.size()) fail("weights hold tensors the model does not use");
}

llama_reference llama_reference::open(const std::string& dir) {
  auto config = parse_llama_config(read_json(dir + "/config.json"));
  std::map<std::string, std::vector<int64_t>> expected;
  for (auto& [name, shape] : llama_tensor_shapes(config)) expected[name] = shape;

  std::set<std::string> files;
  if (std::filesystem::exists(dir + "/model.safetensors.index.json")) {
    auto index = read_json(dir + "/model.safetensors.index.json");
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      fail(dir + ": the index has no weight_map");
    for (const auto& [name, file] : index["weight_map"].items())
      files.insert(file.get<std::string>());
  } else {
    files.insert("model.safetensors");
  }

  std::map<std::string, std::vector<double>> weights;
  for (const auto& file : files) {
    auto f = models::safetensors_file::open(dir + "/" + file);
    if (!f) fail(render(f.error()));
    for (const auto& [name, t] : f->tensors()) {
      // Old checkpoints carry the rotary buffer; transformers recomputes it. A tied model
      // takes its head from the embeddings whatever the file holds.
      if (ends_with(name, "rotary_emb.inv_freq")) continue;
      if (config.tie_word_embeddings && name == "lm_head.weight") continue;
      auto it = expected.find(name);
      if (it == expected.end()) fail(file + ": tensor '" + name + "' is not part of the model");
      if (t.shape != it->second) fail(file + ": tensor '" + name + "' has the wrong shape");
      if (!weights.emplace(name, to_doubles(t)).second) fail("tensor '" + name + "' appears twice");
    }
  }
  return llama_reference(std::move(config), std::move(weights));
}

const std::vector<double>& llama_reference::weight(const std::string& name) const {
  auto it = weights_.find(name);
  if (it == weights_.end()) fail("no tensor '" + name + "'");
  return it->second;
}

const std::vector<double>& llama_reference::layer_weight(int64_t layer, const char* suffix) const {
  return weight("model.layers." + std::to_string(layer) + "." + suffix);
}

std::vector<std::vector<double>> llama_reference::hidden_states(
    const std::vector<int64_t>& tokens) const {
  const auto& c = config_;
  if (tokens.empty()) fail("no tokens");
  const auto& embed = weight("model.embed_tokens.weight");
  auto hidden = static_cast<size_t>(c.hidden), hd = static_cast<size_t>(c.head_dim);
  std::vector<std::vector<double>> x;
  for (auto t : tokens) {
    if (t < 0 || t >= c.vocab) fail("token " + std::to_string(t) + " is outside the vocabulary");
    auto row = embed.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(t) * hidden);
    x.emplace_back(row, row + static_cast<std::ptrdiff_t>(hidden));
  }
  size_t n = x.size();
  auto bias = [&](int64_t l, const char* suffix, bool present) {
    return present ? &layer_weight(l, suffix) : nullptr;
  };
  auto head = [&](const std::vector<double>& v, size_t h) {
    return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(h * hd),
                               v.begin() + static_cast<std::ptrdiff_t>((h + 1) * hd));
  };

  for (int64_t l = 0; l < c.layers; ++l) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (size_t p = 0; p < n; ++p) {
      auto a = rms_norm(x[p], layer_weight(l, "input_layernorm.weight"), c.rms_norm_eps);
      q[p] = linear(layer_weight(l, "self_attn.q_proj.weight"), a,
                    bias(l, "self_attn.q_proj.bias", c.qkv_bias));
      k[p] = linear(layer_weight(l, "self_attn.k_proj.weight"), a,
                    bias(l, "self_attn.k_proj.bias", c.qkv_bias));
      v[p] = linear(layer_weight(l, "self_attn.v_proj.weight"), a,
                    bias(l, "self_attn.v_proj.bias", c.qkv_bias));
      // Qwen3 normalizes each head of q and k, and only then rotates it.
      auto rotate = [&](std::vector<double>& vec, int64_t heads, const char* norm) {
        for (size_t h = 0; h < static_cast<size_t>(heads); ++h) {
          auto part = head(vec, h);
          if (c.qk_norm) part = rms_norm(part, layer_weight(l, norm), c.rms_norm_eps);
          part = apply_rotary(part, static_cast<int64_t>(p), c.inv_freq);
          std::copy(part.begin(), part.end(), vec.begin() + static_cast<std::ptrdiff_t>(h * hd));
        }
      };
      rotate(q[p], c.heads, "self_attn.q_norm.weight");
      rotate(k[p], c.kv_heads, "self_attn.k_norm.weight");
    }

    auto group = static_cast<size_t>(c.heads / c.kv_heads);
    auto window = static_cast<size_t>(c.window[static_cast<size_t>(l)]);
    double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    std::vector<std::vector<double>> attended(n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<double> out(static_cast<size_t>(c.heads) * hd, 0.0);
      // Causal, and with a window W only keys j with i - j < W.
      size_t first = window > 0 && i + 1 > window ? i + 1 - window : 0;
      for (size_t h = 0; h < static_cast<size_t>(c.heads); ++h) {
        size_t g = h / group;
        std::vector<double> scores;
        for (size_t j = first; j <= i; ++j) {
          double s = 0;
          for (size_t d = 0; d < hd; ++d) s += q[i][h * hd + d] * k[j][g * hd + d];
          scores.push_back(s * scale);
        }
        double top = *std::max_element(scores.begin(), scores.end()), sum = 0;
        for (auto& s : scores) sum += (s = std::exp(s - top));
        for (size_t j = first; j <= i; ++j)
          for (size_t d = 0; d < hd; ++d)
            out[h * hd + d] += scores[j - first] / sum * v[j][g * hd + d];
      }
      attended[i] = std::move(out);
    }
    for (size_t p = 0; p < n; ++p) {
      auto o = linear(layer_weight(l, "self_attn.o_proj.weight"), attended[p],
                      bias(l, "self_attn.o_proj.bias", c.o_bias));
      for (size_t e = 0; e < hidden; ++e) x[p][e] += o[e];
      auto m = rms_norm(x[p], layer_weight(l, "post_attention_layernorm.weight"), c.rms_norm_eps);
      auto gate = linear(layer_weight(l, "mlp.gate_proj.weight"), m,
                         bias(l, "mlp.gate_proj.bias", c.mlp_bias));
      auto up =
          linear(layer_weight(l, "mlp.up_proj.weight"), m, bias(l, "mlp.up_proj.bias", c.mlp_bias));
      for (size_t f = 0; f < gate.size(); ++f) gate[f] = silu(gate[f]) * up[f];
      auto down = linear(layer_weight(l, "mlp.down_proj.weight"), gate,
                         bias(l, "mlp.down_proj.bias", c.mlp_bias));
      for (size_t e = 0; e < hidden; ++e) x[p][e] += down[e];
    }
  }
  return x;
}

std::vector<double> llama_reference::logits(const std::vector<int64_t>& tokens) const {
  auto last = hidden_states(tokens).back();
  auto normed = rms_norm(last, weight("model.norm.weight"), config_.rms_norm_eps);
  const auto& head =
      weight(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  return linear(head, normed, nullptr);
}

std::vector<int64_t> llama_reference::greedy(const std::vector<int64_t>& prompt, int steps,
                                             std::vector<std::vector<double>>* step_logits) const {
  std::vector<int64_t> seq = prompt, out;
  if (step_logits) step_logits->clear();
  for (int s = 0; s < steps; ++s) {
    auto lg = logits(seq);
    auto best = static_cast<int64_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    out.push_back(best);
    seq.push_back(best);
    if (step_logits) step_logits->push_back(std::move(lg));
  }
  return out;
}

std::vector<std::pair<std::string, tiny_llama_options>> llama_variants() {
  std::vector<std::pair<std::string, tiny_llama_options>> v;
  tiny_llama_options llama;
  llama.model_type = "llama";
  // Llama 3.1's frequency scaling with a short original context, so that all three bands
  // (kept, interpolated, slowed down) hold some of the 8 frequencies.
  llama.rope_scaling = {{"rope_type", "llama3"},
                        {"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 32}};
  llama.rope_theta = 500000;
  v.emplace_back("llama, llama3 rope scaling, untied head, 2 kv heads", llama);
  auto linear = llama;
  linear.rope_scaling = {{"type", "linear"}, {"factor", 4.0}};
  linear.attention_bias = true;
  linear.files = 3;
  v.emplace_back("llama, linear rope scaling, attention biases, 3 shards", linear);
  tiny_llama_options mistral;
  mistral.model_type = "mistral";
  mistral.head_dim = 32;  // heads x head_dim = 128, twice the hidden size
  mistral.kv_heads = 1;   // multi-query
  v.emplace_back("mistral, head_dim given, one kv head", mistral);
  tiny_llama_options qwen2;
  qwen2.model_type = "qwen2";
  qwen2.tie_word_embeddings = true;
  qwen2.rope_theta = 1e6;
  v.emplace_back("qwen2, q/k/v biases, tied head", qwen2);
  tiny_llama_options qwen3;
  qwen3.model_type = "qwen3";
  qwen3.head_dim = 32;
  qwen3.rope_theta = 1e6;
  v.emplace_back("qwen3, q/k norms, head_dim given", qwen3);
  return v;
}

}  // namespace computron::test
