#include "models/decoder_spec.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace computron::models {

using json = nlohmann::json;

const char* to_string(model_family f) {
  switch (f) {
    case model_family::opt:
      return "opt";
    case model_family::llama:
      return "llama";
  }
  return "?";
}

namespace {

/// A Llama-family catalogue entry (fields in decoder_spec's order after the first seven).
decoder_spec llama_entry(std::string name, std::string model_type, int64_t hidden, int64_t layers,
                         int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t ffn,
                         int64_t vocab, int64_t max_positions, double eps, rope_config rope,
                         bool tied, bool qkv_bias = false, bool qk_norm = false) {
  decoder_spec s{std::move(name), hidden, layers, heads, ffn, vocab, max_positions};
  s.family = model_family::llama;
  s.model_type = std::move(model_type);
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.norm_eps = eps;
  s.rope = std::move(rope);
  s.tied_embeddings = tied;
  s.qkv_bias = qkv_bias;
  s.qk_norm = qk_norm;
  return s;
}

rope_config llama3_rope(double factor) {
  rope_config r;
  r.theta = 500000.0;
  r.scaling = "llama3";
  r.factor = factor;
  return r;
}

rope_config plain_rope(double theta) {
  rope_config r;
  r.theta = theta;
  return r;
}

}  // namespace

const std::vector<decoder_spec>& catalogue() {
  static const std::vector<decoder_spec> specs = [] {
    // OPT: shapes from the OPT paper (Zhang et al. 2022), table 1; vocab 50272, 2048
    // positions. opt-350m's 512-wide embedding projection is not modelled: it is treated
    // as a plain 1024-wide decoder (its size differs from the real checkpoint by about 1%).
    std::vector<decoder_spec> s = {
        {"opt-tiny", 64, 2, 4, 256, 512, 128},
        {"opt-mini", 128, 4, 8, 512, 1024, 256},
        {"opt-125m", 768, 12, 12, 3072, 50272, 2048},
        {"opt-350m", 1024, 24, 16, 4096, 50272, 2048},
        {"opt-1.3b", 2048, 24, 32, 8192, 50272, 2048},
        {"opt-2.7b", 2560, 32, 32, 10240, 50272, 2048},
        {"opt-6.7b", 4096, 32, 32, 16384, 50272, 2048},
        {"opt-13b", 5120, 40, 40, 20480, 50272, 2048},
        {"opt-30b", 7168, 48, 56, 28672, 50272, 2048},
        {"opt-66b", 9216, 64, 72, 36864, 50272, 2048},
        {"opt-175b", 12288, 96, 96, 49152, 50272, 2048},
    };
    for (auto& x : s) x.model_type = "opt";
    // The Llama family: shapes from each model's published config.json.
    s.push_back(llama_entry("llama-tiny", "llama", 64, 2, 4, 2, 0, 128, 512, 128, 1e-5,
                            rope_config{}, false));
    s.push_back(llama_entry("llama-mini", "llama", 128, 4, 8, 2, 0, 256, 1024, 256, 1e-5,
                            rope_config{}, true));
    s.push_back(llama_entry("llama-3.2-1b", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 131072,
                            1e-5, llama3_rope(32.0), true));
    s.push_back(llama_entry("llama-3.2-3b", "llama", 3072, 28, 24, 8, 128, 8192, 128256, 131072,
                            1e-5, llama3_rope(32.0), true));
    s.push_back(llama_entry("llama-3.1-8b", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 131072,
                            1e-5, llama3_rope(8.0), false));
    s.push_back(llama_entry("qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 32768, 1e-6,
                            plain_rope(1e6), true, true));
    s.push_back(llama_entry("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 128, 18944, 152064, 32768, 1e-6,
                            plain_rope(1e6), false, true));
    s.push_back(llama_entry("qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1e-6,
                            plain_rope(1e6), true, false, true));
    s.push_back(llama_entry("qwen3-8b", "qwen3", 4096, 36, 32, 8, 128, 12288, 151936, 40960, 1e-6,
                            plain_rope(1e6), false, false, true));
    // Mistral 7B v0.3 (no sliding window; v0.1's 4096-token window caps max_positions
    // when read from its config.json).
    s.push_back(llama_entry("mistral-7b", "mistral", 4096, 32, 32, 8, 128, 14336, 32768, 32768,
                            1e-5, plain_rope(1e6), false));
    return s;
  }();
  return specs;
}

caf::expected<decoder_spec> find_spec(std::string_view name) {
  std::string known;
  for (auto& s : catalogue()) {
    if (s.name == name) return s;
    known += known.empty() ? s.name : ", " + s.name;
  }
  return make_error(ec::unknown_model,
                    fmt::format("no model shape '{}' in the catalogue ({})", name, known));
}

json to_json(const decoder_spec& s) {
  json rope = {{"theta", s.rope.theta},
               {"scaling", s.rope.scaling},
               {"factor", s.rope.factor},
               {"low_freq_factor", s.rope.low_freq_factor},
               {"high_freq_factor", s.rope.high_freq_factor},
               {"original_max_positions", s.rope.original_max_positions}};
  return {{"name", s.name},
          {"family", to_string(s.family)},
          {"model_type", s.model_type},
          {"hidden", s.hidden},
          {"layers", s.layers},
          {"heads", s.heads},
          {"kv_heads", s.kv_heads},
          {"head_dim", s.head_dim},
          {"ffn", s.ffn},
          {"vocab", s.vocab},
          {"max_positions", s.max_positions},
          {"norm_eps", s.norm_eps},
          {"rope", rope},
          {"qkv_bias", s.qkv_bias},
          {"o_bias", s.o_bias},
          {"qk_norm", s.qk_norm},
          {"tied_embeddings", s.tied_embeddings}};
}

caf::expected<decoder_spec> spec_from_json(const json& j) {
  auto bad = [](const std::string& why) {
    return make_error(ec::invalid_configuration, "model architecture: " + why);
  };
  if (!j.is_object()) return bad("not a JSON object");
  decoder_spec s;
  // Every field is optional except the dimensions; types are checked before reading, so
  // a wrong type is an error naming the field, never an exception.
  auto integer = [&](const char* key, int64_t& out, bool required) -> caf::error {
    auto it = j.find(key);
    if (it == j.end()) return required ? bad(std::string{"no field "} + key) : caf::error{};
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1ll << 40))
      return bad(std::string{"field "} + key + " must be a non-negative integer");
    out = it->get<int64_t>();
    return {};
  };
  auto number = [&](const json& o, const char* key, double& out) -> caf::error {
    auto it = o.find(key);
    if (it == o.end()) return {};
    if (!it->is_number() || !(it->get<double>() >= 0) || it->get<double>() > 1e30)
      return bad(std::string{"field "} + key + " must be a non-negative number");
    out = it->get<double>();
    return {};
  };
  auto text = [&](const json& o, const char* key, std::string& out) -> caf::error {
    auto it = o.find(key);
    if (it == o.end()) return {};
    if (!it->is_string()) return bad(std::string{"field "} + key + " must be a string");
    out = it->get<std::string>();
    return {};
  };
  auto flag = [&](const char* key, bool& out) -> caf::error {
    auto it = j.find(key);
    if (it == j.end()) return {};
    if (!it->is_boolean()) return bad(std::string{"field "} + key + " must be true or false");
    out = it->get<bool>();
    return {};
  };
  std::string family = "opt";
  if (auto e = text(j, "name", s.name)) return e;
  if (auto e = text(j, "family", family)) return e;
  if (family == "opt")
    s.family = model_family::opt;
  else if (family == "llama")
    s.family = model_family::llama;
  else
    return bad("family '" + family + "' is neither opt nor llama");
  if (auto e = text(j, "model_type", s.model_type)) return e;
  for (auto [key, field] :
       {std::pair{"hidden", &s.hidden}, std::pair{"layers", &s.layers},
        std::pair{"heads", &s.heads}, std::pair{"ffn", &s.ffn}, std::pair{"vocab", &s.vocab},
        std::pair{"max_positions", &s.max_positions}})
    if (auto e = integer(key, *field, true)) return e;
  if (auto e = integer("kv_heads", s.kv_heads, false)) return e;
  if (auto e = integer("head_dim", s.head_dim, false)) return e;
  if (auto e = number(j, "norm_eps", s.norm_eps)) return e;
  if (auto r = j.find("rope"); r != j.end()) {
    if (!r->is_object()) return bad("field rope must be an object");
    if (auto e = number(*r, "theta", s.rope.theta)) return e;
    if (auto e = text(*r, "scaling", s.rope.scaling)) return e;
    if (auto e = number(*r, "factor", s.rope.factor)) return e;
    if (auto e = number(*r, "low_freq_factor", s.rope.low_freq_factor)) return e;
    if (auto e = number(*r, "high_freq_factor", s.rope.high_freq_factor)) return e;
    double orig = static_cast<double>(s.rope.original_max_positions);
    if (auto e = number(*r, "original_max_positions", orig)) return e;
    // Bounded before it converts: a double past int64 would be undefined.
    if (orig > static_cast<double>(1ll << 40))
      return bad("field original_max_positions must be at most 2^40");
    s.rope.original_max_positions = static_cast<int64_t>(orig);
    if (!s.rope.scaling.empty() && s.rope.scaling != "linear" && s.rope.scaling != "llama3")
      return bad("rope scaling '" + s.rope.scaling + "' is not implemented (linear, llama3 are)");
  }
  if (auto e = flag("qkv_bias", s.qkv_bias)) return e;
  if (auto e = flag("o_bias", s.o_bias)) return e;
  if (auto e = flag("qk_norm", s.qk_norm)) return e;
  if (auto e = flag("tied_embeddings", s.tied_embeddings)) return e;
  return s;
}

caf::error validate(const decoder_spec& spec, const parallel_config& par) {
  auto bad = [&](std::string why) {
    return make_error(ec::invalid_configuration, fmt::format("{} cannot be split tp={} x pp={}: {}",
                                                             spec.name, par.tp, par.pp, why));
  };
  if (spec.hidden <= 0 || spec.layers <= 0 || spec.heads <= 0 || spec.ffn <= 0 || spec.vocab <= 0 ||
      spec.max_positions <= 0)
    return bad("every dimension must be positive");
  if (par.tp < 1 || par.pp < 1) return bad("tp and pp must be at least 1");
  if (spec.layers < par.pp)
    return bad(fmt::format("only {} layers for {} stages", spec.layers, par.pp));
  return spec.family == model_family::opt ? detail::opt_validate(spec, par)
                                          : detail::llama_validate(spec, par);
}

std::pair<int64_t, int64_t> stage_layers(const decoder_spec& spec, int pp, int pp_rank) {
  auto base = spec.layers / pp;
  auto extra = spec.layers % pp;
  auto begin = pp_rank * base + std::min<int64_t>(pp_rank, extra);
  auto size = base + (pp_rank < extra ? 1 : 0);
  return {begin, begin + size};
}

void detail::param_adder::operator()(std::string name, std::vector<int64_t> shape, split_kind split,
                                     init_kind init, int group, bool packed) const {
  auto local = shape;
  auto slices = par.tp / group;
  if (split == split_kind::dim0) local[0] /= slices;
  if (split == split_kind::dim1) local[1] /= slices;
  if (split == split_kind::vocab) local[0] = vocab_rows(local[0], slices);
  out.push_back(
      param_spec{std::move(name), std::move(shape), split, init, std::move(local), group, packed});
}

std::vector<param_spec> shard_params(const decoder_spec& spec, const parallel_config& par,
                                     const shard_index& shard) {
  std::vector<param_spec> out;
  detail::param_adder add{par, out};
  if (spec.family == model_family::opt)
    detail::opt_params(spec, par, shard, add);
  else
    detail::llama_params(spec, par, shard, add);
  return out;
}

caf::expected<gpu::tensor_table> shard_layout(const decoder_spec& spec, gpu::dtype type,
                                              const parallel_config& par,
                                              const shard_index& shard) {
  if (auto err = validate(spec, par)) return err;
  if (shard.tp_rank < 0 || shard.tp_rank >= par.tp || shard.pp_rank < 0 || shard.pp_rank >= par.pp)
    return make_error(ec::invalid_request,
                      fmt::format("shard (tp rank {}, stage {}) is outside tp={} x pp={}",
                                  shard.tp_rank, shard.pp_rank, par.tp, par.pp));
  gpu::tensor_table table;
  for (auto& p : shard_params(spec, par, shard))
    if (auto err = table.add(p.name, type, p.shard_shape, p.packed)) return err;
  return table;
}

int64_t local_kv_heads(const decoder_spec& spec, const parallel_config& par) {
  return std::max<int64_t>(1, spec.kv_head_count() / std::max(1, par.tp));
}

uint64_t kv_block_bytes(const decoder_spec& spec, gpu::dtype type, const parallel_config& par,
                        const shard_index& shard) {
  auto [begin, end] = stage_layers(spec, par.pp, shard.pp_rank);
  auto per_layer = 2 * local_kv_heads(spec, par) * kv_block_tokens * spec.head_size();
  return static_cast<uint64_t>(std::max<int64_t>(0, end - begin) * per_layer) * gpu::size_of(type);
}

caf::expected<uint64_t> shard_bytes(const decoder_spec& spec, gpu::dtype type,
                                    const parallel_config& par, const shard_index& shard) {
  auto t = shard_layout(spec, type, par, shard);
  if (!t) return std::move(t.error());
  return t->total_bytes();
}

namespace {

uint64_t elements(const std::vector<int64_t>& shape) {
  uint64_t k = 1;
  for (auto d : shape) k *= static_cast<uint64_t>(d);
  return k;
}

}  // namespace

uint64_t parameter_count(const decoder_spec& spec) {
  uint64_t n = 0;
  for (auto& p : shard_params(spec, {1, 1}, {0, 0})) n += elements(p.full_shape);
  return n;
}

uint64_t weight_bytes(const decoder_spec& spec, gpu::dtype type) {
  return parameter_count(spec) * gpu::size_of(type);
}

caf::expected<uint64_t> replicated_vocab_shard_bytes(const decoder_spec& spec, gpu::dtype type,
                                                     const parallel_config& par,
                                                     const shard_index& shard) {
  auto table = shard_layout(spec, type, par, shard);
  if (!table) return std::move(table.error());
  // The same tensors, the embeddings and head whole (every one of them is drawn as an
  // embedding), each aligned as tensor_table aligns them.
  gpu::tensor_table before;
  for (auto& p : shard_params(spec, par, shard))
    if (auto err = before.add(
            p.name, type, p.init == init_kind::embedding ? p.full_shape : p.shard_shape, p.packed))
      return err;
  return before.total_bytes();
}

}  // namespace computron::models
