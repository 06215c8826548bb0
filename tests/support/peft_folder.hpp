#pragma once

// Tiny PEFT LoRA folders written by tests (adapter_config.json and an
// adapter_model.safetensors named as PEFT names its tensors) over tiny bases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "models/lora_adapter.hpp"
#include "models/safetensors.hpp"
#include "models/weights.hpp"
#include "tests/support/temp_files.hpp"

namespace computron::test {

using namespace computron::models;
using json = nlohmann::json;

/// Llama-family with grouped-query attention (4 query heads over 2 key/value heads, a head
/// width that is not hidden / heads) so k/v are cut differently from q at tp 2 and
/// replicated at tp 4.
inline decoder_spec tiny_llama() {
  decoder_spec s{"lora-llama", 16, 2, 4, 24, 40, 64};
  s.family = model_family::llama;
  s.kv_heads = 2;
  s.head_dim = 6;
  s.model_type = "llama";
  return s;
}

inline decoder_spec tiny_opt() {
  return decoder_spec{"lora-opt", 16, 2, 4, 32, 40, 64};
}

/// One tensor to write, its values kept as floats for the reference computations.
struct source_tensor {
  std::string name;
  gpu::dtype type = gpu::dtype::f32;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

/// Values exact in bf16 (8 significant bits), so every source dtype holds them unchanged.
inline std::vector<float> draw(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(gen)) / 64.0f;
  return v;
}

/// A PEFT folder: adapter_config.json from `config`, the tensors from `tensors`.
struct peft_folder {
  std::shared_ptr<test::temp_dir> dir = std::make_shared<test::temp_dir>("lora");
  json config;
  std::vector<source_tensor> tensors;

  void write() const {
    std::ofstream(dir->path() + "/adapter_config.json") << config.dump(2);
    std::vector<std::vector<std::byte>> bytes;
    std::vector<safetensor> out;
    for (auto& t : tensors) {
      auto width = gpu::size_of(t.type);
      std::vector<std::byte> b(t.values.size() * width);
      for (size_t i = 0; i < t.values.size(); ++i) {
        if (t.type == gpu::dtype::f32) {
          std::memcpy(b.data() + 4 * i, &t.values[i], 4);
        } else if (t.type == gpu::dtype::i32) {
          auto x = static_cast<int32_t>(t.values[i]);
          std::memcpy(b.data() + 4 * i, &x, 4);
        } else {
          uint16_t h = t.type == gpu::dtype::bf16 ? to_bf16(t.values[i]) : to_f16(t.values[i]);
          std::memcpy(b.data() + 2 * i, &h, 2);
        }
      }
      bytes.push_back(std::move(b));
      out.push_back({t.name, t.type, t.shape, bytes.back().data(), bytes.back().size()});
    }
    REQUIRE_FALSE(write_safetensors(dir->path() + "/adapter_model.safetensors", out));
  }

  const source_tensor& find(const std::string& name) const {
    for (auto& t : tensors)
      if (t.name == name) return t;
    FAIL("no tensor " << name);
    return tensors.front();
  }
  void erase(const std::string& name) {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const source_tensor& t) { return t.name == name; });
    REQUIRE(it != tensors.end());
    tensors.erase(it);
  }
};

inline std::string tensor_name(const decoder_spec& base, int64_t layer, const std::string& proj,
                               const char* kind) {
  return "base_model.model." + lora_module_path(base, layer, proj) + "." + kind + ".weight";
}

/// A folder as PEFT saves one: every projection in `projs` of every layer, rank r, its
/// values drawn from `seed` on (folders of other seeds hold other adapters).
inline peft_folder make_folder(const decoder_spec& base, int64_t r, double alpha,
                               std::vector<std::string> projs = {},
                               gpu::dtype type = gpu::dtype::f32, uint32_t seed = 1) {
  if (projs.empty()) projs = lora_projections(base);
  peft_folder f;
  f.config = {{"peft_type", "LORA"},
              {"r", r},
              {"lora_alpha", alpha},
              {"target_modules", projs},
              {"base_model_name_or_path", "someone/" + base.name},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"use_dora", false},
              {"use_rslora", false},
              {"modules_to_save", nullptr},
              {"rank_pattern", json::object()},
              {"alpha_pattern", json::object()},
              {"lora_dropout", 0.05},
              {"task_type", "CAUSAL_LM"}};
  auto full = shard_params(base, {1, 1}, {0, 0});
  for (int64_t i = 0; i < base.layers; ++i)
    for (auto& p : projs) {
      auto param = detail::lora_param_name(base, i, p);
      auto it = std::find_if(full.begin(), full.end(),
                             [&](const param_spec& s) { return s.name == param; });
      REQUIRE(it != full.end());
      auto out = it->full_shape[0], in = it->full_shape[1];
      f.tensors.push_back({tensor_name(base, i, p, "lora_A"),
                           type,
                           {r, in},
                           draw(static_cast<size_t>(r * in), seed++)});
      f.tensors.push_back({tensor_name(base, i, p, "lora_B"),
                           type,
                           {out, r},
                           draw(static_cast<size_t>(out * r), seed++)});
    }
  return f;
}

/// The refusal of reading `f` against `base`, rendered.
inline std::string refusal(const peft_folder& f, const decoder_spec& base,
                           const lora_limits& lim = {}) {
  f.write();
  auto got = read_lora_adapter(f.dir->path(), base, lim);
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), ec::invalid_configuration));
  return render(got.error());
}

}  // namespace computron::test
