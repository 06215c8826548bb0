// The forward makes one product of q, k and v (and of gate and up) over their weights in
// place (stage_state::fused): that needs every shard of every family and split to lay them
// side by side, with no gap, and their biases likewise. Checked here for the whole
// catalogue, torch-free, so that a layout change that would silently fall back to one
// product each fails.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "models/decoder_spec.hpp"

using namespace computron;
using namespace computron::models;

namespace {

/// Why `names` are not side by side in `table`, the first on the table's alignment (the
/// fused view starts there), or "" when they are.
std::string gap(const gpu::tensor_table& table, const std::vector<std::string>& names) {
  const gpu::tensor_entry* prev = nullptr;
  if (auto e = table.find(names.front());
      e != nullptr && e->offset_bytes % gpu::tensor_table::alignment != 0)
    return fmt::format("{} starts at {}, off the alignment", e->name, e->offset_bytes);
  for (auto& name : names) {
    auto e = table.find(name);
    if (e == nullptr) return name + " is missing";
    if (prev != nullptr && prev->offset_bytes + prev->size_bytes != e->offset_bytes)
      return fmt::format("{} ends at {}, {} starts at {}", prev->name,
                         prev->offset_bytes + prev->size_bytes, name, e->offset_bytes);
    prev = e;
  }
  return {};
}

}  // namespace

TEST_CASE("every shard lays q, k, v and gate, up side by side for one product",
          "[models][layout][fused]") {
  int checked = 0;
  for (auto& spec : catalogue()) {
    if (spec.layers > 40) continue;  // the largest shapes repeat the smaller ones' layers
    for (auto par : {parallel_config{1, 1}, parallel_config{2, 1}, parallel_config{2, 2},
                     parallel_config{4, 1}, parallel_config{8, 1}}) {
      if (validate(spec, par)) continue;
      for (auto type : {gpu::dtype::f32, gpu::dtype::bf16, gpu::dtype::f16})
        for (int s = 0; s < par.pp; ++s)
          for (int r = 0; r < par.tp; ++r) {
            auto table = shard_layout(spec, type, par, {r, s});
            REQUIRE(table);
            auto [begin, end] = stage_layers(spec, par.pp, s);
            for (auto i = begin; i < end; ++i) {
              auto a = fmt::format("layers.{}.self_attn.", i);
              std::vector<std::vector<std::string>> runs{
                  {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}};
              if (spec.family == model_family::opt || spec.qkv_bias)
                runs.push_back({a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"});
              if (spec.family != model_family::opt)
                runs.push_back({fmt::format("layers.{}.mlp.gate_proj.weight", i),
                                fmt::format("layers.{}.mlp.up_proj.weight", i)});
              for (auto& run : runs) {
                auto why = gap(*table, run);
                INFO(spec.name << " tp " << par.tp << " pp " << par.pp << " rank " << r << " stage "
                               << s << " " << gpu::to_string(type) << ": " << why);
                CHECK(why.empty());
                ++checked;
              }
            }
          }
    }
  }
  CHECK(checked > 1000);
}
