#include <catch2/catch.hpp>

#include <cmath>
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
