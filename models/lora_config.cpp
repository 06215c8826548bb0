// adapter_config.json and which projections it targets, matched as PEFT matches them
// (peft/tuners/tuners_utils.py, check_target_module_exists). Every field is type-checked
// before it is read, and what changes the adapter's output but is not implemented is
// refused here, naming the field.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>

#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "models/lora_adapter.hpp"

namespace computron::models {

using json = nlohmann::json;

namespace {

caf::error bad(const std::string& why) {
  return make_error(ec::invalid_configuration, "adapter_config.json: " + why);
}

/// Whether `j[key]` is absent, null, false, or an empty string / list / object: PEFT
/// writes unused options as null, false, [] or {}.
bool unset(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (it->is_boolean()) return !it->get<bool>();
  if (it->is_string() || it->is_array() || it->is_object()) return it->empty();
  return false;
}

caf::expected<bool> flag(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) return bad(fmt::format("{} must be true or false", key));
  return it->get<bool>();
}

/// A list of strings or one string (a regular expression); null leaves both empty.
caf::error names_or_regex(const json& j, const char* key, std::vector<std::string>& list,
                          std::string& regex) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (it->is_string()) {
    regex = it->get<std::string>();
    return {};
  }
  if (!it->is_array())
    return bad(fmt::format("{} must be a list of module names or a regular expression", key));
  for (auto& e : *it) {
    if (!e.is_string() || e.get<std::string>().empty())
      return bad(fmt::format("{} must hold non-empty module names", key));
    list.push_back(e.get<std::string>());
  }
  return {};
}

/// Limits on a pattern an adapter brings: libstdc++ compiles recursively (about 20000
/// nested groups overflow the stack) and copies a group once per counted repetition
/// (`(a{100}){100}` is 10^4 copies), so both are bounded before compiling.
constexpr size_t max_pattern_chars = 512;
constexpr uint64_t max_repetition_product = 64;

/// The product of the upper bounds of the counted repetitions (`{m}`, `{m,n}`, `{m,}`) of
/// `pattern`, outside character classes and escapes: a bound on how many times any part
/// is copied. Saturates past max_repetition_product.
uint64_t repetition_product(const std::string& pattern) {
  uint64_t product = 1;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char ch = pattern[i];
    if (ch == '\\') {
      ++i;
    } else if (in_class) {
      in_class = ch != ']';
    } else if (ch == '[') {
      in_class = true;
    } else if (ch == '{') {
      // {m}, {m,} or {m,n}: the automaton holds max(m, n) copies of the repeated part.
      uint64_t bound = 0, number = 0;
      size_t j = i + 1;
      for (; j < pattern.size(); ++j) {
        auto d = static_cast<unsigned char>(pattern[j]);
        if (std::isdigit(d)) {
          number = std::min<uint64_t>(number * 10 + (d - '0'), max_repetition_product + 1);
        } else if (d == ',') {
          bound = std::max(bound, number);
          number = 0;
        } else {
          break;
        }
      }
      bound = std::max(bound, number);
      if (j < pattern.size() && pattern[j] == '}')
        product = std::min(product * std::max<uint64_t>(bound, 1), max_repetition_product + 1);
    }
  }
  return product;
}

/// PEFT's regular expressions are Python's; std::regex's ECMAScript grammar reads the
/// ones adapters use (alternation, classes, .*, lookahead), and refuses named groups and
/// lookbehind. Matching runs in libstdc++'s polynomial mode: its default backtracking
/// takes exponential time on a pattern such as `(.*)*x` (a hung reader for one crafted
/// adapter), the polynomial one is linear in the path per automaton state and refuses
/// backreferences, which no target list needs.
caf::expected<std::regex> compile(const std::string& pattern, const char* field) {
  if (pattern.size() > max_pattern_chars)
    return bad(fmt::format("{} is a regular expression of {} characters (at most {} are read)",
                           field, pattern.size(), max_pattern_chars));
  if (repetition_product(pattern) > max_repetition_product)
    return bad(fmt::format("{} '{}' repeats a part more than {} times ({{m,n}} counts)", field,
                           pattern, max_repetition_product));
#if defined(__GLIBCXX__)
  constexpr auto flags = std::regex::ECMAScript | std::regex_constants::__polynomial;
#else
  constexpr auto flags = std::regex::ECMAScript;
#endif
  try {
    return std::regex(pattern, flags);
  } catch (const std::regex_error& e) {
    return bad(fmt::format("{} '{}' is not a regular expression this reader understands: {}", field,
                           pattern, e.what()));
  }
}

/// A list entry matches a module path equal to it or ending with "." + it.
bool list_match(const std::vector<std::string>& list, const std::string& path) {
  return std::any_of(list.begin(), list.end(), [&](const std::string& e) {
    return path == e ||
           (path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0 &&
            path[path.size() - e.size() - 1] == '.');
  });
}

bool is_head_or_embedding(const std::string& name) {
  auto last = name.substr(name.rfind('.') + 1);
  return last == "lm_head" || last == "embed_tokens" || last == "embed_positions" ||
         last == "embed_out" || last == "wte" || last == "wpe";
}

}  // namespace

double lora_config::scale() const {
  if (rank <= 0) return 0;
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank))
                    : alpha / static_cast<double>(rank);
}

caf::expected<lora_config> parse_lora_config(const json& j) {
  if (!j.is_object()) return bad("not a JSON object");
  lora_config c;
  auto type = j.find("peft_type");
  if (type == j.end() || !type->is_string())
    return bad("peft_type must be \"LORA\" (missing or not a string)");
  if (type->get<std::string>() != "LORA")
    return bad(
        fmt::format("peft_type '{}' is not supported (only LORA)", type->get<std::string>()));
  auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer() || r->get<int64_t>() <= 0)
    return bad("r must be a positive integer");
  c.rank = r->get<int64_t>();
  // PEFT's default alpha is 8; a saved config always writes it.
  c.alpha = 8;
  if (auto a = j.find("lora_alpha"); a != j.end() && !a->is_null()) {
    if (!a->is_number() || !std::isfinite(a->get<double>()))
      return bad("lora_alpha must be a number");
    c.alpha = a->get<double>();
  }
  auto rs = flag(j, "use_rslora");
  if (!rs) return rs.error();
  c.use_rslora = *rs;
  if (auto b = j.find("base_model_name_or_path"); b != j.end() && !b->is_null()) {
    if (!b->is_string()) return bad("base_model_name_or_path must be a string");
    c.base_model = b->get<std::string>();
  }

  // What changes the output and is not implemented: refused rather than served wrong.
  if (auto b = j.find("bias"); b != j.end() && !b->is_null()) {
    if (!b->is_string() || b->get<std::string>() != "none")
      return bad(
          fmt::format("bias {} is not supported (only \"none\": trained biases of the "
                      "base would have to be shipped and added)",
                      b->dump()));
  }
  for (auto key : {"use_dora", "lora_bias", "use_qalora"}) {
    auto on = flag(j, key);
    if (!on) return on.error();
    if (*on) return bad(fmt::format("{}: true is not supported", key));
  }
  for (auto key : {"modules_to_save", "rank_pattern", "alpha_pattern", "layer_replication",
                   "target_parameters", "trainable_token_indices", "alora_invocation_tokens"})
    if (!unset(j, key))
      return bad(fmt::format("{} is not supported (it must be empty or null; got {})", key,
                             j.at(key).dump()));
  // fan_in_fan_out only matters for Conv1D bases; PEFT resets it for nn.Linear, which
  // every supported family uses (models/lora_adapter.hpp).
  if (auto f = flag(j, "fan_in_fan_out"); !f) return f.error();

  if (auto t = j.find("target_modules"); t == j.end() || t->is_null())
    return bad("target_modules is missing (PEFT writes the modules it adapted)");
  if (auto err = names_or_regex(j, "target_modules", c.target_modules, c.target_regex)) return err;
  std::string lowered = c.target_regex;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (lowered == "all-linear") {
    c.all_linear = true;
    c.target_regex.clear();
  } else if (j.at("target_modules").is_string() && c.target_regex.empty()) {
    return bad("target_modules is an empty regular expression");
  } else if (j.at("target_modules").is_array() && c.target_modules.empty()) {
    return bad("target_modules is an empty list");
  }
  if (!c.target_regex.empty())
    if (auto re = compile(c.target_regex, "target_modules"); !re) return re.error();
  if (auto err = names_or_regex(j, "exclude_modules", c.exclude_modules, c.exclude_regex))
    return err;
  if (!c.exclude_regex.empty())
    if (auto re = compile(c.exclude_regex, "exclude_modules"); !re) return re.error();

  if (auto l = j.find("layers_to_transform"); l != j.end() && !l->is_null()) {
    if (l->is_number_integer()) {
      c.layers_to_transform.push_back(l->get<int64_t>());
    } else if (l->is_array()) {
      for (auto& e : *l) {
        if (!e.is_number_integer()) return bad("layers_to_transform must hold integers");
        c.layers_to_transform.push_back(e.get<int64_t>());
      }
    } else {
      return bad("layers_to_transform must be an integer or a list of integers");
    }
  }
  // Every supported family keeps its decoder layers in a list called "layers".
  if (auto p = j.find("layers_pattern"); p != j.end() && !p->is_null()) {
    bool ok = (p->is_string() && p->get<std::string>() == "layers") ||
              (p->is_array() && p->size() == 1 && (*p)[0] == "layers") ||
              (p->is_array() && p->empty());
    if (!ok)
      return bad(fmt::format("layers_pattern {} is not supported (only \"layers\")", p->dump()));
  }
  return c;
}

const std::vector<std::string>& lora_projections(const decoder_spec& base) {
  static const std::vector<std::string> llama = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  static const std::vector<std::string> opt = {"q_proj",   "k_proj", "v_proj",
                                               "out_proj", "fc1",    "fc2"};
  return base.family == model_family::opt ? opt : llama;
}

namespace {

/// The base parameter a projection adapts, as shard_params names it; empty when the
/// family has no such projection.
std::string param_name(const decoder_spec& base, int64_t layer, const std::string& proj) {
  auto& projs = lora_projections(base);
  if (std::find(projs.begin(), projs.end(), proj) == projs.end()) return {};
  if (base.family == model_family::opt) {
    bool mlp = proj == "fc1" || proj == "fc2";
    return fmt::format("layers.{}.{}{}.weight", layer, mlp ? "" : "self_attn.", proj);
  }
  bool mlp = proj == "gate_proj" || proj == "up_proj" || proj == "down_proj";
  return fmt::format("layers.{}.{}.{}.weight", layer, mlp ? "mlp" : "self_attn", proj);
}

}  // namespace

std::string lora_module_path(const decoder_spec& base, int64_t layer, const std::string& proj) {
  auto p = param_name(base, layer, proj);
  if (p.empty()) return {};
  p.resize(p.size() - std::string_view(".weight").size());
  // Hugging Face's module tree: OPTForCausalLM.model.decoder, LlamaForCausalLM.model.
  return (base.family == model_family::opt ? "model.decoder." : "model.") + p;
}

std::string detail::lora_param_name(const decoder_spec& base, int64_t layer,
                                    const std::string& proj) {
  return param_name(base, layer, proj);
}

caf::expected<std::vector<lora_site>> lora_targets(const lora_config& config,
                                                   const decoder_spec& base) {
  auto& projs = lora_projections(base);
  std::optional<std::regex> target_re, exclude_re;
  if (!config.target_regex.empty()) {
    auto re = compile(config.target_regex, "target_modules");
    if (!re) return re.error();
    target_re = std::move(*re);
  }
  if (!config.exclude_regex.empty()) {
    auto re = compile(config.exclude_regex, "exclude_modules");
    if (!re) return re.error();
    exclude_re = std::move(*re);
  }
  const auto& list = config.all_linear ? projs : config.target_modules;
  // An entry that names nothing this family has is a target the forward cannot apply:
  // PEFT would adapt it (lm_head, an embedding) or the adapter is for another family.
  for (auto& e : list) {
    bool any = false;
    for (int64_t i = 0; i < base.layers && !any; ++i)
      for (auto& p : projs) any = any || list_match({e}, lora_module_path(base, i, p));
    if (any) continue;
    if (is_head_or_embedding(e))
      return bad(
          fmt::format("target_modules names '{}': adapters on the LM head or embeddings "
                      "are not supported",
                      e));
    return bad(
        fmt::format("target_modules names '{}', which is no projection of {} ({} "
                    "family: {}) in its {} layers",
                    e, base.name, to_string(base.family), fmt::join(projs, ", "), base.layers));
  }
  std::vector<lora_site> out;
  for (int64_t i = 0; i < base.layers; ++i)
    for (auto& p : projs) {
      auto path = lora_module_path(base, i, p);
      if (exclude_re ? std::regex_match(path, *exclude_re)
                     : list_match(config.exclude_modules, path))
        continue;
      bool hit = false;
      if (target_re) {
        hit = std::regex_match(path, *target_re);
      } else if (std::find(list.begin(), list.end(), path) != list.end()) {
        hit = true;  // an exact path: PEFT ignores layers_to_transform then
      } else if (list_match(list, path)) {
        auto& only = config.layers_to_transform;
        hit = only.empty() || std::find(only.begin(), only.end(), i) != only.end();
      }
      if (hit) out.push_back({i, p});
    }
  if (out.empty())
    return bad(fmt::format("target_modules selects no projection of {} (family {}: {})", base.name,
                           to_string(base.family), fmt::join(projs, ", ")));
  return out;
}

}  // namespace computron::models
