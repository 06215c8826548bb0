// PEFT adapter folders read and converted: tensor names mapped to the base's projections,
// shapes checked against the base, values converted to f32 with the scale folded into B,
// a content hash, and the per-rank cut into one contiguous buffer.
#include "models/lora_adapter.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_file.hpp"
#include "common/sha256.hpp"
#include "models/safetensors.hpp"
#include "models/weights.hpp"

namespace computron::models {

namespace fs = std::filesystem;

namespace {

caf::error bad_tensor(const std::string& name, const std::string& why) {
  return make_error(ec::invalid_configuration,
                    fmt::format("adapter_model.safetensors: tensor '{}': {}", name, why));
}

/// What one tensor name says: the module path it adapts and whether it is A or B.
struct parsed_name {
  std::string module;
  bool is_a = false;
};

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    auto dot = s.find('.', start);
    parts.push_back(s.substr(start, dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

/// PEFT saves `base_model.model.<module path>.lora_A.weight` (get_peft_model_state_dict
/// drops the adapter name); a state dict taken from the live model keeps it
/// (`.lora_A.default.weight`), so both are read.
caf::expected<parsed_name> parse_name(const std::string& name) {
  auto parts = split_dots(name);
  auto has = [&](const char* part) {
    return std::find(parts.begin(), parts.end(), part) != parts.end();
  };
  if (has("lora_magnitude_vector"))
    return bad_tensor(name, "a DoRA magnitude (use_dora) is not supported");
  if (has("lora_embedding_A") || has("lora_embedding_B"))
    return bad_tensor(name, "adapters on embeddings are not supported");
  if (has("modules_to_save") || has("original_module"))
    return bad_tensor(name,
                      "modules_to_save (whole trained copies of base modules) is not supported");
  auto kind = std::find_if(parts.begin(), parts.end(),
                           [](const std::string& p) { return p == "lora_A" || p == "lora_B"; });
  if (kind == parts.end())
    return bad_tensor(name, "not a LoRA tensor (no lora_A or lora_B in its name)");
  auto after = static_cast<size_t>(parts.end() - kind) - 1;
  if (parts.back() == "bias")
    return bad_tensor(name, "a bias on the LoRA B matrix (lora_bias) is not supported");
  if (parts.back() != "weight" || after < 1 || after > 2)
    return bad_tensor(name, "expected <module>.lora_A.weight or <module>.lora_A.<adapter>.weight");
  std::vector<std::string> module(parts.begin(), kind);
  if (module.size() >= 2 && module[0] == "base_model" && module[1] == "model")
    module.erase(module.begin(), module.begin() + 2);
  if (module.empty()) return bad_tensor(name, "no module path before lora_A/lora_B");
  return parsed_name{fmt::format("{}", fmt::join(module, ".")), *kind == "lora_A"};
}

/// Why a module path names no supported projection of `base`.
std::string unknown_module(const decoder_spec& base, const std::string& module) {
  auto last = module.substr(module.rfind('.') + 1);
  if (last == "lm_head" || last == "embed_tokens" || last == "embed_positions")
    return fmt::format("module '{}': adapters on the LM head or embeddings are not supported",
                       module);
  auto at = module.find("layers.");
  if (at != std::string::npos) {
    auto digits = module.substr(at + 7, module.find('.', at + 7) - at - 7);
    if (!digits.empty() &&
        std::all_of(digits.begin(), digits.end(),
                    [](unsigned char ch) { return std::isdigit(ch) != 0; }) &&
        digits.size() < 10 && std::stoll(digits) >= base.layers)
      return fmt::format("module '{}': layer {} is beyond the base's {} layers", module, digits,
                         base.layers);
  }
  return fmt::format("module '{}' is no projection of {} ({} family: {})", module, base.name,
                     to_string(base.family), fmt::join(lora_projections(base), ", "));
}

/// Element `i` of a float tensor as f32.
float load_float(const std::byte* src, gpu::dtype t, uint64_t i) {
  if (t == gpu::dtype::f32) {
    float x;
    std::memcpy(&x, src + i * 4, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, src + i * 2, 2);
  return t == gpu::dtype::bf16 ? from_bf16(h) : from_f16(h);
}

void store_float(std::byte* dst, gpu::dtype t, uint64_t i, float x) {
  if (t == gpu::dtype::f32) {
    std::memcpy(dst + i * 4, &x, 4);
    return;
  }
  uint16_t h = t == gpu::dtype::bf16 ? to_bf16(x) : to_f16(x);
  std::memcpy(dst + i * 2, &h, 2);
}

/// Checks one tensor of a pair: a float dtype and the shape [rows x cols].
caf::error check_tensor(const safetensor& t, int64_t rows, int64_t cols, const std::string& what) {
  if (t.type != gpu::dtype::f32 && t.type != gpu::dtype::f16 && t.type != gpu::dtype::bf16)
    return bad_tensor(t.name, fmt::format("dtype {} is not a float type (F32, F16 or BF16)",
                                          safetensors_dtype_name(t.type)));
  if (t.shape != std::vector<int64_t>{rows, cols})
    return bad_tensor(t.name, fmt::format("shape [{}] does not fit: {} must be [{} x {}]",
                                          fmt::join(t.shape, ", "), what, rows, cols));
  return {};
}

std::string content_hash(const decoder_spec& base, const std::vector<lora_module>& modules,
                         int64_t rank) {
  sha256 h;
  // A version tag, so a change of what is hashed never keys old cache entries.
  h.update(std::string_view("computron-lora-v1", 18));
  h.update(std::string_view(to_string(base.family)));
  auto put = [&](int64_t v) { h.update(&v, sizeof v); };
  put(rank);
  put(static_cast<int64_t>(modules.size()));
  for (auto& m : modules) {
    put(m.layer);
    h.update(std::string_view(m.proj.c_str(), m.proj.size() + 1));
    put(m.in);
    put(m.out);
    h.update(m.a.data(), m.a.size() * sizeof(float));
    h.update(m.b.data(), m.b.size() * sizeof(float));
  }
  return h.finish_hex();
}

}  // namespace

caf::expected<lora_adapter> read_lora_adapter(const std::string& folder, const decoder_spec& base,
                                              const lora_limits& limits) {
  auto config_json = read_json_file(fs::path(folder) / "adapter_config.json");
  if (!config_json) return config_json.error();
  auto context = [&](const caf::error& err) { return with_context(err, folder); };
  auto config = parse_lora_config(*config_json);
  if (!config) return context(config.error());
  if (config->rank > limits.max_rank)
    return context(
        make_error(ec::invalid_configuration,
                   fmt::format("adapter_config.json: r {} is over the largest rank accepted, {} "
                               "(a server's --max-lora-rank or scheduler.max_lora_rank)",
                               config->rank, limits.max_rank)));
  auto targets = lora_targets(*config, base);
  if (!targets) return context(targets.error());

  // Older PEFT (and safe_serialization=False) wrote a pickle, which is code, not data.
  std::error_code ignored;
  if (!fs::exists(fs::path(folder) / "adapter_model.safetensors", ignored) &&
      fs::exists(fs::path(folder) / "adapter_model.bin", ignored))
    return context(make_error(ec::invalid_configuration,
                              "adapter_model.bin (a pickle) is not read: save the adapter as "
                              "adapter_model.safetensors, as PEFT saves by default"));
  auto file = safetensors_file::open((fs::path(folder) / "adapter_model.safetensors").string());
  if (!file) return context(file.error());

  // Pair the tensors by module.
  struct pair {
    const safetensor* a = nullptr;
    const safetensor* b = nullptr;
  };
  std::map<std::string, pair> pairs;
  for (auto& [name, t] : file->tensors()) {
    auto parsed = parse_name(name);
    if (!parsed) return context(parsed.error());
    auto& slot = parsed->is_a ? pairs[parsed->module].a : pairs[parsed->module].b;
    if (slot != nullptr)
      return context(bad_tensor(
          name, fmt::format("a second {} for module '{}' (after '{}')",
                            parsed->is_a ? "lora_A" : "lora_B", parsed->module, slot->name)));
    slot = &t;
  }

  // Every module with tensors is a targeted projection, and every targeted projection has
  // its pair: PEFT saves exactly the modules it adapted.
  std::map<std::string, lora_site> by_path;
  for (int64_t i = 0; i < base.layers; ++i)
    for (auto& p : lora_projections(base)) by_path[lora_module_path(base, i, p)] = {i, p};
  std::set<std::pair<int64_t, std::string>> targeted;
  for (auto& s : *targets) targeted.insert({s.layer, s.proj});
  for (auto& [module, p] : pairs) {
    auto it = by_path.find(module);
    if (it == by_path.end())
      return context(make_error(ec::invalid_configuration,
                                "adapter_model.safetensors: " + unknown_module(base, module)));
    if (!targeted.count({it->second.layer, it->second.proj}))
      return context(make_error(
          ec::invalid_configuration,
          fmt::format("adapter_model.safetensors: module '{}' has tensors but target_modules "
                      "does not select it",
                      module)));
    if (p.a == nullptr || p.b == nullptr)
      return context(
          make_error(ec::invalid_configuration,
                     fmt::format("adapter_model.safetensors: module '{}' has {} but no {}", module,
                                 p.a ? "lora_A" : "lora_B", p.a ? "lora_B" : "lora_A")));
  }

  auto full = shard_params(base, parallel_config{1, 1}, shard_index{0, 0});
  std::map<std::string, const param_spec*> params;
  for (auto& p : full) params[p.name] = &p;
  lora_adapter out;
  out.config = *config;
  out.base = base;
  auto r = config->rank;
  auto scale = config->scale();
  for (auto& site : *targets) {
    auto path = lora_module_path(base, site.layer, site.proj);
    auto found = pairs.find(path);
    if (found == pairs.end())
      return context(make_error(ec::invalid_configuration,
                                fmt::format("adapter_model.safetensors: module '{}' is selected "
                                            "by target_modules but has no lora_A/lora_B tensors",
                                            path)));
    lora_module m;
    m.layer = site.layer;
    m.proj = site.proj;
    m.base_param = detail::lora_param_name(base, site.layer, site.proj);
    auto& shape = params.at(m.base_param)->full_shape;
    m.out = shape[0];
    m.in = shape[1];
    auto& a = *found->second.a;
    auto& b = *found->second.b;
    if (auto err = check_tensor(a, r, m.in,
                                fmt::format("lora_A of {} (r {}, in {})", m.base_param, r, m.in)))
      return context(err);
    if (auto err = check_tensor(b, m.out, r,
                                fmt::format("lora_B of {} (out {}, r {})", m.base_param, m.out, r)))
      return context(err);
    m.a.resize(static_cast<size_t>(r * m.in));
    for (uint64_t i = 0; i < m.a.size(); ++i) m.a[i] = load_float(a.data, a.type, i);
    // The scale folded in once, in double, so B is rounded once.
    m.b.resize(static_cast<size_t>(m.out * r));
    for (uint64_t i = 0; i < m.b.size(); ++i)
      m.b[i] = static_cast<float>(static_cast<double>(load_float(b.data, b.type, i)) * scale);
    out.modules.push_back(std::move(m));
  }
  out.content_hash = content_hash(base, out.modules, r);
  return out;
}

caf::expected<lora_rank_adapter> slice_lora_adapter(const lora_adapter& adapter,
                                                    const parallel_config& par,
                                                    const shard_index& shard, gpu::dtype type) {
  if (type != gpu::dtype::f32 && type != gpu::dtype::f16 && type != gpu::dtype::bf16)
    return make_error(
        ec::invalid_request,
        fmt::format("a LoRA adapter is held in f32, f16 or bf16, not {}", gpu::to_string(type)));
  if (par.tp < 1 || par.pp < 1 || shard.tp_rank < 0 || shard.tp_rank >= par.tp ||
      shard.pp_rank < 0 || shard.pp_rank >= par.pp)
    return make_error(ec::invalid_request,
                      fmt::format("shard (tp rank {}, stage {}) is outside tp={} x pp={}",
                                  shard.tp_rank, shard.pp_rank, par.tp, par.pp));
  if (auto err = validate(adapter.base, par)) return err;
  // The base's own cut: the same split kind, slice and group as the weight it adapts.
  auto params = shard_params(adapter.base, par, shard);
  std::map<std::string, const param_spec*> by_name;
  for (auto& p : params) by_name[p.name] = &p;

  lora_rank_adapter out;
  out.par = par;
  out.shard = shard;
  out.rank = adapter.config.rank;
  out.type = type;
  out.content_hash = adapter.content_hash;
  auto r = adapter.config.rank;
  // Each module's slice: A's columns [a_col, a_col + a_cols), B's rows [b_row, b_row + b_rows).
  struct cut {
    const lora_module* m;
    int64_t a_col, a_cols, b_row, b_rows;
  };
  std::vector<cut> cuts;
  for (auto& m : adapter.modules) {
    auto it = by_name.find(m.base_param);
    if (it == by_name.end()) continue;  // a layer of another pipeline stage
    auto& p = *it->second;
    cut c{&m, 0, m.in, 0, m.out};
    auto slice = static_cast<int64_t>(slice_of(p, shard.tp_rank));
    if (p.split == split_kind::dim0) {
      c.b_rows = p.shard_shape[0];
      c.b_row = slice * c.b_rows;
    } else if (p.split == split_kind::dim1) {
      c.a_cols = p.shard_shape[1];
      c.a_col = slice * c.a_cols;
    } else {
      return make_error(ec::invalid_state,
                        fmt::format("{} is neither column- nor row-parallel", m.base_param));
    }
    auto stem = m.base_param.substr(0, m.base_param.size() - std::string_view(".weight").size());
    if (auto err = out.table.add(stem + ".lora_A", type, {r, c.a_cols})) return err;
    if (auto err = out.table.add(stem + ".lora_B", type, {c.b_rows, r})) return err;
    cuts.push_back(c);
  }
  out.host.assign(out.table.total_bytes(), std::byte{0});
  auto& entries = out.table.entries();
  for (size_t k = 0; k < cuts.size(); ++k) {
    auto& c = cuts[k];
    auto* a = out.host.data() + entries[2 * k].offset_bytes;
    auto* b = out.host.data() + entries[2 * k + 1].offset_bytes;
    uint64_t n = 0;
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c.a_cols; ++j)
        store_float(a, type, n++, c.m->a[static_cast<size_t>(i * c.m->in + c.a_col + j)]);
    n = 0;
    for (int64_t i = 0; i < c.b_rows; ++i)
      for (int64_t j = 0; j < r; ++j)
        store_float(b, type, n++, c.m->b[static_cast<size_t>((c.b_row + i) * r + j)]);
  }
  return out;
}

}  // namespace computron::models
