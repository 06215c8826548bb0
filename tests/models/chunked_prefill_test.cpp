// Chunked prefill (decoder_stage::prefill_chunk): prompts of different lengths computed a
// few tokens per step give the one-step prefill's logits and the same greedy decode, at
// one shard and at a tensor x pipeline split; a chunked batch joins a running batch whose
// decode steps went between its chunks; a bad chunk is an error that changes nothing.
// OPT (learned positions) and Llama (rotary, grouped queries: 4 heads over 2 kv heads).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "tests/support/sharded_model.hpp"

using namespace computron;
using namespace computron::models;
using computron::test::relative_error;

namespace {

/// A prompt of `n` ids from `seed`.
std::vector<int64_t> prompt(size_t n, int64_t seed) {
  std::vector<int64_t> p{2};
  for (size_t i = 1; i < n; ++i) p.push_back(3 + (seed * 131 + static_cast<int64_t>(i) * 37) % 500);
  return p;
}

/// 5, 23 and 40 tokens: the chunks of 7 end mid-block and cross the 16-token blocks, and
/// the short prompts compute nothing in the first chunks (the 5-token one before the last).
const std::vector<std::vector<int64_t>> prompts = {prompt(5, 1), prompt(23, 2), prompt(40, 3)};

caf::error wrong(std::string what) {
  return make_error(ec::invalid_request, std::move(what));
}

/// How a batch's prompts are cut: (left, chunk) of each step.
using schedule = std::vector<std::pair<int64_t, int64_t>>;

/// Chunks of `chunk` with `left` a multiple of it, so the first chunk is the short one.
schedule even_chunks(int64_t longest, int64_t chunk) {
  schedule s;
  for (auto left = (longest + chunk - 1) / chunk * chunk - chunk; left >= 0; left -= chunk)
    s.emplace_back(left, chunk);
  return s;
}

/// Chunks of `chunk` from the start, the last one short.
schedule short_last(int64_t longest, int64_t chunk) {
  schedule s;
  auto left = longest;
  while (left > 0) {
    auto c = std::min(chunk, left);
    left -= c;
    s.emplace_back(left, c);
  }
  return s;
}

int64_t longest(const std::vector<std::vector<int64_t>>& ps) {
  size_t n = 0;
  for (auto& p : ps) n = std::max(n, p.size());
  return static_cast<int64_t>(n);
}

/// One chunk through the chain. Checks what every stage answers (hidden states [b, t,
/// hidden] between stages; on the last, nothing before the last chunk) and what the caches
/// hold after (each row its tokens so far, the pool's blocks exactly the rows' and those of
/// the batch `beside`, a running batch of the same stages).
caf::expected<host_tensor> chunk_step(const std::vector<decoder_stage*>& chain,
                                      std::vector<kv_cache>& caches,
                                      const std::vector<std::vector<int64_t>>& ps, int64_t left,
                                      int64_t chunk,
                                      const std::vector<kv_cache>* beside = nullptr) {
  host_tensor h;
  int64_t t = 0;
  std::vector<int64_t> want;
  for (auto& p : ps) {
    auto n = static_cast<int64_t>(p.size());
    want.push_back(std::max<int64_t>(0, n - left));
    t = std::max(t, std::max<int64_t>(0, n - left) - std::max<int64_t>(0, n - left - chunk));
  }
  for (size_t s = 0; s < chain.size(); ++s) {
    auto r = chain[s]->prefill_chunk(ps, left, chunk, s == 0 ? nullptr : &h, caches[s]);
    if (!r) return r;
    h = std::move(*r);
    if (s + 1 < chain.size() &&
        (h.shape.size() != 3 || h.shape[0] != static_cast<int64_t>(ps.size()) || h.shape[1] != t))
      return wrong(fmt::format("stage {} answered [{}]", s, fmt::join(h.shape, ", ")));
    if (s + 1 == chain.size() && left > 0 && (!h.shape.empty() || !h.bytes.empty()))
      return wrong("a chunk before the last answered logits");
    if (caches[s].lengths() != want)
      return wrong(fmt::format("stage {} holds [{}] after the chunk leaving {}, not [{}]", s,
                               fmt::join(caches[s].lengths(), ", "), left, fmt::join(want, ", ")));
    int64_t blocks = 0;
    for (auto n : want) blocks += kv_blocks_for(n);
    const auto others = beside ? (*beside)[s].blocks() : 0;
    if (caches[s].blocks() != blocks || chain[s]->kv_blocks().blocks_in_use != blocks + others)
      return wrong(fmt::format("stage {} holds {} blocks ({} in the pool's use), its rows {}", s,
                               caches[s].blocks(), chain[s]->kv_blocks().blocks_in_use, blocks));
  }
  return h;
}

/// The whole chunked prefill: the last chunk's logits.
caf::expected<host_tensor> chunked(const std::vector<decoder_stage*>& chain,
                                   std::vector<kv_cache>& caches,
                                   const std::vector<std::vector<int64_t>>& ps,
                                   const schedule& cuts) {
  host_tensor h;
  for (auto [left, chunk] : cuts) {
    auto r = chunk_step(chain, caches, ps, left, chunk);
    if (!r) return r;
    h = std::move(*r);
  }
  return h;
}

/// One step through the chain: a one-step prefill of `ps`, or a decode of `tokens`.
caf::expected<host_tensor> step(const std::vector<decoder_stage*>& chain,
                                std::vector<kv_cache>& caches,
                                const std::vector<std::vector<int64_t>>* ps,
                                const std::vector<int64_t>& tokens) {
  host_tensor h;
  for (size_t s = 0; s < chain.size(); ++s) {
    auto* in = s == 0 ? nullptr : &h;
    auto r = ps ? chain[s]->prefill(*ps, in, caches[s]) : chain[s]->decode(tokens, in, caches[s]);
    if (!r) return r;
    h = std::move(*r);
  }
  return h;
}

std::vector<std::vector<float>> rows_of(const host_tensor& t) {
  auto f = t.to_floats();
  const auto vocab = t.shape[1];
  std::vector<std::vector<float>> out;
  for (int64_t r = 0; r < t.shape[0]; ++r)
    out.emplace_back(f.begin() + r * vocab, f.begin() + (r + 1) * vocab);
  return out;
}

int64_t greedy(const std::vector<float>& row) {
  return std::max_element(row.begin(), row.end()) - row.begin();
}

/// Greedy tokens per row, and the logits each was drawn from (per step, per row).
struct greedy_run {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<std::vector<float>>> logits;
  bool operator==(const greedy_run& o) const { return tokens == o.tokens && logits == o.logits; }
};

/// A prefill (in chunks by `cuts`, or in one step where it is empty), then `steps` greedy
/// decode steps.
caf::expected<greedy_run> run_greedy(const std::vector<decoder_stage*>& chain,
                                     const std::vector<std::vector<int64_t>>& ps,
                                     const schedule& cuts, int steps) {
  std::vector<kv_cache> caches(chain.size());
  greedy_run out;
  out.tokens.resize(ps.size());
  auto h = cuts.empty() ? step(chain, caches, &ps, {}) : chunked(chain, caches, ps, cuts);
  for (int s = 0;; ++s) {
    if (!h) return std::move(h.error());
    out.logits.push_back(rows_of(*h));
    std::vector<int64_t> next;
    for (size_t r = 0; r < ps.size(); ++r) {
      next.push_back(greedy(out.logits.back()[r]));
      out.tokens[r].push_back(next.back());
    }
    if (s == steps) break;
    h = step(chain, caches, nullptr, next);
  }
  return out;
}

void same_run(const greedy_run& got, const greedy_run& want) {
  CHECK(got.tokens == want.tokens);
  REQUIRE(got.logits.size() == want.logits.size());
  for (size_t s = 0; s < want.logits.size(); ++s)
    for (size_t r = 0; r < want.logits[s].size(); ++r) {
      INFO("step " << s << ", row " << r);
      CHECK(relative_error(got.logits[s][r], want.logits[s][r]) <= 1e-5);
    }
}

test::sharded_model seeded(const std::string& name, parallel_config par) {
  return test::sharded_model{*find_spec(name), gpu::dtype::f32, par,
                             test::seeded_filler(*find_spec(name), 11)};
}

}  // namespace

TEST_CASE("a prefill in chunks of 7 gives the one-step prefill's logits and greedy decode",
          "[models][kv][chunked]") {
  for (auto name : {"opt-tiny", "llama-tiny"}) {
    auto m = seeded(name, {1, 1});
    auto chain = m.chain(0);
    // Nine decode steps: the long row's decode crosses into a fourth block (position 48).
    auto want = run_greedy(chain, prompts, {}, 9);
    REQUIRE(want);
    for (auto cuts : {even_chunks(40, 7), short_last(40, 7)}) {
      DYNAMIC_SECTION(name << ", " << cuts.size() << " chunks, the first of "
                           << 40 - cuts.front().first) {
        auto got = run_greedy(chain, prompts, cuts, 9);
        INFO((got ? std::string{} : render(got.error())));
        REQUIRE(got);
        same_run(*got, *want);
        CHECK(chain[0]->kv_blocks().blocks_in_use == 0);
      }
    }
  }
}

TEST_CASE("a chunked prefill at a tensor x pipeline split equals the one-step prefill",
          "[models][kv][chunked][tp][pp]") {
  for (auto name : {"opt-tiny", "llama-tiny"}) {
    DYNAMIC_SECTION(name << " tp=2 pp=2") {
      auto m = seeded(name, {2, 2});
      auto want = m.on_all_ranks(
          [](std::vector<decoder_stage*> c) { return run_greedy(c, prompts, {}, 3); });
      auto got = m.on_all_ranks([](std::vector<decoder_stage*> c) {
        return run_greedy(c, prompts, even_chunks(40, 7), 3);
      });
      same_run(got, want);
      for (auto& st : m.stages) CHECK(st->kv_blocks().blocks_in_use == 0);
    }
  }
}

TEST_CASE("a chunk longer than every prompt is the one-step prefill, bit for bit",
          "[models][kv][chunked]") {
  for (auto name : {"opt-tiny", "llama-tiny"}) {
    INFO(name);
    auto m = seeded(name, {1, 1});
    auto* stage = m.chain(0)[0];
    for (auto out : {head_output{}, head_output{3}}) {
      INFO("top " << out.top);
      kv_cache one, chunk;
      auto want = stage->prefill(prompts, nullptr, one, {}, out);
      REQUIRE(want);
      auto got = stage->prefill_chunk(prompts, 0, 64, nullptr, chunk, out);
      REQUIRE(got);
      CHECK(test::same_bytes(*got, *want));
      CHECK(chunk.lengths() == one.lengths());
      // And the decode after it.
      auto a = stage->decode({5, 6, 7}, nullptr, one, out);
      auto b = stage->decode({5, 6, 7}, nullptr, chunk, out);
      REQUIRE(a);
      REQUIRE(b);
      CHECK(test::same_bytes(*b, *a));
    }
  }
}

namespace {

/// A running batch (two rows) decodes one token per step; between its steps, a batch of
/// `joiners` is prefilled in chunks of 7; after its last chunk it joins the running batch
/// and every row decodes two more tokens. Returns each request's greedy tokens and their
/// logits (running rows first), as `alone` does.
struct per_request {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<std::vector<float>>> logits;  // per request, per token
  bool operator==(const per_request& o) const { return tokens == o.tokens && logits == o.logits; }
};

const std::vector<std::vector<int64_t>> running = {prompt(15, 7), prompt(3, 8)};

caf::expected<per_request> join_chunked(const std::vector<decoder_stage*>& chain) {
  const auto all = [] {
    auto v = running;
    v.insert(v.end(), prompts.begin(), prompts.end());
    return v;
  }();
  per_request o;
  o.tokens.resize(all.size());
  o.logits.resize(all.size());
  auto take = [&](const host_tensor& h, size_t first) {
    auto rows = rows_of(h);
    for (size_t r = 0; r < rows.size(); ++r) {
      o.tokens[first + r].push_back(greedy(rows[r]));
      o.logits[first + r].push_back(rows[r]);
    }
  };
  std::vector<kv_cache> batch(chain.size()), join(chain.size());
  auto h = step(chain, batch, &running, {});
  if (!h) return std::move(h.error());
  take(*h, 0);
  for (auto [left, chunk] : even_chunks(longest(prompts), 7)) {
    h = step(chain, batch, nullptr, {o.tokens[0].back(), o.tokens[1].back()});
    if (!h) return std::move(h.error());
    take(*h, 0);
    h = chunk_step(chain, join, prompts, left, chunk, &batch);
    if (!h) return std::move(h.error());
    if (left == 0) take(*h, running.size());
  }
  for (size_t s = 0; s < chain.size(); ++s)
    if (auto err = batch[s].append(std::move(join[s]))) return err;
  for (int s = 0; s < 2; ++s) {
    std::vector<int64_t> next;
    for (auto& t : o.tokens) next.push_back(t.back());
    h = step(chain, batch, nullptr, next);
    if (!h) return std::move(h.error());
    take(*h, 0);
  }
  return o;
}

/// Each request alone: its one-step prefill, then greedy decode to as many tokens as it
/// got in the batch.
caf::expected<per_request> alone(const std::vector<decoder_stage*>& chain,
                                 const per_request& batched) {
  auto all = running;
  all.insert(all.end(), prompts.begin(), prompts.end());
  per_request o;
  for (size_t i = 0; i < all.size(); ++i) {
    std::vector<kv_cache> caches(chain.size());
    std::vector<std::vector<int64_t>> one{all[i]};
    o.tokens.emplace_back();
    o.logits.emplace_back();
    auto h = step(chain, caches, &one, {});
    while (true) {
      if (!h) return std::move(h.error());
      o.logits.back().push_back(rows_of(*h)[0]);
      o.tokens.back().push_back(greedy(o.logits.back().back()));
      if (o.tokens.back().size() >= batched.tokens[i].size()) break;
      h = step(chain, caches, nullptr, {o.tokens.back().back()});
    }
  }
  return o;
}

}  // namespace

TEST_CASE("a chunked batch joins a running batch that decoded between its chunks",
          "[models][kv][chunked][join]") {
  for (auto name : {"opt-tiny", "llama-tiny"}) {
    for (auto par : {parallel_config{1, 1}, parallel_config{2, 2}}) {
      DYNAMIC_SECTION(name << " tp=" << par.tp << " pp=" << par.pp) {
        auto m = seeded(name, par);
        auto got = m.on_all_ranks([](std::vector<decoder_stage*> c) { return join_chunked(c); });
        // The running rows decoded once per chunk (6) and twice after the join.
        REQUIRE(got.tokens[0].size() == 9);
        REQUIRE(got.tokens[2].size() == 3);
        auto want = m.on_all_ranks([&](std::vector<decoder_stage*> c) { return alone(c, got); });
        for (size_t i = 0; i < want.tokens.size(); ++i) {
          INFO("request " << i);
          CHECK(got.tokens[i] == want.tokens[i]);
          for (size_t k = 0; k < want.logits[i].size(); ++k) {
            INFO("token " << k);
            CHECK(relative_error(got.logits[i][k], want.logits[i][k]) <= 1e-5);
          }
        }
        for (auto& st : m.stages) CHECK(st->kv_blocks().blocks_in_use == 0);
      }
    }
  }
}

TEST_CASE("a bad prefill chunk is an error that leaves the cache and the stage as they were",
          "[models][kv][chunked][errors]") {
  auto m = seeded("llama-tiny", {1, 2});
  auto chain = m.chain(0);
  auto cuts = even_chunks(40, 7);  // lefts 35, 28, ..., 0
  std::vector<kv_cache> caches(2);
  auto expect_error = [](const caf::expected<host_tensor>& r, const std::string& says) {
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), ec::invalid_request));
    CHECK_THAT(render(r.error()), Catch::Contains(says));
  };
  auto* first = chain[0];
  expect_error(first->prefill_chunk(prompts, 0, 0, nullptr, caches[0]), "at least one token");
  expect_error(first->prefill_chunk(prompts, 7, -1, nullptr, caches[0]), "at least one token");
  expect_error(first->prefill_chunk(prompts, -1, 7, nullptr, caches[0]), "cannot leave -1");
  expect_error(first->prefill_chunk(prompts, 40, 7, nullptr, caches[0]), "computes none");
  expect_error(first->prefill_chunk(prompts, 28, 7, nullptr, caches[0]), "cache is empty");
  expect_error(first->prefill_chunk({}, 0, 7, nullptr, caches[0]), "empty batch");
  CHECK(caches[0].rows() == 0);
  // Two chunks, then every kind of wrong third chunk.
  REQUIRE(chunk_step(chain, caches, prompts, cuts[0].first, 7));
  REQUIRE(chunk_step(chain, caches, prompts, cuts[1].first, 7));
  const auto held = caches[0].lengths();
  REQUIRE(held == std::vector<int64_t>{0, 0, 12});
  const auto in_use = first->kv_blocks().blocks_in_use;
  // The same chunk again: the rows already hold its tokens.
  expect_error(first->prefill_chunk(prompts, cuts[1].first, 7, nullptr, caches[0]),
               "starts prompt 2 at token 5, but its cache holds 12");
  // A chunk that skips tokens.
  expect_error(first->prefill_chunk(prompts, 14, 7, nullptr, caches[0]),
               "starts prompt 1 at token 2, but its cache holds 0");
  expect_error(first->prefill_chunk({prompts[0], prompts[2]}, 21, 7, nullptr, caches[0]),
               "2 prompts with a cache of 3 rows");
  auto bad_ids = prompts;
  bad_ids[1][20] = 100000;
  expect_error(first->prefill_chunk(bad_ids, 21, 7, nullptr, caches[0]), "token id 100000");
  expect_error(first->prefill_chunk(prompts, 21, 7, nullptr, caches[1]), "another stage");
  // The second stage with the first stage's hidden states of the wrong chunk.
  host_tensor narrow;
  narrow.shape = {3, 5, 64};
  narrow.bytes.resize(3 * 5 * 64 * 4);
  expect_error(chain[1]->prefill_chunk(prompts, 21, 7, &narrow, caches[1]), "[3, 7, 64]");
  expect_error(chain[1]->prefill_chunk(prompts, 21, 7, nullptr, caches[1]), "hidden states");
  CHECK(caches[0].lengths() == held);
  CHECK(caches[1].lengths() == held);
  CHECK(first->kv_blocks().blocks_in_use == in_use);
  // The batch goes on from where it was, to the one-step prefill's logits.
  host_tensor h;
  for (size_t i = 2; i < cuts.size(); ++i) {
    auto r = chunk_step(chain, caches, prompts, cuts[i].first, 7);
    INFO((r ? std::string{} : render(r.error())));
    REQUIRE(r);
    h = std::move(*r);
  }
  std::vector<kv_cache> one(2);
  auto want = step(chain, one, &prompts, {});
  REQUIRE(want);
  auto got = rows_of(h), rows = rows_of(*want);
  for (size_t r = 0; r < rows.size(); ++r) CHECK(relative_error(got[r], rows[r]) <= 1e-5);
}

TEST_CASE("a later chunk without KV blocks fails with out_of_device_memory and changes nothing",
          "[models][kv][chunked][errors]") {
  auto m = seeded("opt-tiny", {1, 1});
  auto refuse = std::make_shared<bool>(false);
  kv_pool_options o;
  o.min_chunk_blocks = 1;
  o.allocate = [refuse](uint64_t bytes) -> caf::expected<kv_memory> {
    if (*refuse) return make_error(ec::out_of_device_memory, fmt::format("no room for {}", bytes));
    auto mem = std::make_shared<std::vector<float>>(bytes / sizeof(float));
    return kv_memory{mem->data(), mem};
  };
  auto made = decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], o);
  REQUIRE(made);
  std::vector<decoder_stage*> chain{made->get()};
  std::vector<kv_cache> caches(1);
  auto cuts = even_chunks(40, 7);
  // 5 tokens of the long prompt, then 12 (one block, no more), then 19: a second block.
  REQUIRE(chunk_step(chain, caches, prompts, cuts[0].first, 7));
  REQUIRE(chunk_step(chain, caches, prompts, cuts[1].first, 7));
  *refuse = true;
  auto r = chain[0]->prefill_chunk(prompts, cuts[2].first, 7, nullptr, caches[0]);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), ec::out_of_device_memory));
  CHECK(caches[0].lengths() == std::vector<int64_t>{0, 0, 12});
  CHECK(chain[0]->kv_blocks().blocks_in_use == 1);
  *refuse = false;
  host_tensor h;
  for (size_t i = 2; i < cuts.size(); ++i) {
    auto next = chunk_step(chain, caches, prompts, cuts[i].first, 7);
    INFO((next ? std::string{} : render(next.error())));
    REQUIRE(next);
    h = std::move(*next);
  }
  std::vector<kv_cache> one(1);
  auto want = step(m.chain(0), one, &prompts, {});
  REQUIRE(want);
  auto got = rows_of(h), rows = rows_of(*want);
  for (size_t r = 0; r < rows.size(); ++r) CHECK(relative_error(got[r], rows[r]) <= 1e-5);
}
