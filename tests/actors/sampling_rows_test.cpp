// Sampling on the workers' side: sample_rows with the rows of a prefill that scores
// prompts (echo with logprobs), and the sampling settings and log-probabilities as they
// travel between nodes (CAF's binary serialization, as the middleman sends them).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include "actors/engine.hpp"
#include "actors/node.hpp"

using namespace computron;
using namespace computron::actors;

namespace {

models::host_tensor floats(std::vector<int64_t> shape, const std::vector<float>& values) {
  models::host_tensor t;
  t.type = gpu::dtype::f32;
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * sizeof(float));
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

/// log_softmax(row)[id]
double logprob(const std::vector<float>& row, int64_t id) {
  double top = *std::max_element(row.begin(), row.end()), sum = 0;
  for (auto x : row) sum += std::exp(x - top);
  return row[static_cast<size_t>(id)] - top - std::log(sum);
}

}  // namespace

TEST_CASE("a scoring prefill: each asking row's prompt positions follow the batch",
          "[actors][sampling]") {
  // Three rows, vocabulary 4. Row 0 (prompt of 3) and row 2 (prompt of 2) ask for their
  // prompt's scores; row 1 does not. After the 3 batch rows: row 0's 2 positions, then
  // row 2's 1 position.
  const std::vector<std::vector<int64_t>> prompts = {{0, 1, 2}, {3, 3, 3, 3}, {2, 0}};
  std::vector<row_sampling> sampling(3);
  sampling[0].prompt_logprobs = 1;
  sampling[2].prompt_logprobs = 0;
  std::vector<std::vector<float>> rows = {
      {0, 5, 0, 0},  // batch row 0: greedy 1
      {0, 0, 7, 0},  // batch row 1: greedy 2
      {9, 0, 0, 0},  // batch row 2: greedy 0
      {1, 2, 3, 4},  // row 0, position 0 scores token 1
      {4, 3, 2, 1},  // row 0, position 1 scores token 2
      {0, 1, 0, 1},  // row 2, position 0 scores token 0
  };
  std::vector<float> flat;
  for (auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  std::vector<models::sampler> samplers;
  std::vector<std::vector<token_logprobs>> scored;
  auto tokens = sample_rows(floats({6, 4}, flat), samplers, sampling, prompts, nullptr, &scored);
  REQUIRE(tokens);
  CHECK(*tokens == std::vector<int64_t>{1, 2, 0});
  REQUIRE(scored.size() == 3);
  REQUIRE(scored[0].size() == 2);
  CHECK(scored[0][0].logprob == Approx(logprob(rows[3], 1)));
  CHECK(scored[0][0].top_ids == std::vector<int64_t>{3});
  CHECK(scored[0][1].logprob == Approx(logprob(rows[4], 2)));
  CHECK(scored[0][1].top_ids == std::vector<int64_t>{0});
  CHECK(scored[1].empty());
  REQUIRE(scored[2].size() == 1);
  CHECK(scored[2][0].logprob == Approx(logprob(rows[5], 0)));
  CHECK(scored[2][0].top_ids.empty());
  // Rows that do not add up to the asking rows' positions are refused, not misread.
  std::vector<models::sampler> fresh;
  auto bad = sample_rows(floats({5, 4}, {flat.begin(), flat.begin() + 20}), fresh, sampling,
                         prompts, nullptr, &scored);
  CHECK_FALSE(bad);
  // A model kind that gives only the batch's rows: the rows are sampled, nothing scored.
  std::vector<models::sampler> plain;
  auto only = sample_rows(floats({3, 4}, {flat.begin(), flat.begin() + 12}), plain, sampling,
                          prompts, nullptr, &scored);
  REQUIRE(only);
  CHECK(*only == std::vector<int64_t>{1, 2, 0});
}

TEST_CASE("rows that need only candidates draw from them exactly what they draw from the row",
          "[actors][sampling]") {
  row_sampling greedy;
  CHECK(candidates_of(greedy) == 1);
  auto topk = greedy;
  topk.temperature = 0.8;
  topk.top_k = 40;
  topk.top_p = 0.9;
  topk.min_p = 0.01;
  CHECK(candidates_of(topk) == 40);
  auto all = topk;
  all.top_k = 0;  // top_p alone needs the whole row
  auto wide = topk;
  wide.top_k = max_candidates + 1;
  auto scored = greedy;
  scored.logprobs = 0;
  auto prompt = greedy;
  prompt.prompt_logprobs = 0;
  auto biased = greedy;
  biased.bias_ids = {3};
  biased.bias_values = {5};
  auto penalised = topk;
  penalised.repetition_penalty = 1.2;
  auto presence = greedy;
  presence.presence_penalty = 0.5;
  auto held = greedy;
  held.min_tokens = 2;
  held.suppress = {2};
  for (auto& s : {all, wide, scored, prompt, biased, penalised, presence, held})
    CHECK(candidates_of(s) == 0);

  // Logits with many ties (bf16-like: 6 bits of mantissa), 8 rows over 3 steps; the
  // candidates are what a stable sort puts first. The same seeds give the same tokens.
  const int64_t vocab = 1000, rows = 8, k = 40;
  std::mt19937 gen{7};
  std::normal_distribution<float> normal{0.0f, 3.0f};
  std::vector<row_sampling> settings;
  for (int64_t r = 0; r < rows; ++r) {
    auto s = r % 4 == 0 ? greedy : topk;
    s.seed = static_cast<uint64_t>(100 + r);
    if (r % 4 == 1) s.top_k = 5;
    if (r % 4 == 2) s.top_p = 1.0;
    settings.push_back(s);
  }
  std::vector<models::sampler> from_rows, from_candidates;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (auto& x : logits) x = std::ldexp(std::round(std::ldexp(normal(gen), 3)), -3);
    std::vector<float> pairs;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int64_t> order(static_cast<size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      const float* row = logits.data() + r * vocab;
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return row[a] > row[b]; });
      for (int64_t c = 0; c < k; ++c) {
        pairs.push_back(row[order[static_cast<size_t>(c)]]);
        pairs.push_back(static_cast<float>(order[static_cast<size_t>(c)]));
      }
    }
    auto want = sample_rows(floats({rows, vocab}, logits), from_rows,
                            step == 0 ? settings : std::vector<row_sampling>{}, {});
    auto got = sample_rows(floats({rows, k, 2}, pairs), from_candidates,
                           step == 0 ? settings : std::vector<row_sampling>{}, {});
    REQUIRE(want);
    REQUIRE(got);
    CHECK(*got == *want);
  }
  // A count that disagrees with the batch is refused, not read past.
  CHECK_FALSE(sample_rows(floats({2, 1, 2}, {1, 2, 3, 4}), from_candidates, {}, {}));
}

TEST_CASE("log-probabilities that are not finite become -9999", "[actors][sampling]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<row_sampling> sampling(1);
  sampling[0].logprobs = 2;
  std::vector<models::sampler> samplers;
  std::vector<token_logprobs> lps;
  auto tokens = sample_rows(floats({1, 3}, {0, -inf, -inf}), samplers, sampling, {{1}}, &lps);
  REQUIRE(tokens);
  CHECK((*tokens)[0] == 0);
  REQUIRE(lps.size() == 1);
  REQUIRE(lps[0].top_logprobs.size() == 2);
  CHECK(lps[0].top_logprobs[1] == -9999.0f);
}

TEST_CASE("sampling settings and log-probabilities cross a node boundary intact",
          "[actors][sampling]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  row_sampling s;
  s.temperature = 0.7;
  s.top_k = 5;
  s.top_p = 0.9;
  s.seed = 42;
  s.min_p = 0.05;
  s.repetition_penalty = 1.2;
  s.presence_penalty = -0.5;
  s.frequency_penalty = 0.25;
  s.bias_ids = {3, 9};
  s.bias_values = {-100, 2.5};
  s.min_tokens = 4;
  s.suppress = {2};
  s.logprobs = 3;
  s.prompt_logprobs = 1;
  step_result r;
  r.tokens = {7};
  r.logprobs = {token_logprobs{-0.25f, {7, 8}, {-0.25f, -2.0f}}};
  r.prompt_logprobs = {{token_logprobs{-1.5f, {1}, {-0.5f}}}};
  std::vector<char> buf;
  caf::binary_serializer out{sys, buf};
  REQUIRE_FALSE(out(s, r));
  row_sampling s2;
  step_result r2;
  caf::binary_deserializer in{sys, buf};
  REQUIRE_FALSE(in(s2, r2));
  CHECK(s2.temperature == s.temperature);
  CHECK(s2.min_p == s.min_p);
  CHECK(s2.repetition_penalty == s.repetition_penalty);
  CHECK(s2.presence_penalty == s.presence_penalty);
  CHECK(s2.frequency_penalty == s.frequency_penalty);
  CHECK(s2.bias_ids == s.bias_ids);
  CHECK(s2.bias_values == s.bias_values);
  CHECK(s2.min_tokens == 4);
  CHECK(s2.suppress == s.suppress);
  CHECK(s2.logprobs == 3);
  CHECK(s2.prompt_logprobs == 1);
  CHECK(r2.tokens == r.tokens);
  REQUIRE(r2.logprobs.size() == 1);
  CHECK(r2.logprobs[0].top_ids == std::vector<int64_t>{7, 8});
  CHECK(r2.logprobs[0].top_logprobs[1] == -2.0f);
  REQUIRE(r2.prompt_logprobs.size() == 1);
  CHECK(r2.prompt_logprobs[0][0].logprob == -1.5f);
}
