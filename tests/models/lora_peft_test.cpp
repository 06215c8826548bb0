// Our forward with a LoRA adapter against transformers + peft (tests/support/peft_reference.py:
// the base folder in float32 with eager attention, the adapter applied by
// PeftModel.from_pretrained and run unmerged by peft's own LoRA layers). lora_forward_test
// checks the same forward against a merged model we compute ourselves, from our reading of
// PEFT's scale and tensor layout; peft is the independent word on both. Tiny Hugging Face
// folders of Llama, Qwen2 (q/k/v biases), Qwen3 (q/k norms) and OPT, each read back as the
// server reads them (read_hf_config, fill_from_checkpoint), with a rank 4, alpha 8 adapter on
// every projection (and an rsLoRA one on Llama), at tp 1 and tp 2: the greedy tokens must be
// peft's and every step's logits within a relative 1e-4 of peft's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "models/checkpoint.hpp"
#include "models/lora_adapter.hpp"
#include "models/weights.hpp"
#include "tests/support/peft_folder.hpp"
#include "tests/support/python.hpp"
#include "tests/support/sharded_model.hpp"
#include "tests/support/source_tree.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::models;
using json = nlohmann::json;
using computron::test::relative_error;

namespace {

constexpr int steps = 4;

/// Measured (peft 0.21.2, transformers 5.17, torch 2.11, x86-64, one thread): at most
/// 1.9e-7 over every case, step and split (OPT's base; 1.8e-7 with an adapter). The
/// adapters move peft's own logits by 6e-2 (Llama) to 1.3 (OPT), so a forward that dropped
/// the adapter, a projection of it or its scale (rsLoRA's alpha / sqrt(r) is 2x alpha / r
/// here) misses by hundreds of times the bound. The seeded Llama-family bases repeat their
/// last token under either weights, so the logits, compared at every step, are the check
/// there; the tokens are checked too.
constexpr double bound = 1e-4;

const std::vector<int64_t> prompt = {1, 17, 20, 33, 5, 9, 14};

/// One base family: its tiny spec as written, a seed for its weights.
struct family {
  std::string what;
  decoder_spec spec;
  uint64_t seed;
};

std::vector<family> families() {
  auto llama = test::tiny_llama();
  auto qwen2 = test::tiny_llama();
  qwen2.name = "lora-qwen2";
  qwen2.model_type = "qwen2";
  qwen2.qkv_bias = true;
  auto qwen3 = test::tiny_llama();
  qwen3.name = "lora-qwen3";
  qwen3.model_type = "qwen3";
  qwen3.qk_norm = true;
  return {{"llama", llama, 11},
          {"qwen2", qwen2, 12},
          {"qwen3", qwen3, 13},
          {"opt", test::tiny_opt(), 14}};
}

/// A rank 4, alpha 8 adapter on every projection of `base`. make_folder's values (up to 2)
/// are scaled by 1/16 (exactly: a power of two), so that scale * B A perturbs the seeded
/// weights (up to 0.05) as a trained adapter does, instead of drowning them.
test::peft_folder adapter_of(const decoder_spec& base, uint32_t seed, bool rslora) {
  auto f = test::make_folder(base, 4, 8.0, {}, gpu::dtype::f32, seed);
  for (auto& t : f.tensors)
    for (auto& x : t.values) x /= 16.0f;
  f.config["use_rslora"] = rslora;
  f.write();
  return f;
}

/// Our forward over the Hugging Face folder `dir`, read as the server reads it, split over
/// `tp` ranks, with the adapter folder `adapter` attached as id 1 (or none when empty).
test::greedy_run ours(const std::string& dir, const std::string& adapter, int tp) {
  auto config = read_hf_config(dir);
  INFO(dir << ": " << (config ? std::string{} : render(config.error())));
  REQUIRE(config);
  const auto spec = config->spec;
  auto file = checkpoint::open(dir);
  INFO((file ? std::string{} : render(file.error())));
  REQUIRE(file);
  auto shared = std::make_shared<checkpoint>(std::move(*file));
  test::shard_filler from_folder = [spec, shared](const parallel_config& par,
                                                  const shard_index& idx, gpu::weight_shard& w) {
    return fill_from_checkpoint(spec, par, idx, w.table(), w.host_data(), *shared);
  };
  test::sharded_model m(spec, gpu::dtype::f32, {tp, 1}, from_folder);
  // The adapter's shards must outlive their attachment: they live as long as `m` here.
  std::vector<std::unique_ptr<gpu::weight_shard>> keep;
  if (!adapter.empty()) {
    auto a = read_lora_adapter(adapter, spec);
    INFO(adapter << ": " << (a ? std::string{} : render(a.error())));
    REQUIRE(a);
    for (int r = 0; r < tp; ++r) {
      auto slice = slice_lora_adapter(*a, {tp, 1}, {r, 0}, gpu::dtype::f32);
      INFO((slice ? std::string{} : render(slice.error())));
      REQUIRE(slice);
      auto w = gpu::weight_shard::create(m.devices[static_cast<size_t>(r)], slice->table);
      REQUIRE(w);
      std::memcpy((*w)->host_data(), slice->host.data(), slice->host.size());
      REQUIRE_FALSE((*w)->load({1ull << 20}));
      REQUIRE_FALSE((*w)->wait_loaded(std::chrono::seconds(30)));
      keep.push_back(std::move(*w));
      auto err = m.stages[static_cast<size_t>(r)]->attach_adapter(1, *keep.back(), a->config.rank);
      INFO((err ? render(err) : std::string{}));
      REQUIRE_FALSE(err);
    }
  }
  return test::run_greedy(m, {prompt}, steps, {adapter.empty() ? 0 : 1});
}

/// peft_reference.py over every case at once (importing torch, transformers and peft takes
/// seconds); one line per case, in order. A missing Python or peft fails the test: both
/// come from scripts/setup.
class peft_oracle {
 public:
  explicit peft_oracle(const std::vector<std::string>& cases) {
    auto python = test::venv_python();
    INFO("no Python environment at " << test::venv_dir()
                                     << ": scripts/setup installs it, with transformers and peft");
    REQUIRE_FALSE(python.empty());
    std::string ids;
    for (auto t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    std::vector<std::string> argv = {
        python,     (test::folder_of(__FILE__) / ".." / "support" / "peft_reference.py").string(),
        "--prompt", ids,
        "--steps",  std::to_string(steps)};
    argv.insert(argv.end(), cases.begin(), cases.end());
    child_ = std::make_unique<child_process>(argv);
  }

  json next() {
    auto line = child_->read_line(std::chrono::seconds(300));
    INFO("peft_reference.py gave no answer; its stderr is above (exit status "
         << (child_->exited() ? std::to_string(child_->exit_status()) : "(running)")
         << "). scripts/setup installs transformers and peft into " << test::venv_dir());
    REQUIRE(line);
    return json::parse(*line);
  }

 private:
  std::unique_ptr<child_process> child_;
};

/// peft's run as ours: tokens and every step's logits.
test::greedy_run theirs_of(const json& j) {
  test::greedy_run r;
  r.tokens.push_back(j.at("tokens").get<std::vector<int64_t>>());
  for (auto& row : j.at("logits")) r.logits.push_back({row.get<std::vector<float>>()});
  return r;
}

/// The largest relative difference over every step (infinite when the step counts differ).
double worst(const test::greedy_run& a, const test::greedy_run& b) {
  if (a.logits.size() != b.logits.size()) return INFINITY;
  double most = 0;
  for (size_t s = 0; s < a.logits.size(); ++s)
    most = std::max(most, relative_error(a.logits[s][0], b.logits[s][0]));
  return most;
}

}  // namespace

TEST_CASE(
    "our forward with a LoRA adapter gives peft's logits and tokens, every family, tp 1 and 2",
    "[lora][peft]") {
  struct one_case {
    std::string what;
    std::string folder;
    std::string adapter;  // empty: the base alone
    size_t modules = 0;   // the adapter's A/B pairs
  };
  test::temp_dir dir{"peft-oracle"};
  std::vector<one_case> cases;
  std::vector<test::peft_folder> adapters;  // their temp folders live to the end
  uint32_t seed = 100;
  for (auto& fam : families()) {
    auto folder = dir.path() + "/" + fam.what;
    auto err = write_hf_opt_folder(folder, fam.spec, gpu::dtype::f32, fam.seed, 1);
    INFO(fam.what << ": " << (err ? render(err) : std::string{}));
    REQUIRE_FALSE(err);
    cases.push_back({fam.what + " base", folder, ""});
    for (bool rslora : {false, true}) {
      // rsLoRA's scale (alpha / sqrt(r)) on Llama alone: the scale is family-blind.
      if (rslora && fam.what != "llama") continue;
      adapters.push_back(adapter_of(fam.spec, seed, rslora));
      seed += 1000;
      cases.push_back({fam.what + (rslora ? " rsLoRA" : " LoRA") + " r 4 alpha 8", folder,
                       adapters.back().dir->path(), adapters.back().tensors.size() / 2});
    }
  }
  std::vector<std::string> args;
  for (auto& c : cases) args.push_back(c.folder + ":" + c.adapter);
  peft_oracle oracle{args};

  std::vector<test::greedy_run> base_theirs(cases.size());
  std::vector<test::greedy_run> base_ours(cases.size());
  size_t base_at = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto& c = cases[i];
    auto j = oracle.next();
    INFO(c.what);
    REQUIRE(j.at("case").get<std::string>() == args[i]);
    auto theirs = theirs_of(j);
    if (c.adapter.empty()) {
      base_at = i;
    } else {
      // peft held every tensor of the folder (peft_reference.py checks the values): one
      // LoRA layer per projection per layer.
      CHECK(j.at("lora_modules").get<size_t>() == c.modules);
      // The adapter changes peft's logits: a forward that ignored it would fail below.
      auto change = worst(theirs, base_theirs[base_at]);
      WARN(c.what << ": the adapter moves peft's logits by " << change << " (relative)");
      CHECK(change > 1e-2);
    }
    for (int tp : {1, 2}) {
      auto got = ours(c.folder, c.adapter, tp);
      auto rel = worst(got, theirs);
      WARN(c.what << " tp " << tp << ": tokens " << json(got.tokens[0]).dump() << ", peft's "
                  << json(theirs.tokens[0]).dump() << ", max relative error " << rel);
      INFO("tp " << tp);
      CHECK(got.tokens == theirs.tokens);
      CHECK(rel < bound);
      if (c.adapter.empty()) {
        if (tp == 1) base_ours[i] = got;
      } else {
        // Ours moves as peft's does: far from our base.
        CHECK(worst(got, base_ours[base_at]) > 1e-2);
      }
    }
    if (c.adapter.empty()) base_theirs[i] = theirs;
  }
}
