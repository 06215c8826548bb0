// LoRA adapters without torch: tiny PEFT folders (tests/support/peft_folder.hpp) read
// against tiny bases, the scale folded into B, the per-rank cut checked against the base's
// own slicing rule (global_index, which fills the base's shards), and the content hash.
// The refusals are in lora_refusals_test.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "models/lora_adapter.hpp"
#include "models/safetensors.hpp"
#include "models/weights.hpp"
#include "tests/support/peft_folder.hpp"

using namespace computron;
using namespace computron::models;
using namespace computron::test;
using json = nlohmann::json;

namespace {

/// Element i of a tensor of the rank buffer, as f32.
float rank_value(const lora_rank_adapter& ra, const gpu::tensor_entry& e, size_t i) {
  auto* p = ra.host.data() + e.offset_bytes;
  if (e.type == gpu::dtype::f32) {
    float x;
    std::memcpy(&x, p + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return e.type == gpu::dtype::bf16 ? from_bf16(h) : from_f16(h);
}

/// scale * B A from the source tensors, [out x in], in double.
std::vector<double> full_delta(const source_tensor& a, const source_tensor& b, double scale) {
  auto r = a.shape[0], in = a.shape[1], out = b.shape[0];
  std::vector<double> d(static_cast<size_t>(out * in));
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      double s = 0;
      for (int64_t k = 0; k < r; ++k)
        s += double{b.values[static_cast<size_t>(i * r + k)]} *
             double{a.values[static_cast<size_t>(k * in + j)]};
      d[static_cast<size_t>(i * in + j)] = scale * s;
    }
  return d;
}

/// Checks every rank's B_rank A_rank against the part of the whole delta that the base's
/// slicing rule (global_index) gives the same rank of the base weight.
void check_cut(const decoder_spec& base, const peft_folder& f, const lora_adapter& adapter,
               const parallel_config& par) {
  auto scale = adapter.config.scale();
  auto r = adapter.config.rank;
  for (int pp = 0; pp < par.pp; ++pp)
    for (int tp = 0; tp < par.tp; ++tp) {
      shard_index shard{tp, pp};
      auto ra = slice_lora_adapter(adapter, par, shard);
      REQUIRE(ra);
      CHECK(ra->host.size() == ra->size_bytes());
      CHECK(ra->content_hash == adapter.content_hash);
      size_t pairs = 0;
      for (auto& p : shard_params(base, par, shard)) {
        // The cut projections' weights (not their biases, not the embeddings).
        bool weight = p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
        if ((p.split != split_kind::dim0 && p.split != split_kind::dim1) || !weight ||
            p.name.rfind("layers.", 0) != 0)
          continue;
        auto stem = p.name.substr(0, p.name.size() - 7);
        auto* ea = ra->table.find(stem + ".lora_A");
        auto* eb = ra->table.find(stem + ".lora_B");
        REQUIRE(ea != nullptr);
        REQUIRE(eb != nullptr);
        ++pairs;
        // Recover (layer, proj) from the name to find the source pair.
        auto layer = std::stoll(p.name.substr(7));
        auto proj = stem.substr(stem.rfind('.') + 1);
        auto delta = full_delta(f.find(tensor_name(base, layer, proj, "lora_A")),
                                f.find(tensor_name(base, layer, proj, "lora_B")), scale);
        auto rows = eb->shape[0], cols = ea->shape[1];
        REQUIRE(rows == p.shard_shape[0]);
        REQUIRE(cols == p.shard_shape[1]);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            double s = 0;
            for (int64_t k = 0; k < r; ++k)
              s += double{rank_value(*ra, *eb, static_cast<size_t>(i * r + k))} *
                   double{rank_value(*ra, *ea, static_cast<size_t>(k * cols + j))};
            auto local = static_cast<uint64_t>(i * cols + j);
            auto want = delta[global_index(p, par.tp, tp, local)];
            INFO(p.name << " tp " << par.tp << " rank " << tp << " (" << i << ", " << j << ")");
            REQUIRE(s == Approx(want).margin(1e-6));
          }
      }
      auto [begin, end] = stage_layers(base, par.pp, pp);
      CHECK(pairs == static_cast<size_t>(end - begin) * lora_projections(base).size());
      CHECK(ra->table.entries().size() == 2 * pairs);
    }
}

}  // namespace

TEST_CASE("a PEFT folder reads against a Llama-family base with alpha over r folded into B",
          "[models][lora]") {
  auto base = tiny_llama();
  auto f = make_folder(base, 4, 8);
  f.write();
  auto got = read_lora_adapter(f.dir->path(), base);
  REQUIRE(got);
  CHECK(got->config.rank == 4);
  CHECK(got->config.scale() == 2.0);
  CHECK(got->config.base_model == "someone/lora-llama");
  REQUIRE(got->modules.size() == 2 * 7);
  auto& q = got->modules[0];
  CHECK(q.layer == 0);
  CHECK(q.proj == "q_proj");
  CHECK(q.base_param == "layers.0.self_attn.q_proj.weight");
  CHECK(q.out == 24);  // 4 heads x head_dim 6
  CHECK(q.in == 16);
  auto& k = got->modules[1];
  CHECK(k.out == 12);  // 2 key/value heads x 6
  auto& o = got->modules[3];
  CHECK(o.proj == "o_proj");
  CHECK(o.in == 24);
  CHECK(o.out == 16);
  auto& down = got->modules[13];
  CHECK(down.layer == 1);
  CHECK(down.proj == "down_proj");
  CHECK(down.base_param == "layers.1.mlp.down_proj.weight");
  CHECK(down.in == 24);
  auto& src_a = f.find(tensor_name(base, 1, "down_proj", "lora_A")).values;
  auto& src_b = f.find(tensor_name(base, 1, "down_proj", "lora_B")).values;
  CHECK(down.a == src_a);
  REQUIRE(down.b.size() == src_b.size());
  for (size_t i = 0; i < src_b.size(); ++i) CHECK(down.b[i] == 2.0f * src_b[i]);
}

TEST_CASE("rsLoRA folds alpha over the square root of r", "[models][lora]") {
  auto base = tiny_llama();
  auto f = make_folder(base, 16, 8, {"q_proj"});
  f.config["use_rslora"] = true;
  f.write();
  auto got = read_lora_adapter(f.dir->path(), base);
  REQUIRE(got);
  CHECK(got->config.scale() == 2.0);  // 8 / sqrt(16), where plain LoRA gives 0.5
  auto& src_b = f.find(tensor_name(base, 0, "q_proj", "lora_B")).values;
  for (size_t i = 0; i < src_b.size(); ++i) CHECK(got->modules[0].b[i] == 2.0f * src_b[i]);
  f.config["use_rslora"] = false;
  f.write();
  got = read_lora_adapter(f.dir->path(), base);
  REQUIRE(got);
  for (size_t i = 0; i < src_b.size(); ++i) CHECK(got->modules[0].b[i] == 0.5f * src_b[i]);
}

TEST_CASE("BF16 and F16 adapters, and names that keep the adapter name, read the same values",
          "[models][lora]") {
  auto base = tiny_llama();
  auto f32 = make_folder(base, 4, 4, {"q_proj", "v_proj"});
  f32.write();
  auto want = read_lora_adapter(f32.dir->path(), base);
  REQUIRE(want);
  for (auto type : {gpu::dtype::bf16, gpu::dtype::f16}) {
    auto f = make_folder(base, 4, 4, {"q_proj", "v_proj"}, type);
    for (auto& t : f.tensors) {
      // A state dict of the live model: no base_model.model. prefix, ".default" kept.
      t.name = t.name.substr(std::string("base_model.model.").size());
      t.name.insert(t.name.size() - 7, ".default");
    }
    f.write();
    auto got = read_lora_adapter(f.dir->path(), base);
    REQUIRE(got);
    REQUIRE(got->modules.size() == want->modules.size());
    for (size_t m = 0; m < want->modules.size(); ++m) {
      CHECK(got->modules[m].a == want->modules[m].a);
      CHECK(got->modules[m].b == want->modules[m].b);
    }
    CHECK(got->content_hash == want->content_hash);
  }
}

TEST_CASE(
    "target_modules as a regular expression, all-linear, layers_to_transform and "
    "exclude_modules select what PEFT selects",
    "[models][lora]") {
  auto base = tiny_llama();
  auto keep = [&](peft_folder& f, std::vector<std::pair<int64_t, std::string>> sites) {
    std::vector<source_tensor> kept;
    for (auto& t : f.tensors)
      for (auto& [l, p] : sites)
        if (t.name.find(lora_module_path(base, l, p) + ".") != std::string::npos) kept.push_back(t);
    f.tensors = kept;
  };
  auto sites_of = [](const lora_adapter& a) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (auto& m : a.modules) out.emplace_back(m.layer, m.proj);
    return out;
  };
  using sites = std::vector<std::pair<int64_t, std::string>>;
  {
    auto f = make_folder(base, 2, 2);
    f.config["target_modules"] = R"(model\.layers\.[1]{1,2}\.self_attn\.(q|v)_proj)";
    keep(f, {{1, "q_proj"}, {1, "v_proj"}});
    f.write();
    auto got = read_lora_adapter(f.dir->path(), base);
    REQUIRE(got);
    CHECK(sites_of(*got) == sites{{1, "q_proj"}, {1, "v_proj"}});
  }
  {
    // A regular expression matches the whole path, as re.fullmatch does: "q_proj" alone
    // matches no path, so nothing is selected.
    auto f = make_folder(base, 2, 2, {"q_proj"});
    f.config["target_modules"] = "q_proj";
    CHECK_THAT(refusal(f, base), Catch::Contains("target_modules selects no projection"));
  }
  {
    auto f = make_folder(base, 2, 2);
    f.config["target_modules"] = "all-linear";
    f.write();
    auto got = read_lora_adapter(f.dir->path(), base);
    REQUIRE(got);
    CHECK(got->modules.size() == 14);
  }
  {
    auto f = make_folder(base, 2, 2, {"q_proj", "up_proj"});
    f.config["layers_to_transform"] = json::array({1});
    keep(f, {{1, "q_proj"}, {1, "up_proj"}});
    f.write();
    auto got = read_lora_adapter(f.dir->path(), base);
    REQUIRE(got);
    CHECK(sites_of(*got) == sites{{1, "q_proj"}, {1, "up_proj"}});
  }
  {
    auto f = make_folder(base, 2, 2, {"q_proj", "up_proj"});
    f.config["exclude_modules"] = json::array({"model.layers.0.mlp.up_proj"});
    keep(f, {{0, "q_proj"}, {1, "q_proj"}, {1, "up_proj"}});
    f.write();
    auto got = read_lora_adapter(f.dir->path(), base);
    REQUIRE(got);
    CHECK(sites_of(*got) == sites{{0, "q_proj"}, {1, "q_proj"}, {1, "up_proj"}});
  }
  {
    // fan_in_fan_out is PEFT's Conv1D switch, which PEFT turns off for nn.Linear.
    auto f = make_folder(base, 2, 2, {"k_proj"});
    f.config["fan_in_fan_out"] = true;
    f.write();
    CHECK(read_lora_adapter(f.dir->path(), base));
  }
}

TEST_CASE("each tensor-parallel rank's A and B give the base rank's slice of the delta",
          "[models][lora]") {
  auto base = tiny_llama();
  auto f = make_folder(base, 3, 6);
  f.write();
  auto adapter = read_lora_adapter(f.dir->path(), base);
  REQUIRE(adapter);
  // tp 4 exceeds the 2 key/value heads: k/v rows are replicated in pairs of ranks.
  for (int tp : {1, 2, 4}) {
    INFO("tp " << tp);
    check_cut(base, f, *adapter, {tp, 1});
  }
  check_cut(base, f, *adapter, {2, 2});

  auto opt = tiny_opt();
  auto g = make_folder(opt, 4, 16);
  g.write();
  auto opt_adapter = read_lora_adapter(g.dir->path(), opt);
  REQUIRE(opt_adapter);
  CHECK(opt_adapter->modules[3].proj == "out_proj");
  CHECK(opt_adapter->modules[3].base_param == "layers.0.self_attn.out_proj.weight");
  CHECK(opt_adapter->modules[4].base_param == "layers.0.fc1.weight");
  for (int tp : {1, 2, 4}) check_cut(opt, g, *opt_adapter, {tp, 1});
}

TEST_CASE("a rank's adapter is one buffer whose size the table gives, in the base's dtype",
          "[models][lora]") {
  auto base = tiny_llama();
  auto f = make_folder(base, 4, 4, {"q_proj", "down_proj"});
  f.write();
  auto adapter = read_lora_adapter(f.dir->path(), base);
  REQUIRE(adapter);
  auto ra = slice_lora_adapter(*adapter, {2, 1}, {1, 0}, gpu::dtype::bf16);
  REQUIRE(ra);
  // Per layer: q A [4 x 16], q B [12 x 4], down A [4 x 12], down B [16 x 4], each padded
  // to the table's 256-byte alignment.
  uint64_t want = 0;
  for (int layer = 0; layer < 2; ++layer)
    for (uint64_t bytes : {4 * 16 * 2, 12 * 4 * 2, 4 * 12 * 2, 16 * 4 * 2})
      want = (want + 255) / 256 * 256 + bytes;
  CHECK(ra->size_bytes() == ra->table.total_bytes());
  CHECK(ra->size_bytes() >= want);
  CHECK(ra->size_bytes() < want + 256);
  CHECK(ra->host.size() == ra->size_bytes());
  auto* qb = ra->table.find("layers.0.self_attn.q_proj.lora_B");
  REQUIRE(qb != nullptr);
  CHECK(qb->type == gpu::dtype::bf16);
  CHECK(qb->shape == std::vector<int64_t>{12, 4});
  // Rank 1 holds rows 12..23 of B; the values are bf16-exact times a power of two.
  auto& src = f.find(tensor_name(base, 0, "q_proj", "lora_B")).values;
  for (size_t i = 0; i < 12 * 4; ++i) CHECK(rank_value(*ra, *qb, i) == src[12 * 4 + i]);

  CHECK(is(slice_lora_adapter(*adapter, {3, 1}, {0, 0}).error(), ec::invalid_configuration));
  CHECK(is(slice_lora_adapter(*adapter, {2, 1}, {2, 0}).error(), ec::invalid_request));
  CHECK(is(slice_lora_adapter(*adapter, {2, 1}, {0, 0}, gpu::dtype::i8).error(),
           ec::invalid_request));
}

TEST_CASE("the content hash follows what the adapter computes, not its name or folder",
          "[models][lora]") {
  auto base = tiny_llama();
  auto hash = [&](const peft_folder& f) {
    f.write();
    auto got = read_lora_adapter(f.dir->path(), base);
    REQUIRE(got);
    return got->content_hash;
  };
  auto f = make_folder(base, 4, 8, {"q_proj", "down_proj"});
  auto h = hash(f);
  CHECK(h.size() == 64);
  // Another folder, another base name, another dtype holding the same values: the same.
  auto copy = make_folder(base, 4, 8, {"q_proj", "down_proj"}, gpu::dtype::bf16);
  copy.config["base_model_name_or_path"] = "/somewhere/else";
  copy.config["lora_dropout"] = 0.2;
  CHECK(hash(copy) == h);
  // alpha 16 with B halved computes the same delta: the same.
  auto rescaled = make_folder(base, 4, 16, {"q_proj", "down_proj"});
  for (auto& t : rescaled.tensors)
    if (t.name.find("lora_B") != std::string::npos)
      for (auto& x : t.values) x /= 2;
  CHECK(hash(rescaled) == h);
  // One value, alpha, rsLoRA, the targets: different.
  auto one = make_folder(base, 4, 8, {"q_proj", "down_proj"});
  one.tensors[0].values[5] += 1.0f / 64;
  CHECK(hash(one) != h);
  auto alpha = make_folder(base, 4, 4, {"q_proj", "down_proj"});
  CHECK(hash(alpha) != h);
  auto rs = make_folder(base, 4, 8, {"q_proj", "down_proj"});
  rs.config["use_rslora"] = true;
  CHECK(hash(rs) != h);
  auto fewer = make_folder(base, 4, 8, {"q_proj"});
  CHECK(hash(fewer) != h);
}
