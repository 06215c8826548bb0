// LoRA adapters in the forward pass (decoder_stage::attach_adapter, prefill's adapters):
// the base's weights plus an attached adapter give the logits and tokens of the base with
// the adapter merged into its weights (W + scale B A, computed here from the PEFT folder's
// raw tensors and the seeded base, not through read_lora_adapter or slice_lora_adapter),
// run without adapters. Both families (and a Llama with Qwen2's q/k/v biases and Qwen3's
// q/k norms), tp 1, tp 2 and tp 2 x pp 2, prefill and decode, batches mixing up to 8
// adapters with base rows, chunked prefill, rows leaving and joining, identical prompts under
// different adapters, rsLoRA and a subset of targets, and the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "models/lora_adapter.hpp"
#include "models/weights.hpp"
#include "tests/support/peft_folder.hpp"
#include "tests/support/sharded_model.hpp"

using namespace computron;
using namespace computron::models;
using computron::test::relative_error;

namespace {

constexpr uint64_t base_seed = 7;

/// Agreement of f32 logits computed two ways (a merged weight against the base's product
/// plus the adapter's, sums in another order): rounding, never a missing term.
constexpr double tight = 2e-5;

/// Llama with Qwen2's q/k/v biases and Qwen3's per-head q/k norms.
decoder_spec tiny_qwen() {
  auto s = test::tiny_llama();
  s.name = "lora-qwen";
  s.qkv_bias = true;
  s.qk_norm = true;
  return s;
}

/// A folder of rank `r` whose scale is small beside the seeded weights (0.05), so the
/// adapted model is a perturbed base, as a trained adapter is, and its tokens still differ.
test::peft_folder folder(const decoder_spec& base, uint32_t seed, int64_t r = 4,
                         std::vector<std::string> projs = {}, bool rslora = false) {
  const double alpha = rslora ? 0.03 : 0.06;
  auto f = test::make_folder(base, r, alpha, std::move(projs), gpu::dtype::f32, seed * 1000);
  f.config["use_rslora"] = rslora;
  f.write();
  return f;
}

/// The base parameter a PEFT tensor adapts, by its name alone:
/// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" ->
/// "layers.0.self_attn.q_proj.weight" (OPT: "model.decoder.layers...").
std::string adapted_param(const std::string& tensor) {
  auto s = tensor;
  for (std::string prefix : {"base_model.model.", "model.decoder.", "model."})
    if (s.rfind(prefix, 0) == 0) s = s.substr(prefix.size());
  auto at = s.find(".lora_");
  REQUIRE(at != std::string::npos);
  return s.substr(0, at) + ".weight";
}

/// The seeded base with `f` merged into its weights: W + scale B A per adapted module,
/// summed in double, scale = alpha / r (rsLoRA: alpha / sqrt(r)) from the folder's config.
/// One shard (tp 1, pp 1): the reference is never split.
test::shard_filler merged_filler(const decoder_spec& spec, const test::peft_folder* f) {
  return [spec, f](const parallel_config& par, const shard_index& idx,
                   gpu::weight_shard& w) -> caf::error {
    REQUIRE(par.tp == 1);
    REQUIRE(par.pp == 1);
    if (auto err = fill_seeded(spec, par, idx, w.table(), w.host_data(), base_seed)) return err;
    if (f == nullptr) return {};
    const auto r = f->config["r"].get<int64_t>();
    const auto alpha = f->config["lora_alpha"].get<double>();
    const auto scale = f->config.value("use_rslora", false)
                           ? alpha / std::sqrt(static_cast<double>(r))
                           : alpha / static_cast<double>(r);
    int merged = 0;
    for (auto& a : f->tensors) {
      if (a.name.find(".lora_A.") == std::string::npos) continue;
      auto b_name = a.name;
      b_name.replace(b_name.find(".lora_A."), 8, ".lora_B.");
      auto& b = f->find(b_name);
      auto* e = w.table().find(adapted_param(a.name));
      REQUIRE(e != nullptr);
      REQUIRE(e->type == gpu::dtype::f32);
      const auto out = e->shape[0], in = e->shape[1];
      REQUIRE(a.shape == std::vector<int64_t>{r, in});
      REQUIRE(b.shape == std::vector<int64_t>{out, r});
      auto* W = reinterpret_cast<float*>(w.host_data() + e->offset_bytes);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double d = 0;
          for (int64_t k = 0; k < r; ++k)
            d += static_cast<double>(b.values[static_cast<size_t>(o * r + k)]) *
                 a.values[static_cast<size_t>(k * in + i)];
          W[o * in + i] = static_cast<float>(W[o * in + i] + scale * d);
        }
      ++merged;
    }
    REQUIRE(merged > 0);
    return {};
  };
}

test::sharded_model merged_model(const decoder_spec& spec, const test::peft_folder* f) {
  return test::sharded_model(spec, gpu::dtype::f32, {1, 1}, merged_filler(spec, f));
}

/// Adapter shards attached to stages: kept here, so that they outlive the attachment.
using adapter_shards = std::vector<std::unique_ptr<gpu::weight_shard>>;

/// One stage's slice of `a` in a loaded weight shard on the stage's device.
std::unique_ptr<gpu::weight_shard> adapter_shard(test::sharded_model& m, size_t stage,
                                                 const lora_adapter& a,
                                                 gpu::dtype type = gpu::dtype::f32,
                                                 parallel_config par = {0, 0},
                                                 shard_index idx = {-1, -1}) {
  if (par.tp == 0) par = m.par;
  if (idx.tp_rank < 0)
    idx = {static_cast<int>(stage) % m.par.tp, static_cast<int>(stage) / m.par.tp};
  auto slice = slice_lora_adapter(a, par, idx, type);
  INFO((slice ? std::string{} : render(slice.error())));
  REQUIRE(slice);
  auto w = gpu::weight_shard::create(m.devices[stage], slice->table);
  REQUIRE(w);
  std::memcpy((*w)->host_data(), slice->host.data(), slice->host.size());
  REQUIRE_FALSE((*w)->load({1ull << 20}));
  REQUIRE_FALSE((*w)->wait_loaded(std::chrono::seconds(30)));
  return std::move(*w);
}

lora_adapter read(const test::peft_folder& f, const decoder_spec& spec) {
  auto a = read_lora_adapter(f.dir->path(), spec);
  INFO((a ? std::string{} : render(a.error())));
  REQUIRE(a);
  return std::move(*a);
}

/// Reads `f` and attaches it as `id` to every stage of `m`.
void attach(test::sharded_model& m, adapter_shards& keep, int64_t id, const test::peft_folder& f) {
  auto a = read(f, m.spec);
  for (size_t i = 0; i < m.stages.size(); ++i) {
    keep.push_back(adapter_shard(m, i, a));
    auto err = m.stages[i]->attach_adapter(id, *keep.back(), a.config.rank);
    INFO((err ? render(err) : std::string{}));
    REQUIRE_FALSE(err);
  }
}

using test::decode_chain;
using test::greedy_run;
using test::take_greedy;

/// Row `row` of `got` against row `want_row` of `want`: the same tokens, logits within
/// `tol` at every step.
void check_row(const greedy_run& got, size_t row, const greedy_run& want, size_t want_row,
               double tol = tight) {
  INFO("row " << row);
  CHECK(got.tokens[row] == want.tokens[want_row]);
  REQUIRE(got.logits.size() == want.logits.size());
  for (size_t step = 0; step < want.logits.size(); ++step) {
    INFO("step " << step);
    CHECK(relative_error(got.logits[step][row], want.logits[step][want_row]) < tol);
  }
}

/// The largest relative difference between two runs' logits of one row over every step:
/// what an adapter changes (a test that expects a change asserts it is far above `tight`).
double change(const greedy_run& a, size_t row_a, const greedy_run& b, size_t row_b) {
  double most = 0;
  for (size_t step = 0; step < a.logits.size() && step < b.logits.size(); ++step)
    most = std::max(most, relative_error(a.logits[step][row_a], b.logits[step][row_b]));
  return most;
}

const std::vector<std::vector<int64_t>> prompts = {
    {1, 17, 20, 33, 5, 9, 14}, {3, 9, 27}, {25}, {2, 30, 11, 8, 39}};

std::string split_name(parallel_config par) {
  return "tp " + std::to_string(par.tp) + " x pp " + std::to_string(par.pp);
}

}  // namespace

TEST_CASE("an attached adapter gives its merged model's logits and tokens, every family and split",
          "[lora][forward]") {
  for (auto spec : {test::tiny_llama(), tiny_qwen(), test::tiny_opt()}) {
    for (auto par : {parallel_config{1, 1}, parallel_config{2, 1}, parallel_config{2, 2}}) {
      DYNAMIC_SECTION(spec.name << " " << split_name(par)) {
        auto f = folder(spec, 1);
        auto merged = merged_model(spec, &f);
        auto want = test::run_greedy(merged, prompts, 6);
        auto base = merged_model(spec, nullptr);
        auto plain = test::run_greedy(base, prompts, 6);

        test::sharded_model m(spec, gpu::dtype::f32, par, test::seeded_filler(spec, base_seed));
        adapter_shards keep;
        attach(m, keep, 1, f);
        auto got = test::run_greedy(m, prompts, 6, std::vector<int64_t>(prompts.size(), 1));
        for (size_t row = 0; row < prompts.size(); ++row) {
          check_row(got, row, want, row);
          // The adapter matters: its rows are far from the base's.
          CHECK(change(got, row, plain, row) > 1e-2);
        }
        // Without adapter ids the same stages run the base, bit for bit as a stage that
        // never had one (the step without adapter rows runs the plain projections).
        auto again = test::run_greedy(m, prompts, 6);
        test::sharded_model fresh(spec, gpu::dtype::f32, par, test::seeded_filler(spec, base_seed));
        CHECK(again == test::run_greedy(fresh, prompts, 6));
        for (size_t row = 0; row < prompts.size(); ++row) check_row(again, row, plain, row);
      }
    }
  }
}

TEST_CASE("generate runs each prompt with its adapter", "[lora][forward]") {
  auto spec = test::tiny_llama();
  auto f = folder(spec, 2);
  auto merged = merged_model(spec, &f);
  test::sharded_model m(spec, gpu::dtype::f32, {1, 1}, test::seeded_filler(spec, base_seed));
  adapter_shards keep;
  attach(m, keep, 5, f);
  generate_options opts;
  opts.max_tokens = 6;
  auto want = generate(merged.chain(0), prompts, opts);
  REQUIRE(want);
  auto plain = generate(m.chain(0), prompts, opts);
  REQUIRE(plain);
  opts.adapters.assign(prompts.size(), 5);
  opts.adapters[1] = 0;
  auto got = generate(m.chain(0), prompts, opts);
  REQUIRE(got);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    CHECK((*got)[i] == (i == 1 ? (*plain)[i] : (*want)[i]));
  }
  // The adapter changes some prompt's tokens, so the check above can tell them apart.
  CHECK(*want != *plain);
  opts.adapters.pop_back();
  auto wrong = generate(m.chain(0), prompts, opts);
  REQUIRE_FALSE(wrong);
  CHECK(is(wrong.error(), ec::invalid_request));
}

TEST_CASE("a batch mixing 8 adapters and base rows gives every row its own model's output",
          "[lora][forward][mixed]") {
  const auto spec = test::tiny_llama();
  // Rows: adapters 1..8, two base rows, adapter 3 twice (once on another prompt), lengths
  // from 1 to 7 tokens.
  const std::vector<int64_t> ids = {1, 2, 0, 3, 4, 5, 6, 3, 7, 0, 8};
  std::vector<std::vector<int64_t>> ps;
  for (size_t i = 0; i < ids.size(); ++i) ps.push_back(prompts[i % prompts.size()]);
  ps[7] = {4, 4, 12, 36, 1, 0};
  std::vector<test::peft_folder> folders;
  for (uint32_t a = 1; a <= 8; ++a) folders.push_back(folder(spec, 10 + a));
  // Each row alone through its own merged model (the base for id 0).
  std::vector<greedy_run> want;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto* f = ids[i] == 0 ? nullptr : &folders[static_cast<size_t>(ids[i] - 1)];
    auto merged = merged_model(spec, f);
    want.push_back(test::run_greedy(merged, {ps[i]}, 5));
  }
  for (auto par : {parallel_config{1, 1}, parallel_config{2, 1}}) {
    DYNAMIC_SECTION(split_name(par)) {
      test::sharded_model m(spec, gpu::dtype::f32, par, test::seeded_filler(spec, base_seed));
      adapter_shards keep;
      for (int64_t a = 1; a <= 8; ++a) attach(m, keep, a, folders[static_cast<size_t>(a - 1)]);
      auto got = test::run_greedy(m, ps, 5, ids);
      for (size_t i = 0; i < ids.size(); ++i) {
        INFO("adapter " << ids[i]);
        check_row(got, i, want[i], 0);
      }
      // Distinct adapters give distinct outputs on one prompt (rows 0 and 4 share theirs).
      REQUIRE(ps[0] == ps[4]);
      CHECK(change(got, 0, got, 4) > 1e-2);
    }
  }
}

TEST_CASE("an adapter id attached again with other weights runs them in a mixed batch",
          "[lora][forward][mixed]") {
  // A mixed batch's adapters are stacked once and kept while the same ones run: an id
  // detached and attached again (vLLM's load_inplace), likely at the same address, must not
  // run the stacks of its old weights (the engine gives a reloaded adapter a new id; the
  // stage does not count on it).
  const auto spec = test::tiny_llama();
  auto one = folder(spec, 21), two = folder(spec, 22), other = folder(spec, 23);
  const std::vector<int64_t> ids = {1, 2, 0};
  const std::vector<std::vector<int64_t>> ps = {prompts[0], prompts[1], prompts[2]};
  auto alone = [&](const test::peft_folder* f, size_t row) {
    auto merged = merged_model(spec, f);
    return test::run_greedy(merged, {ps[row]}, 4);
  };
  test::sharded_model m(spec, gpu::dtype::f32, {1, 1}, test::seeded_filler(spec, base_seed));
  adapter_shards keep;
  attach(m, keep, 1, one);
  attach(m, keep, 2, two);
  auto before = test::run_greedy(m, ps, 4, ids);
  check_row(before, 1, alone(&two, 1), 0);
  const auto old_at = keep.back()->device_data();
  REQUIRE(old_at);
  REQUIRE_FALSE(m.stages[0]->detach_adapter(2));
  keep.pop_back();  // adapter 2's pages are free for the next shard
  attach(m, keep, 2, other);
  // The new weights at the old address: only the detach can tell the kept stacks apart.
  const auto new_at = keep.back()->device_data();
  REQUIRE(new_at);
  REQUIRE(*new_at == *old_at);
  auto after = test::run_greedy(m, ps, 4, ids);
  check_row(after, 0, alone(&one, 0), 0);
  check_row(after, 1, alone(&other, 1), 0);
  check_row(after, 2, alone(nullptr, 2), 0);
  CHECK(change(before, 1, after, 1) > 1e-2);
}

TEST_CASE("an OPT batch mixing adapters and base rows at tp 2 gives every row its own output",
          "[lora][forward][mixed]") {
  const auto spec = test::tiny_opt();
  const std::vector<int64_t> ids = {2, 0, 1, 2};
  std::vector<test::peft_folder> folders{folder(spec, 21), folder(spec, 22)};
  test::sharded_model m(spec, gpu::dtype::f32, {2, 1}, test::seeded_filler(spec, base_seed));
  adapter_shards keep;
  attach(m, keep, 1, folders[0]);
  attach(m, keep, 2, folders[1]);
  auto got = test::run_greedy(m, prompts, 5, ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto merged = merged_model(spec, ids[i] == 0 ? nullptr : &folders[ids[i] - 1]);
    INFO("adapter " << ids[i]);
    check_row(got, i, test::run_greedy(merged, {prompts[i]}, 5), 0);
  }
}

TEST_CASE("identical prompts share a prefill only under the same adapter", "[lora][forward]") {
  const auto spec = test::tiny_llama();
  auto f1 = folder(spec, 31), f2 = folder(spec, 32);
  test::sharded_model m(spec, gpu::dtype::f32, {1, 1}, test::seeded_filler(spec, base_seed));
  adapter_shards keep;
  attach(m, keep, 1, f1);
  attach(m, keep, 2, f2);
  // 20 tokens: two KV blocks per distinct prefill.
  std::vector<int64_t> p;
  for (int64_t i = 0; i < 20; ++i) p.push_back((i * 7 + 3) % 40);
  const std::vector<std::vector<int64_t>> ps(5, p);
  const std::vector<int64_t> ids = {1, 2, 0, 1, 0};
  auto* stage = m.stages[0].get();
  kv_cache cache;
  auto out = stage->prefill(ps, nullptr, cache, {}, {}, ids);
  REQUIRE(out);
  CHECK(cache.adapters() == ids);
  // Three distinct (adapter, prompt) prefills, each of 2 blocks; the repeats share theirs.
  CHECK(cache.blocks() == 6);
  auto logits = out->to_floats();
  const auto vocab = out->shape.back();
  auto row = [&](size_t i) {
    return std::vector<float>(logits.begin() + static_cast<int64_t>(i) * vocab,
                              logits.begin() + static_cast<int64_t>(i + 1) * vocab);
  };
  CHECK(row(0) == row(3));
  CHECK(row(2) == row(4));
  CHECK(relative_error(row(0), row(1)) > 1e-2);
  CHECK(relative_error(row(0), row(2)) > 1e-2);
  CHECK(relative_error(row(1), row(2)) > 1e-2);
  for (auto [i, f] : {std::pair<size_t, test::peft_folder*>{0, &f1}, {1, &f2}, {2, nullptr}}) {
    auto merged = merged_model(spec, f);
    auto want = test::run_greedy(merged, {p}, 1);
    INFO("row " << i);
    CHECK(relative_error(row(i), want.logits[0][0]) < tight);
  }
  // Decoding after the shared prefill keeps each row on its adapter.
  auto next = stage->decode({5, 5, 5, 5, 5}, nullptr, cache);
  REQUIRE(next);
  auto d = next->to_floats();
  CHECK(std::equal(d.begin(), d.begin() + vocab, d.begin() + 3 * vocab));
  CHECK(relative_error(std::vector<float>(d.begin(), d.begin() + vocab),
                       std::vector<float>(d.begin() + vocab, d.begin() + 2 * vocab)) > 1e-2);
}

TEST_CASE("a chunked prefill runs its rows' adapters, and rows keep them as they leave and join",
          "[lora][forward][chunked]") {
  const auto spec = test::tiny_llama();
  auto f1 = folder(spec, 41), f2 = folder(spec, 42);
  const std::vector<int64_t> ids = {1, 0, 2, 1};
  for (auto par : {parallel_config{1, 1}, parallel_config{2, 2}}) {
    DYNAMIC_SECTION(split_name(par)) {
      test::sharded_model m(spec, gpu::dtype::f32, par, test::seeded_filler(spec, base_seed));
      adapter_shards keep;
      attach(m, keep, 1, f1);
      attach(m, keep, 2, f2);
      auto whole = test::run_greedy(m, prompts, 4, ids);
      // The same batch in chunks of 3 (7 tokens: chunks leave 4, 1, then 0), decode after;
      // the second chunk repeats the adapters, the third leaves them out.
      auto chunked =
          m.on_all_ranks([&](std::vector<decoder_stage*> chain) -> caf::expected<greedy_run> {
            greedy_run out;
            out.tokens.resize(prompts.size());
            std::vector<kv_cache> caches(chain.size());
            std::vector<int64_t> next(prompts.size());
            const std::vector<std::pair<int64_t, int64_t>> steps = {{4, 3}, {1, 3}, {0, 1}};
            for (size_t c = 0; c < steps.size(); ++c) {
              host_tensor h;
              for (size_t s = 0; s < chain.size(); ++s) {
                auto r = chain[s]->prefill_chunk(prompts, steps[c].first, steps[c].second,
                                                 s == 0 ? nullptr : &h, caches[s], {},
                                                 c == 2 ? std::vector<int64_t>{} : ids);
                if (!r) return std::move(r.error());
                h = std::move(*r);
              }
              if (c == 2) take_greedy(h, out, next);
            }
            for (auto& c : caches)
              if (c.adapters() != ids) return make_error(ec::invalid_state, "adapters lost");
            for (int step = 1; step < 4; ++step) {
              auto h = decode_chain(chain, next, caches);
              if (!h) return std::move(h.error());
              take_greedy(*h, out, next);
            }
            return out;
          });
      for (size_t i = 0; i < prompts.size(); ++i) check_row(chunked, i, whole, i);

      // Rows leave (keep_rows, one repeated) and join (append): each keeps its adapter, so
      // the next decode step gives each row what the whole batch's next step gave it.
      auto joined =
          m.on_all_ranks([&](std::vector<decoder_stage*> chain) -> caf::expected<greedy_run> {
            std::vector<kv_cache> caches(chain.size()), other(chain.size());
            const std::vector<std::vector<int64_t>> first = {prompts[0], prompts[1]};
            const std::vector<std::vector<int64_t>> second = {prompts[2], prompts[3]};
            host_tensor h, g;
            for (size_t s = 0; s < chain.size(); ++s) {
              auto r = chain[s]->prefill(first, s == 0 ? nullptr : &h, caches[s], {}, {},
                                         {ids[0], ids[1]});
              if (!r) return std::move(r.error());
              h = std::move(*r);
              auto q = chain[s]->prefill(second, s == 0 ? nullptr : &g, other[s], {}, {},
                                         {ids[2], ids[3]});
              if (!q) return std::move(q.error());
              g = std::move(*q);
            }
            for (size_t s = 0; s < chain.size(); ++s) {
              if (auto err = caches[s].append(std::move(other[s]))) return err;
              // Rows 3, 0, 2, 0: adapters 1, 1, 2, 1.
              if (auto err = caches[s].keep_rows({3, 0, 2, 0})) return err;
              if (caches[s].adapters() != std::vector<int64_t>{1, 1, 2, 1})
                return make_error(ec::invalid_state, "keep_rows or append lost an adapter");
            }
            // Each kept row's first generated token (the whole batch's), one decode step.
            std::vector<int64_t> next;
            for (auto r : {3, 0, 2, 0}) next.push_back(whole.tokens[static_cast<size_t>(r)][0]);
            greedy_run out;
            out.tokens.resize(next.size());
            auto d = decode_chain(chain, next, caches);
            if (!d) return std::move(d.error());
            take_greedy(*d, out, next);
            return out;
          });
      size_t k = 0;
      for (auto r : {3, 0, 2, 0}) {
        INFO("kept row " << k << " (row " << r << ")");
        CHECK(relative_error(joined.logits[0][k], whole.logits[1][static_cast<size_t>(r)]) < tight);
        CHECK(joined.tokens[k][0] == whole.tokens[static_cast<size_t>(r)][1]);
        ++k;
      }
    }
  }
}

TEST_CASE("rsLoRA's scale and a subset of targets give the merged model's output",
          "[lora][forward]") {
  for (auto spec : {test::tiny_llama(), test::tiny_opt()}) {
    for (bool rslora : {false, true}) {
      DYNAMIC_SECTION(spec.name << (rslora ? " rsLoRA" : " alpha / r") << " q_proj, v_proj") {
        auto f = folder(spec, 51, 8, {"q_proj", "v_proj"}, rslora);
        auto a = read(f, spec);
        REQUIRE(a.modules.size() == 4);  // q and v of 2 layers
        auto merged = merged_model(spec, &f);
        auto want = test::run_greedy(merged, prompts, 4);
        test::sharded_model m(spec, gpu::dtype::f32, {2, 1}, test::seeded_filler(spec, base_seed));
        adapter_shards keep;
        attach(m, keep, 3, f);
        auto got = test::run_greedy(m, prompts, 4, {3, 3, 0, 3});
        auto base = merged_model(spec, nullptr);
        auto plain = test::run_greedy(base, prompts, 4);
        for (size_t row = 0; row < prompts.size(); ++row)
          check_row(got, row, row == 2 ? plain : want, row);
        CHECK(change(got, 0, plain, 0) > 1e-2);
      }
    }
  }
}

TEST_CASE("attach refuses tables that are not this stage's adapter, naming what is wrong",
          "[lora][errors]") {
  const auto spec = test::tiny_llama();
  auto f = folder(spec, 61);
  auto a = read(f, spec);
  test::sharded_model m(spec, gpu::dtype::f32, {2, 2}, test::seeded_filler(spec, base_seed));
  auto& stage = *m.stages[0];  // tp rank 0 of stage 0 (layer 0)
  auto good = adapter_shard(m, 0, a);
  auto refusal = [&](gpu::weight_shard& w, int64_t id, int64_t rank, ec code) {
    auto err = stage.attach_adapter(id, w, rank);
    REQUIRE(err);
    CHECK(is(err, code));
    return render(err);
  };
  CHECK_THAT(refusal(*good, 0, 4, ec::invalid_request), Catch::Contains("positive"));
  CHECK_THAT(refusal(*good, -2, 4, ec::invalid_request), Catch::Contains("positive"));
  CHECK_THAT(refusal(*good, 1, 0, ec::invalid_request), Catch::Contains("rank 0"));
  // r other than the tables'.
  CHECK_THAT(refusal(*good, 1, 8, ec::invalid_configuration), Catch::Contains("r 8"));
  // Another pipeline stage's slice (layer 1).
  auto later = adapter_shard(m, 0, a, gpu::dtype::f32, {2, 2}, {0, 1});
  CHECK_THAT(refusal(*later, 1, 4, ec::invalid_configuration),
             Catch::Contains("layer 1, outside this stage's layers [0, 1)"));
  // Another tensor-parallel degree's slice: q_proj's B holds all 24 rows, not 12.
  auto whole = adapter_shard(m, 0, a, gpu::dtype::f32, {1, 2}, {0, 0});
  CHECK_THAT(refusal(*whole, 1, 4, ec::invalid_configuration), Catch::Contains("q_proj"));
  // Another dtype than the stage's.
  auto half = adapter_shard(m, 0, a, gpu::dtype::bf16);
  CHECK_THAT(refusal(*half, 1, 4, ec::invalid_configuration), Catch::Contains("bf16"));
  // Another base: OPT's q_proj has 16 outputs, this Llama's 24.
  auto opt = test::tiny_opt();
  auto of = folder(opt, 62);
  auto other = adapter_shard(m, 0, read(of, opt), gpu::dtype::f32, {2, 2}, {0, 0});
  CHECK_THAT(refusal(*other, 1, 4, ec::invalid_configuration),
             Catch::Contains("q_proj.lora_B") && Catch::Contains("[8 x 4]") &&
                 Catch::Contains("needs [12 x 4]"));
  // Tables written by hand: a name no projection of this stage has, a tensor that is no
  // A or B, an A without its B.
  auto table_of = [&](std::vector<std::pair<std::string, std::vector<int64_t>>> tensors) {
    gpu::tensor_table t;
    for (auto& [name, shape] : tensors) REQUIRE_FALSE(t.add(name, gpu::dtype::f32, shape));
    auto w = gpu::weight_shard::create(m.devices[0], t);
    REQUIRE(w);
    return std::move(*w);
  };
  auto fc1 = table_of({{"layers.0.fc1.lora_A", {4, 16}}, {"layers.0.fc1.lora_B", {20, 4}}});
  CHECK_THAT(refusal(*fc1, 1, 4, ec::invalid_configuration),
             Catch::Contains("'layers.0.fc1.lora_A' adapts no projection"));
  auto plain = table_of({{"layers.0.self_attn.q_proj.weight", {12, 16}}});
  CHECK_THAT(refusal(*plain, 1, 4, ec::invalid_configuration), Catch::Contains("no LoRA A or B"));
  auto lone = table_of({{"layers.0.mlp.up_proj.lora_A", {4, 16}}});
  CHECK_THAT(refusal(*lone, 1, 4, ec::invalid_configuration),
             Catch::Contains("layers.0.mlp.up_proj has lora_A without lora_B"));
  // A shard on another device than the stage's weights.
  auto slice = slice_lora_adapter(a, {2, 2}, {0, 0});
  REQUIRE(slice);
  auto elsewhere = gpu::weight_shard::create(test::emulated_device(9), slice->table);
  REQUIRE(elsewhere);
  CHECK_THAT(refusal(**elsewhere, 1, 4, ec::invalid_configuration),
             Catch::Contains("another device"));
  // None of the refused ids was attached; the good table attaches once.
  CHECK(stage.adapters().empty());
  REQUIRE_FALSE(stage.attach_adapter(1, *good, 4));
  CHECK_THAT(refusal(*good, 1, 4, ec::invalid_request), Catch::Contains("attached already"));
  CHECK(stage.adapters() == std::vector<int64_t>{1});
}

TEST_CASE("rows name attached adapters: unknown ids are refused and a detached one fails the step",
          "[lora][errors]") {
  const auto spec = test::tiny_opt();
  auto f = folder(spec, 71);
  auto merged = merged_model(spec, &f);
  test::sharded_model m(spec, gpu::dtype::f32, {1, 1}, test::seeded_filler(spec, base_seed));
  adapter_shards keep;
  attach(m, keep, 4, f);
  auto& stage = *m.stages[0];
  const std::vector<std::vector<int64_t>> ps = {prompts[0], prompts[1]};
  kv_cache cache;
  auto unknown = stage.prefill(ps, nullptr, cache, {}, {}, {4, 9});
  REQUIRE_FALSE(unknown);
  CHECK(is(unknown.error(), ec::invalid_request));
  CHECK_THAT(render(unknown.error()),
             Catch::Contains("adapter 9") && Catch::Contains("not attached"));
  auto negative = stage.prefill(ps, nullptr, cache, {}, {}, {-1, 0});
  REQUIRE_FALSE(negative);
  CHECK(is(negative.error(), ec::invalid_request));
  auto short_list = stage.prefill(ps, nullptr, cache, {}, {}, {4});
  REQUIRE_FALSE(short_list);
  CHECK_THAT(render(short_list.error()), Catch::Contains("1 adapter ids for a batch of 2"));
  auto chunk = stage.prefill_chunk(ps, 0, 7, nullptr, cache, {}, {9, 0});
  REQUIRE_FALSE(chunk);
  CHECK_THAT(render(chunk.error()), Catch::Contains("adapter 9"));

  auto first = stage.prefill(ps, nullptr, cache, {}, {}, {4, 0});
  REQUIRE(first);
  auto want = test::run_greedy(merged, {ps[0]}, 1);
  auto got = first->to_floats();
  CHECK(relative_error(std::vector<float>(got.begin(), got.begin() + spec.vocab),
                       want.logits[0][0]) < tight);
  REQUIRE_FALSE(stage.detach_adapter(4));
  CHECK(stage.adapters().empty());
  keep.clear();  // the adapter's memory is gone: the stage must not read it
  const auto lengths = cache.lengths();
  auto next = stage.decode({3, 3}, nullptr, cache);
  REQUIRE_FALSE(next);
  CHECK(is(next.error(), ec::invalid_request));
  CHECK_THAT(render(next.error()),
             Catch::Contains("adapter 4") && Catch::Contains("no longer attached"));
  CHECK(cache.lengths() == lengths);  // the failed step changed nothing
  auto twice = stage.detach_adapter(4);
  REQUIRE(twice);
  CHECK_THAT(render(twice), Catch::Contains("not attached"));
  // The base row alone still decodes.
  REQUIRE_FALSE(cache.keep_rows({1}));
  CHECK(cache.adapters() == std::vector<int64_t>{0});
  CHECK(stage.decode({3}, nullptr, cache));
}

TEST_CASE("a later prefill chunk may not change its rows' adapters", "[lora][errors][chunked]") {
  const auto spec = test::tiny_llama();
  auto f = folder(spec, 81);
  test::sharded_model m(spec, gpu::dtype::f32, {1, 1}, test::seeded_filler(spec, base_seed));
  adapter_shards keep;
  attach(m, keep, 1, f);
  auto& stage = *m.stages[0];
  kv_cache cache;
  REQUIRE(stage.prefill_chunk(prompts, 4, 3, nullptr, cache, {}, {1, 0, 1, 0}));
  const auto lengths = cache.lengths();
  auto changed = stage.prefill_chunk(prompts, 1, 3, nullptr, cache, {}, {1, 1, 1, 0});
  REQUIRE_FALSE(changed);
  CHECK(is(changed.error(), ec::invalid_request));
  CHECK_THAT(render(changed.error()), Catch::Contains("prompt 1 with adapter 1") &&
                                          Catch::Contains("first chunk set adapter 0"));
  CHECK(cache.lengths() == lengths);
  CHECK(cache.adapters() == std::vector<int64_t>{1, 0, 1, 0});
  REQUIRE(stage.prefill_chunk(prompts, 1, 3, nullptr, cache, {}, {}));
}
