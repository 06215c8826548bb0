// The Llama-family forward (Llama, Mistral, Qwen2, Qwen3) against an independent float64
// reference written from transformers' equations (tests/support/llama_reference), on tiny
// Hugging Face folders as save_pretrained writes them; and every tensor x pipeline split
// equal to the unsharded model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "models/checkpoint.hpp"
#include "models/weights.hpp"
#include "tests/support/llama_reference.hpp"
#include "tests/support/sharded_model.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::models;

namespace {

/// A Hugging Face folder's model, its shards filled from the mapped files.
struct hf_model {
  hf_model_config config;
  std::shared_ptr<checkpoint> file;

  explicit hf_model(const std::string& dir) {
    auto c = read_hf_config(dir);
    INFO((c ? std::string{} : render(c.error())));
    REQUIRE(c);
    config = *c;
    auto f = checkpoint::open(dir);
    INFO((f ? std::string{} : render(f.error())));
    REQUIRE(f);
    file = std::make_shared<checkpoint>(std::move(*f));
  }

  test::shard_filler filler() const {
    return [spec = config.spec, file = file](const parallel_config& par, const shard_index& idx,
                                             gpu::weight_shard& w) {
      return fill_from_checkpoint(spec, par, idx, w.table(), w.host_data(), *file);
    };
  }

  test::sharded_model load(parallel_config par, gpu::dtype type = gpu::dtype::f32) const {
    return test::sharded_model(config.spec, type, par, filler());
  }
};

/// max |a - b| / max |b|
double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

using test::run_greedy;

const std::vector<int64_t> prompt = {1, 17, 200, 33, 5, 96, 140};

}  // namespace

TEST_CASE("each Llama-family model type equals the float64 reference, prefill and 8 decode steps",
          "[llama]") {
  for (auto& [what, opts] : test::llama_variants()) {
    SECTION(what) {
      test::temp_dir dir;
      test::write_tiny_llama_folder(dir.path(), opts);
      auto ref = test::llama_reference::open(dir.path());
      std::vector<std::vector<double>> ref_logits;
      auto ref_tokens = ref.greedy(prompt, 8, &ref_logits);
      hf_model hf{dir.path()};
      auto m = hf.load({1, 1});
      auto ours = run_greedy(m, {prompt}, 8);
      CHECK(ours.tokens[0] == ref_tokens);
      REQUIRE(ours.logits.size() == ref_logits.size());
      for (size_t step = 0; step < ref_logits.size(); ++step) {
        INFO("step " << step);
        CHECK(relative_error(ours.logits[step][0], ref_logits[step]) < 1e-4);
      }
    }
  }
}

TEST_CASE("every tensor x pipeline split of a Llama model equals the unsharded one", "[llama]") {
  test::temp_dir dir;
  auto opts =
      test::llama_variants()[0].second;  // 4 query heads over 2 kv heads: TP4 replicates them
  test::write_tiny_llama_folder(dir.path(), opts);
  hf_model hf{dir.path()};
  // Rows of different lengths: left padding must not move any row's rotary positions.
  const std::vector<std::vector<int64_t>> prompts = {prompt, {3, 9, 27}, {250}};
  auto full_model = hf.load({1, 1});
  auto full = run_greedy(full_model, prompts, 4);
  for (auto par : {parallel_config{2, 1}, parallel_config{4, 1}, parallel_config{1, 2},
                   parallel_config{2, 2}}) {
    SECTION("tp " + std::to_string(par.tp) + " x pp " + std::to_string(par.pp)) {
      auto m = hf.load(par);
      auto split = run_greedy(m, prompts, 4);
      CHECK(split.tokens == full.tokens);
      for (size_t step = 0; step < full.logits.size(); ++step)
        for (size_t row = 0; row < prompts.size(); ++row) {
          INFO("step " << step << " row " << row);
          std::vector<double> want(full.logits[step][row].begin(), full.logits[step][row].end());
          CHECK(relative_error(split.logits[step][row], want) < 1e-5);
        }
    }
  }
}

TEST_CASE("a Llama vocabulary tp does not divide: every split equals the unsharded model",
          "[llama][vocab]") {
  // 251 ids (prime): the token embedding and the head (untied, and tied as Qwen2.5's
  // small models) are cut into slices of 126 or 63 rows, the last padded with zeros.
  for (auto tied : {false, true}) {
    DYNAMIC_SECTION((tied ? "tied head" : "untied head")) {
      test::temp_dir dir;
      auto opts = test::llama_variants()[tied ? 3 : 0].second;
      opts.vocab = 251;
      test::write_tiny_llama_folder(dir.path(), opts);
      hf_model hf{dir.path()};
      REQUIRE(hf.config.spec.tied_embeddings == tied);
      const std::vector<std::vector<int64_t>> prompts = {{1, 250, 200, 33}, {249, 9, 27}, {125}};
      auto full_model = hf.load({1, 1});
      auto full = run_greedy(full_model, prompts, 4);
      REQUIRE(full.logits[0][0].size() == 251);
      for (auto par : {parallel_config{2, 1}, parallel_config{4, 1}, parallel_config{2, 2}}) {
        auto m = hf.load(par);
        auto split = run_greedy(m, prompts, 4);
        INFO("tp " << par.tp << " x pp " << par.pp);
        CHECK(split.tokens == full.tokens);
        for (size_t step = 0; step < full.logits.size(); ++step)
          for (size_t row = 0; row < prompts.size(); ++row) {
            REQUIRE(split.logits[step][row].size() == 251);
            std::vector<double> want(full.logits[step][row].begin(), full.logits[step][row].end());
            CHECK(relative_error(split.logits[step][row], want) < 1e-5);
          }
      }
    }
  }
}

TEST_CASE("a batch of Llama prompts gives each prompt's own tokens", "[llama]") {
  test::temp_dir dir;
  auto opts = test::llama_variants()[4].second;  // qwen3
  test::write_tiny_llama_folder(dir.path(), opts);
  auto ref = test::llama_reference::open(dir.path());
  hf_model hf{dir.path()};
  auto m = hf.load({1, 1});
  const std::vector<std::vector<int64_t>> prompts = {prompt, {3, 9, 27}, {250}};
  auto batch = run_greedy(m, prompts, 6);
  for (size_t i = 0; i < prompts.size(); ++i) CHECK(batch.tokens[i] == ref.greedy(prompts[i], 6));
}

TEST_CASE("identical prompts share one prefill and then decode as separate rows", "[llama]") {
  test::temp_dir dir;
  test::write_tiny_llama_folder(dir.path(), test::llama_variants()[0].second);
  hf_model hf{dir.path()};
  // A prefill of {p, q, p, p}, then each row decodes its own tokens: every row's logits
  // equal that row run alone, at TP1 and at TP2 x PP2 (where later stages read the
  // expanded hidden states).
  const std::vector<std::vector<int64_t>> prompts = {prompt, {3, 9, 27}, prompt, prompt};
  // Per decode step, one token per row: the copies of p go different ways.
  const std::vector<std::vector<int64_t>> forced = {{5, 6, 7, 8}, {40, 41, 42, 43}};
  auto run = [&](test::sharded_model& m, const std::vector<std::vector<int64_t>>& rows,
                 const std::vector<std::vector<int64_t>>& steps) {
    return m.on_all_ranks([&](std::vector<decoder_stage*> chain)
                              -> caf::expected<std::vector<std::vector<std::vector<float>>>> {
      std::vector<std::vector<std::vector<float>>> out;  // per step, per row
      std::vector<kv_cache> caches(chain.size());
      for (size_t step = 0; step <= steps.size(); ++step) {
        host_tensor h;
        for (size_t s = 0; s < chain.size(); ++s) {
          auto r = step == 0 ? chain[s]->prefill(rows, s == 0 ? nullptr : &h, caches[s])
                             : chain[s]->decode(steps[step - 1], s == 0 ? nullptr : &h, caches[s]);
          if (!r) return std::move(r.error());
          h = std::move(*r);
        }
        auto f = h.to_floats();
        auto vocab = h.shape.back();
        out.emplace_back();
        for (size_t i = 0; i < rows.size(); ++i)
          out.back().emplace_back(f.begin() + static_cast<int64_t>(i) * vocab,
                                  f.begin() + static_cast<int64_t>(i + 1) * vocab);
      }
      return out;
    });
  };
  for (auto par : {parallel_config{1, 1}, parallel_config{2, 2}}) {
    auto m = hf.load(par);
    auto shared = run(m, prompts, forced);
    for (size_t row = 0; row < prompts.size(); ++row) {
      std::vector<std::vector<int64_t>> alone_steps;
      for (auto& step : forced) alone_steps.push_back({step[row]});
      auto alone = run(m, {prompts[row]}, alone_steps);
      for (size_t step = 0; step < alone.size(); ++step) {
        INFO("tp " << par.tp << " pp " << par.pp << " row " << row << " step " << step);
        std::vector<double> want(alone[step][0].begin(), alone[step][0].end());
        CHECK(relative_error(shared[step][row], want) < 1e-5);
      }
    }
  }
}

TEST_CASE("Llama catalogue shapes run from seeded weights in bf16 and split like OPT", "[llama]") {
  auto spec = find_spec("llama-tiny");
  REQUIRE(spec);
  CHECK(spec->family == model_family::llama);
  test::sharded_model full(*spec, gpu::dtype::bf16, {1, 1}, test::seeded_filler(*spec, 3));
  test::sharded_model split(*spec, gpu::dtype::bf16, {2, 2}, test::seeded_filler(*spec, 3));
  auto a = run_greedy(full, {prompt}, 3);
  auto b = run_greedy(split, {prompt}, 3);
  CHECK(a.tokens == b.tokens);
  for (auto& step : a.logits)
    for (auto& row : step)
      for (auto x : row) REQUIRE(std::isfinite(x));
}

TEST_CASE("bf16 and f16 Llama checkpoints are read and converted", "[llama]") {
  for (std::string dtype : {"bfloat16", "float16"}) {
    SECTION(dtype) {
      test::temp_dir dir;
      auto opts = test::llama_variants()[0].second;
      opts.dtype = dtype;
      test::write_tiny_llama_folder(dir.path(), opts);
      hf_model hf{dir.path()};
      CHECK(hf.config.dtype == (dtype == "bfloat16" ? "bf16" : "f16"));
      // Served in f32 on the CPU: the stored values, converted once, equal the reference's.
      auto ref = test::llama_reference::open(dir.path());
      auto m = hf.load({1, 1});
      auto ours = run_greedy(m, {prompt}, 2);
      std::vector<std::vector<double>> ref_logits;
      CHECK(ours.tokens[0] == ref.greedy(prompt, 2, &ref_logits));
      CHECK(relative_error(ours.logits[0][0], ref_logits[0]) < 1e-4);
    }
  }
}

TEST_CASE("fused residual adds, RMSNorms and rotary embeddings equal the ops one at a time",
          "[llama][norms][rope]") {
  // Every variant (biases, q/k norms, tied heads, llama3 and linear rope scaling), unsplit
  // and at TP2 x PP2, in f32 and bf16: the stage with compute_options' fused norms and
  // rotary embeddings (the host builds of engine/norms.hpp and engine/rope.hpp on the CPU)
  // against the same shards computed by libtorch ops.
  const std::vector<std::vector<int64_t>> prompts = {prompt, {3, 9, 27}, {250}};
  for (auto& [name, opts] : test::llama_variants()) {
    test::temp_dir dir;
    test::write_tiny_llama_folder(dir.path(), opts);
    hf_model hf{dir.path()};
    for (auto par : {parallel_config{1, 1}, parallel_config{2, 2}})
      for (auto type : {gpu::dtype::f32, gpu::dtype::bf16}) {
        INFO(name << " tp " << par.tp << " pp " << par.pp << " " << gpu::to_string(type));
        auto fused = hf.load(par, type);
        auto plain = hf.load(par, type);
        for (int s = 0; s < par.pp; ++s)
          for (int r = 0; r < par.tp; ++r) {
            auto i = static_cast<size_t>(s * par.tp + r);
            auto st = decoder_stage::create(plain.spec, par, {r, s}, *plain.shards[i],
                                            *plain.groups[i], {}, compute_options{false, false});
            REQUIRE(st);
            plain.stages[i] = std::move(*st);
          }
        auto a = run_greedy(fused, prompts, 5);
        auto b = run_greedy(plain, prompts, 5);
        // f32: the mean square's sum in another order, an ulp or so; bf16: a row's element
        // may round to the neighbouring value, and the layers carry it on.
        const double tolerance = type == gpu::dtype::f32 ? 1e-5 : 3e-2;
        for (size_t step = 0; step < b.logits.size(); ++step)
          for (size_t row = 0; row < prompts.size(); ++row) {
            std::vector<double> want(b.logits[step][row].begin(), b.logits[step][row].end());
            CHECK(relative_error(a.logits[step][row], want) < tolerance);
          }
        if (type == gpu::dtype::f32) CHECK(a.tokens == b.tokens);
        // The fused builds ran on every stage (not the ops' fallback), and only there.
        for (size_t i = 0; i < fused.stages.size(); ++i) {
          CHECK(fused.stages[i]->fused_calls() > 0);
          CHECK(plain.stages[i]->fused_calls() == 0);
        }
      }
  }
}
