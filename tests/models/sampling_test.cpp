#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/error.hpp"
#include "models/sampling.hpp"

using namespace computron;
using namespace computron::models;

TEST_CASE("greedy sampling takes the largest logit, the first on ties", "[models][sampling]") {
  sampler s{{}};
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  CHECK(s.next(logits.data(), 4) == 1);
}

TEST_CASE("seeded sampling is reproducible and follows the distribution", "[models][sampling]") {
  std::vector<float> logits = {std::log(0.75f), std::log(0.25f)};
  sampling_params p;
  p.temperature = 1.0;
  p.seed = 7;
  sampler a{p}, b{p};
  int ones = 0;
  for (int i = 0; i < 4000; ++i) {
    auto x = a.next(logits.data(), 2);
    CHECK(x == b.next(logits.data(), 2));
    ones += static_cast<int>(x);
  }
  CHECK(ones / 4000.0 == Approx(0.25).margin(0.03));
}

TEST_CASE("top-k and top-p cut the candidates", "[models][sampling]") {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  sampling_params p;
  p.temperature = 5.0;  // flat: without the cuts every token would show up
  p.top_k = 1;
  sampler k1{p};
  for (int i = 0; i < 200; ++i) CHECK(k1.next(logits.data(), 4) == 1);
  p.top_k = 2;
  sampler k2{p};
  for (int i = 0; i < 200; ++i) {
    auto x = k2.next(logits.data(), 4);
    CHECK((x == 1 || x == 2));
  }
  p.top_k = 0;
  p.top_p = 0.01;
  sampler tp{p};
  for (int i = 0; i < 200; ++i) CHECK(tp.next(logits.data(), 4) == 1);
}

TEST_CASE("bad sampling parameters are refused", "[models][sampling]") {
  CHECK_FALSE(validate(sampling_params{}));
  CHECK(is(validate({-1.0, 0, 1.0, 0}), ec::invalid_request));
  CHECK(is(validate({NAN, 0, 1.0, 0}), ec::invalid_request));
  CHECK(is(validate({1.0, -3, 1.0, 0}), ec::invalid_request));
  CHECK_THAT(render(validate({1.0, 0, 0.0, 0})), Catch::Contains("top_p must be in (0, 1]"));
  CHECK(is(validate({1.0, 0, 1.5, 0}), ec::invalid_request));
}

namespace {

/// log_softmax in double, written out independently of the sampler.
std::vector<double> log_softmax(const std::vector<float>& logits) {
  double m = -std::numeric_limits<double>::infinity();
  for (float x : logits) m = std::max(m, static_cast<double>(x));
  double s = 0;
  for (float x : logits) s += std::exp(x - m);
  std::vector<double> out;
  for (float x : logits) out.push_back(x - m - std::log(s));
  return out;
}

std::vector<int64_t> draw_n(sampler& s, const std::vector<float>& logits, int n) {
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i)
    out.push_back(s.next(logits.data(), static_cast<int64_t>(logits.size())));
  return out;
}

}  // namespace

TEST_CASE("default parameters draw the same tokens as before the new parameters existed",
          "[models][sampling]") {
  // Expected tokens recorded from the sampler before min_p, penalties, bias, min_tokens and
  // logprobs were added: a seed must keep giving the same tokens.
  std::vector<float> logits = {0.5f, 1.5f, -0.25f, 1.0f, 2.0f, 0.0f, 1.25f, -1.0f};
  sampler t1{sampling_params{1.0, 0, 1.0, 42}};
  CHECK(draw_n(t1, logits, 24) == std::vector<int64_t>{3, 6, 3, 4, 5, 4, 6, 1, 4, 1, 4, 1,
                                                       6, 6, 0, 5, 3, 1, 4, 4, 3, 4, 1, 4});
  sampler k3{sampling_params{0.7, 3, 1.0, 1234}};
  CHECK(draw_n(k3, logits, 24) == std::vector<int64_t>{6, 4, 6, 6, 4, 6, 6, 6, 4, 1, 6, 4,
                                                       4, 6, 4, 1, 4, 4, 4, 1, 4, 6, 4, 6});
  sampler p9{sampling_params{1.3, 0, 0.9, 99}};
  CHECK(draw_n(p9, logits, 24) == std::vector<int64_t>{1, 5, 6, 4, 6, 1, 3, 4, 4, 1, 1, 0,
                                                       4, 1, 6, 6, 3, 6, 6, 1, 4, 1, 4, 3});
  sampler greedy{sampling_params{0.0, 0, 1.0, 5}};
  CHECK(draw_n(greedy, logits, 24) == std::vector<int64_t>(24, 4));
  std::vector<float> ties = {1.0f, 0.5f, 1.0f, 1.0f, -2.0f};
  sampler t{sampling_params{2.0, 2, 1.0, 3}};
  CHECK(draw_n(t, ties, 24) == std::vector<int64_t>{2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 0, 2,
                                                    2, 2, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0});

  // Asking for logprobs, and choose() instead of next(), leave the draws alone.
  sampling_params lp{1.0, 0, 1.0, 42};
  lp.logprobs = 5;
  sampler with_lp{lp}, plain{sampling_params{1.0, 0, 1.0, 42}};
  for (int i = 0; i < 200; ++i)
    CHECK(with_lp.choose(logits.data(), 8).token == plain.next(logits.data(), 8));
}

TEST_CASE("the repetition penalty divides positive and multiplies negative seen logits",
          "[models][sampling]") {
  sampling_params p;
  p.repetition_penalty = 1.5;
  SECTION("a prompt token, positive logit: 2 / 1.5 falls below 1.5") {
    std::vector<float> logits = {2.0f, 1.5f, 0.1f};
    CHECK(sampler{sampling_params{}, {0}}.next(logits.data(), 3) == 0);
    CHECK(sampler{p, {0}}.next(logits.data(), 3) == 1);
    CHECK(sampler{p, {2}}.next(logits.data(), 3) == 0);  // an unseen winner is untouched
  }
  SECTION("a prompt token, negative logit: -1 * 1.5 falls below -1.2") {
    std::vector<float> logits = {-1.0f, -1.2f, -5.0f};
    CHECK(sampler{sampling_params{}, {0}}.next(logits.data(), 3) == 0);
    CHECK(sampler{p, {0}}.next(logits.data(), 3) == 1);
  }
  SECTION("a seen id is penalised once however often it was seen") {
    std::vector<float> logits = {2.0f, 1.5f};
    p.repetition_penalty = 1.2;  // 2 / 1.2 = 1.67 > 1.5; three times would be 1.16
    CHECK(sampler{p, {0, 0, 0}}.next(logits.data(), 2) == 0);
  }
  SECTION("generated tokens count as seen") {
    std::vector<float> pos = {2.0f, 1.5f};
    sampler s{p};
    CHECK(s.next(pos.data(), 2) == 0);  // nothing seen yet
    CHECK(s.next(pos.data(), 2) == 1);  // 0 is now 1.33
    CHECK(s.next(pos.data(), 2) == 0);  // both seen: 1.33 against 1.0
    std::vector<float> neg = {-1.0f, -1.2f};
    sampler n{p};
    CHECK(n.next(neg.data(), 2) == 0);
    CHECK(n.next(neg.data(), 2) == 1);  // -1.5 against -1.2
    std::vector<float> processed = neg;
    n.apply_processors(processed.data(), 2);
    CHECK(processed[0] == Approx(-1.5));
    CHECK(processed[1] == Approx(-1.8));
  }
}

TEST_CASE("presence and frequency penalties act on generated tokens only", "[models][sampling]") {
  sampling_params p;
  p.presence_penalty = 0.5;
  p.frequency_penalty = 0.25;
  sampler s{p, {2, 3}};  // prompt ids: never penalised by these two
  std::vector<float> first = {10.0f, 0.0f, 0.0f, 0.0f};
  std::vector<float> second = {0.0f, 10.0f, 0.0f, 0.0f};
  CHECK(s.next(first.data(), 4) == 0);
  CHECK(s.next(first.data(), 4) == 0);  // 10 - 0.5 - 0.25 still wins
  CHECK(s.next(second.data(), 4) == 1);
  // Generated: 0 twice, 1 once. logit - presence * (count > 0) - frequency * count.
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, -1.0f};
  s.apply_processors(logits.data(), 4);
  CHECK(logits[0] == Approx(1.0 - 0.5 - 2 * 0.25));
  CHECK(logits[1] == Approx(1.0 - 0.5 - 1 * 0.25));
  CHECK(logits[2] == 1.0f);
  CHECK(logits[3] == -1.0f);
  // The penalties steer greedy: 3 (untouched, 0.9) now beats 0 (1.0 - 1.0 = 0).
  std::vector<float> choice = {1.0f, 0.5f, 0.2f, 0.9f};
  CHECK(s.next(choice.data(), 4) == 3);
  // A negative presence penalty encourages repeating.
  p.presence_penalty = -1.0;
  p.frequency_penalty = 0;
  sampler r{p};
  std::vector<float> close = {1.0f, 0.5f};
  CHECK(r.next(second.data(), 2) == 1);
  CHECK(r.next(close.data(), 2) == 1);  // 0.5 + 1 beats 1
}

TEST_CASE("logit_bias forces a token and -100 bans one", "[models][sampling]") {
  std::vector<float> logits = {3.0f, 1.0f, 2.0f};
  sampling_params p;
  p.logit_bias = {{1, 100.0}};
  CHECK(sampler{p}.next(logits.data(), 3) == 1);
  p.logit_bias = {{0, -100.0}};
  CHECK(sampler{p}.next(logits.data(), 3) == 2);
  // Ids outside the vocabulary are ignored.
  p.logit_bias = {{-1, 100.0}, {3, 100.0}, {99, 100.0}};
  CHECK(sampler{p}.next(logits.data(), 3) == 0);
  // Sampled: the banned token never shows up, the others do.
  p.temperature = 1.0;
  p.seed = 11;
  p.logit_bias = {{0, -100.0}};
  sampler s{p};
  int seen[3] = {0, 0, 0};
  for (int i = 0; i < 2000; ++i) ++seen[s.next(logits.data(), 3)];
  CHECK(seen[0] == 0);
  CHECK(seen[1] > 0);
  CHECK(seen[2] > seen[1]);
  // The bias is added to the logit as given; the temperature comes later.
  std::vector<float> processed = {0.0f, -1.0f, 0.0f};
  p.temperature = 0.5;
  p.logit_bias = {{1, 1.5}, {2, -0.25}};
  sampler{p}.apply_processors(processed.data(), 3);
  CHECK(processed == std::vector<float>{0.0f, 0.5f, -0.25f});
}

TEST_CASE("min_p drops tokens far less likely than the best, after the temperature",
          "[models][sampling]") {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  sampling_params p;
  p.temperature = 1.0;
  p.seed = 21;
  auto counts = [&](const sampling_params& q) {
    sampler s{q};
    std::vector<int> seen(4, 0);
    for (int i = 0; i < 3000; ++i) ++seen[static_cast<size_t>(s.next(logits.data(), 4))];
    return seen;
  };
  auto off = counts(p);
  CHECK(off[2] > 0);  // without min_p the low tokens do appear
  CHECK(off[3] > 0);
  p.min_p = 0.35;  // threshold 0.175: keeps 0.5 and 0.3
  auto on = counts(p);
  CHECK(on[2] == 0);
  CHECK(on[3] == 0);
  CHECK(on[1] / 3000.0 == Approx(0.3 / 0.8).margin(0.03));
  // Temperature 2 flattens to ratios 1, 0.77, 0.55, 0.32 of the best: min_p 0.5 keeps id 2
  // (its raw ratio 0.3 would not), drops id 3.
  p.temperature = 2.0;
  p.min_p = 0.5;
  auto hot = counts(p);
  CHECK(hot[2] > 0);
  CHECK(hot[3] == 0);
}

TEST_CASE("min_tokens suppresses the given ids for exactly that many draws", "[models][sampling]") {
  std::vector<float> logits = {0.0f, 5.0f, 1.0f};  // id 1 plays EOS and would win
  sampling_params p;
  p.min_tokens = 3;
  p.suppress = {1, 42};  // 42 is outside the vocabulary: ignored
  sampler s{p};
  CHECK(s.next(logits.data(), 3) == 2);
  CHECK(s.choose(logits.data(), 3).token == 2);  // choose() counts as a draw too
  CHECK(s.next(logits.data(), 3) == 2);
  CHECK(s.drawn() == 3);
  CHECK(s.next(logits.data(), 3) == 1);
  CHECK(s.next(logits.data(), 3) == 1);
  // Sampled: the suppressed id never comes out before min_tokens, and does after.
  p.temperature = 1.0;
  p.seed = 8;
  p.min_tokens = 50;
  sampler r{p};
  for (int i = 0; i < 50; ++i) CHECK(r.next(logits.data(), 3) != 1);
  int eos = 0;
  for (int i = 0; i < 50; ++i) eos += r.next(logits.data(), 3) == 1;
  CHECK(eos > 25);
  // Suppressing the whole vocabulary still yields a token rather than undefined behaviour.
  p.suppress = {0, 1, 2};
  sampler all{p};
  auto x = all.next(logits.data(), 3);
  CHECK((x >= 0 && x < 3));
}

TEST_CASE("top_k -1 means off, like 0", "[models][sampling]") {
  std::vector<float> logits = {0.5f, 1.5f, -0.25f, 1.0f, 2.0f, 0.0f, 1.25f, -1.0f};
  sampling_params zero{1.0, 0, 1.0, 77}, minus{1.0, -1, 1.0, 77};
  sampler a{zero}, b{minus};
  CHECK(draw_n(a, logits, 300) == draw_n(b, logits, 300));
  CHECK_FALSE(validate(minus));
  CHECK(is(validate({1.0, -2, 1.0, 0}), ec::invalid_request));
}

TEST_CASE("logprobs are the raw log_softmax, with the top ids most likely first",
          "[models][sampling]") {
  std::vector<float> logits = {1.0f, 2.0f, 0.5f, 2.0f, -1.0f};
  auto expected = log_softmax(logits);
  double total = 0;
  for (double x : expected) total += std::exp(x);
  REQUIRE(total == Approx(1.0).epsilon(1e-12));  // the reference itself is a distribution

  sampling_params p;
  p.logprobs = 3;
  sampler s{p};
  CHECK(s.wants_logprobs());
  auto c = s.choose(logits.data(), 5);
  CHECK(c.token == 1);  // greedy, tie with 3 goes to the lower id
  CHECK(c.logprob == Approx(expected[1]).epsilon(1e-6));
  CHECK(c.top_ids == std::vector<int64_t>{1, 3, 0});  // tie: lower id first
  REQUIRE(c.top_logprobs.size() == 3);
  for (size_t i = 0; i < 3; ++i)
    CHECK(c.top_logprobs[i] == Approx(expected[static_cast<size_t>(c.top_ids[i])]).epsilon(1e-6));

  // logprobs 0: the chosen token's only; -1: nothing.
  p.logprobs = 0;
  auto zero = sampler{p}.choose(logits.data(), 5);
  CHECK(zero.logprob == Approx(expected[1]).epsilon(1e-6));
  CHECK(zero.top_ids.empty());
  CHECK(zero.top_logprobs.empty());
  p.logprobs = -1;
  sampler none{p};
  CHECK_FALSE(none.wants_logprobs());
  auto n = none.choose(logits.data(), 5);
  CHECK(n.token == 1);
  CHECK(n.top_ids.empty());
  CHECK(n.logprob == 0);

  // The whole row, through score_tokens: ordered, and its probabilities sum to 1.
  auto all = score_tokens(logits.data(), 1, 5, {4}, 5);
  REQUIRE(all.size() == 1);
  CHECK(all[0].token == 4);
  CHECK(all[0].logprob == Approx(expected[4]).epsilon(1e-6));
  CHECK(all[0].top_ids == std::vector<int64_t>{1, 3, 0, 2, 4});
  double sum = 0;
  for (size_t i = 0; i < all[0].top_logprobs.size(); ++i) {
    sum += std::exp(static_cast<double>(all[0].top_logprobs[i]));
    if (i > 0) CHECK(all[0].top_logprobs[i] <= all[0].top_logprobs[i - 1]);
  }
  CHECK(sum == Approx(1.0).epsilon(1e-5));
}

TEST_CASE("logprobs stay those of the raw logits under temperature, bias and penalties",
          "[models][sampling]") {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  auto expected = log_softmax(logits);
  sampling_params p;
  p.temperature = 0.5;
  p.seed = 4;
  p.repetition_penalty = 2.0;
  p.presence_penalty = 1.0;
  p.logit_bias = {{0, 50.0}};
  p.logprobs = 2;
  sampler s{p, {1}};
  for (int i = 0; i < 20; ++i) {
    auto c = s.choose(logits.data(), 4);
    CHECK(c.token == 0);  // the bias makes 0 the choice...
    // ...but it is reported with its raw probability, and the raw top two are 1 and 2.
    CHECK(c.logprob == Approx(expected[0]).epsilon(1e-6));
    CHECK(c.top_ids == std::vector<int64_t>{1, 2});
    REQUIRE(c.top_logprobs.size() == 2);
    CHECK(c.top_logprobs[0] == Approx(expected[1]).epsilon(1e-6));
    CHECK(c.top_logprobs[1] == Approx(expected[2]).epsilon(1e-6));
  }
}

TEST_CASE("score_tokens gives each row the log-probability of its own id", "[models][sampling]") {
  std::vector<float> rows = {0.0f, 1.0f, 2.0f,   // row 0
                             3.0f, 0.0f, 0.0f};  // row 1
  std::vector<float> r0(rows.begin(), rows.begin() + 3), r1(rows.begin() + 3, rows.end());
  auto e0 = log_softmax(r0), e1 = log_softmax(r1);
  auto out = score_tokens(rows.data(), 2, 3, {0, 2}, 1);
  REQUIRE(out.size() == 2);
  CHECK(out[0].token == 0);
  CHECK(out[0].logprob == Approx(e0[0]).epsilon(1e-6));
  CHECK(out[0].top_ids == std::vector<int64_t>{2});
  CHECK(out[1].token == 2);
  CHECK(out[1].logprob == Approx(e1[2]).epsilon(1e-6));
  CHECK(out[1].top_ids == std::vector<int64_t>{0});
  CHECK(out[1].top_logprobs[0] == Approx(e1[0]).epsilon(1e-6));
  auto bare = score_tokens(rows.data(), 2, 3, {1, 1}, 0);
  CHECK(bare[1].top_ids.empty());
  CHECK(bare[1].logprob == Approx(e1[1]).epsilon(1e-6));
  auto outside = score_tokens(rows.data(), 1, 3, {7}, 0);
  CHECK(outside[0].logprob == -std::numeric_limits<float>::infinity());
}

TEST_CASE("a copied sampler carries its stream and its penalty state", "[models][sampling]") {
  std::vector<float> logits = {0.5f, 1.5f, -0.25f, 1.0f, 2.0f, 0.0f, 1.25f, -1.0f};
  sampling_params p{0.8, 0, 1.0, 5};
  p.repetition_penalty = 1.3;
  p.frequency_penalty = 0.4;
  p.min_tokens = 4;
  p.suppress = {4};
  sampler a{p, {1, 6}};
  draw_n(a, logits, 3);
  sampler b = a;
  CHECK(draw_n(a, logits, 50) == draw_n(b, logits, 50));
}

TEST_CASE("new sampling parameters are validated with OpenAI's names", "[models][sampling]") {
  auto message = [](auto edit) {
    sampling_params p;
    edit(p);
    auto err = validate(p);
    CHECK(is(err, ec::invalid_request));
    return render(err);
  };
  using Catch::Contains;
  CHECK_THAT(message([](auto& p) { p.repetition_penalty = 0; }),
             Contains("repetition_penalty must be > 0, got 0"));
  CHECK_THAT(message([](auto& p) { p.repetition_penalty = NAN; }),
             Contains("repetition_penalty must be > 0"));
  CHECK_THAT(message([](auto& p) { p.repetition_penalty = INFINITY; }),
             Contains("repetition_penalty must be finite"));
  CHECK_THAT(message([](auto& p) { p.presence_penalty = 2.5; }),
             Contains("presence_penalty must be in [-2, 2], got 2.5"));
  CHECK_THAT(message([](auto& p) { p.frequency_penalty = -3; }),
             Contains("frequency_penalty must be in [-2, 2], got -3"));
  CHECK_THAT(message([](auto& p) { p.min_p = 1.5; }), Contains("min_p must be in [0, 1], got 1.5"));
  CHECK_THAT(message([](auto& p) { p.min_p = -0.1; }), Contains("min_p must be in [0, 1]"));
  CHECK_THAT(message([](auto& p) { p.logprobs = 21; }), Contains("logprobs must be in 0..20"));
  CHECK_THAT(message([](auto& p) { p.logprobs = -2; }), Contains("logprobs must be in 0..20"));
  CHECK_THAT(message([](auto& p) {
               p.logit_bias = {{5, 101.0}};
             }),
             Contains("logit_bias for token 5 must be in [-100, 100], got 101"));
  CHECK_THAT(message([](auto& p) { p.logit_bias = {{5, NAN}}; }), Contains("logit_bias"));
  CHECK_THAT(message([](auto& p) { p.min_tokens = -1; }),
             Contains("min_tokens must be >= 0, got -1"));
  CHECK_THAT(message([](auto& p) { p.top_k = -2; }), Contains("top_k"));

  // The edges are accepted.
  sampling_params ok;
  ok.top_k = -1;
  ok.min_p = 1;
  ok.repetition_penalty = 0.01;
  ok.presence_penalty = -2;
  ok.frequency_penalty = 2;
  ok.logprobs = 20;
  ok.logit_bias = {{0, -100.0}, {1, 100.0}};
  ok.min_tokens = 0;
  CHECK_FALSE(validate(ok));
  ok.logprobs = -1;
  CHECK_FALSE(validate(ok));
}

TEST_CASE("a draw made ready for the device takes the stream's next number and nothing else",
          "[models][sampling][device_sampling]") {
  sampling_params p;
  p.temperature = 0.7;
  p.top_p = 0.9;
  p.seed = 1234;
  sampler s(p);
  // The number is the one uniform_real_distribution draws first from the same stream, so
  // the host's draws are those of every earlier release.
  std::mt19937_64 stream{1234};
  double want = std::uniform_real_distribution<double>(0, 1)(stream);
  auto d = s.next_device_draw();
  REQUIRE(d);
  CHECK(d->uniform == want);
  CHECK(d->temperature == 0.7);
  CHECK(d->top_p == 0.9);
  // Asking before each draw leaves the tokens those of a sampler that never asked.
  sampler plain(p);
  std::vector<float> logits{0.3f, 1.2f, -0.4f, 0.9f, 1.1f, 0.0f};
  for (int i = 0; i < 200; ++i) {
    REQUIRE(s.next_device_draw());
    CHECK(s.next(logits.data(), 6) == plain.next(logits.data(), 6));
  }
  // Greedy rows use no number.
  sampling_params g;
  auto gd = sampler(g).next_device_draw();
  REQUIRE(gd);
  CHECK(gd->temperature == 0);
  CHECK(gd->uniform == 0);
  // A row whose draw needs processors or log-probabilities stays on the host.
  auto biased = p;
  biased.logit_bias = {{1, 5.0}};
  CHECK_FALSE(sampler(biased).next_device_draw());
  auto scored = p;
  scored.logprobs = 2;
  CHECK_FALSE(sampler(scored).next_device_draw());
  auto held = p;
  held.min_tokens = 1;
  held.suppress = {2};
  sampler h(held);
  CHECK_FALSE(h.next_device_draw());
  h.next(logits.data(), 6);  // min_tokens met: nothing is suppressed any more
  CHECK(h.next_device_draw());
}
