#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <sstream>

#include "common/error.hpp"
#include "workload/arrivals.hpp"
#include "workload/stats.hpp"

using namespace computron;
using namespace computron::workload;

namespace {

struct moments {
  double mean = 0;
  double cv = 0;
};

moments of_gaps(double rate, double cv, uint64_t seed, size_t n) {
  auto g = gamma_gaps::make(rate, cv, seed);
  REQUIRE(g);
  std::vector<double> xs(n);
  for (auto& x : xs) x = g->next();
  moments m;
  m.mean = std::accumulate(xs.begin(), xs.end(), 0.0) / static_cast<double>(n);
  double var = 0;
  for (auto x : xs) var += (x - m.mean) * (x - m.mean);
  var /= static_cast<double>(n - 1);
  m.cv = std::sqrt(var) / m.mean;
  return m;
}

}  // namespace

TEST_CASE("gamma gaps have the asked mean rate and cv", "[workload]") {
  for (double cv : {0.25, 1.0, 4.0}) {
    CAPTURE(cv);
    // cv 4 is shape 1/16: heavy tails need many samples for a stable sample cv.
    auto m = of_gaps(10.0, cv, 42, 1000000);
    CHECK(1.0 / m.mean == Approx(10.0).epsilon(0.02));
    CHECK(m.cv == Approx(cv).epsilon(0.03));
  }
  auto fixed = of_gaps(4.0, 0.0, 1, 1000);
  CHECK(fixed.mean == Approx(0.25));
  CHECK(fixed.cv == Approx(0.0).margin(1e-9));
}

TEST_CASE("arrivals start one gap in and stop before the end", "[workload]") {
  auto t = gamma_arrivals(20.0, 1.0, 5.0, 500.0, 7);
  REQUIRE(t);
  REQUIRE(!t->empty());
  CHECK(t->front() > 5.0);
  CHECK(t->back() < 505.0);
  CHECK(std::is_sorted(t->begin(), t->end()));
  CHECK(static_cast<double>(t->size()) == Approx(20.0 * 500).epsilon(0.03));
  auto none = gamma_arrivals(0.0, 1.0, 0.0, 10.0, 7);
  REQUIRE(none);
  CHECK(none->empty());
}

TEST_CASE("the same seed gives the same arrivals and another seed others", "[workload]") {
  gamma_workload w{{"a", "b", "c"}, {10, 1, 1}, 4.0, 30.0, 9};
  auto s1 = generate(w);
  auto s2 = generate(w);
  REQUIRE(s1);
  REQUIRE(s2);
  REQUIRE(s1->arrivals.size() == s2->arrivals.size());
  for (size_t i = 0; i < s1->arrivals.size(); ++i) {
    CHECK(s1->arrivals[i].time_s == s2->arrivals[i].time_s);
    CHECK(s1->arrivals[i].model == s2->arrivals[i].model);
  }
  w.seed = 10;
  auto s3 = generate(w);
  REQUIRE(s3);
  CHECK((s3->arrivals.size() != s1->arrivals.size() ||
         s3->arrivals.front().time_s != s1->arrivals.front().time_s));
  CHECK(std::is_sorted(s1->arrivals.begin(), s1->arrivals.end(),
                       [](auto& x, auto& y) { return x.time_s < y.time_s; }));
}

TEST_CASE("each model has its own stream: adding a model keeps the others", "[workload]") {
  auto two = generate({{"a", "b"}, {5, 5}, 1.0, 20.0, 3});
  auto three = generate({{"a", "b", "c"}, {5, 5, 5}, 1.0, 20.0, 3});
  REQUIRE(two);
  REQUIRE(three);
  auto times_of = [](const schedule& s, uint32_t m) {
    std::vector<double> out;
    for (auto& a : s.arrivals)
      if (a.model == m) out.push_back(a.time_s);
    return out;
  };
  CHECK(times_of(*two, 0) == times_of(*three, 0));
  CHECK(times_of(*two, 1) == times_of(*three, 1));
  CHECK(times_of(*three, 0) != times_of(*three, 1));
}

TEST_CASE("power-law and uniform rates share out the total", "[workload]") {
  auto p = power_law_rates(6, 12.0, 0.5);
  REQUIRE(p);
  CHECK(std::accumulate(p->begin(), p->end(), 0.0) == Approx(12.0));
  for (size_t i = 1; i < p->size(); ++i)
    CHECK((*p)[i] / (*p)[0] == Approx(std::pow(static_cast<double>(i + 1), -0.5)));
  auto u = uniform_rates(4, 2.0);
  REQUIRE(u);
  CHECK(*u == std::vector<double>{0.5, 0.5, 0.5, 0.5});
  CHECK(!power_law_rates(0, 1.0, 0.5));
  CHECK(!power_law_rates(3, -1.0, 0.5));
  CHECK(!power_law_rates(3, 1.0, -0.5));
}

TEST_CASE("bad workloads are refused with the field named", "[workload]") {
  auto msg = [](const gamma_workload& w) {
    auto s = generate(w);
    REQUIRE(!s);
    return render(s.error());
  };
  CHECK_THAT(msg({{"a", "b"}, {1, -1}, 1.0, 10.0, 1}), Catch::Contains("rate of b"));
  CHECK_THAT(msg({{"a"}, {1}, -1.0, 10.0, 1}), Catch::Contains("cv must be 0 or more"));
  CHECK_THAT(msg({{"a"}, {1}, 1.0, 0.0, 1}), Catch::Contains("duration"));
  CHECK_THAT(msg({{"a", "b"}, {1}, 1.0, 10.0, 1}), Catch::Contains("1 rates for 2 models"));
  CHECK_THAT(msg({{"a", "a"}, {1, 1}, 1.0, 10.0, 1}), Catch::Contains("named twice"));
  CHECK_THAT(msg({{}, {}, 1.0, 10.0, 1}), Catch::Contains("no models"));
  CHECK(!gamma_gaps::make(0.0, 1.0, 1));
  CHECK(!gamma_gaps::make(1.0, std::nan(""), 1));
}

TEST_CASE("a trace is read with optional columns comments and a header", "[workload]") {
  std::istringstream in{
      "time_s,model,prompt_len,max_tokens\n"
      "# a comment\n"
      "0.5,b,16,2\n"
      "\n"
      "0.25, a\n"
      "1.0,a,,3\n"};
  auto s = parse_trace(in, "t.csv");
  REQUIRE(s);
  REQUIRE(s->arrivals.size() == 3);
  CHECK(s->models == std::vector<std::string>{"b", "a"});
  CHECK(s->arrivals[0].time_s == 0.25);
  CHECK(s->models[s->arrivals[0].model] == "a");
  CHECK(s->arrivals[0].prompt_len == 0);
  CHECK(s->arrivals[1].prompt_len == 16);
  CHECK(s->arrivals[1].max_tokens == 2);
  CHECK(s->arrivals[2].prompt_len == 0);
  CHECK(s->arrivals[2].max_tokens == 3);
  CHECK(s->duration_s > 1.0);
  // Round trip through the writer.
  std::ostringstream out;
  write_trace(out, *s);
  std::istringstream again{out.str()};
  auto s2 = parse_trace(again, "again");
  REQUIRE(s2);
  CHECK(s2->arrivals.size() == 3);
  CHECK(s2->arrivals[1].prompt_len == 16);
}

TEST_CASE("malformed trace lines are refused with the line number", "[workload]") {
  auto msg = [](const std::string& text) {
    std::istringstream in{text};
    auto s = parse_trace(in, "t.csv");
    REQUIRE(!s);
    return render(s.error());
  };
  CHECK_THAT(msg("0.1,a\nzero,b\n"), Catch::Contains("t.csv line 2: time 'zero'"));
  CHECK_THAT(msg("-1,a\n"), Catch::Contains("line 1: time '-1'"));
  CHECK_THAT(msg("0.1\n"), Catch::Contains("line 1: expected time_s,model"));
  CHECK_THAT(msg("0.1,a,4,4,4\n"), Catch::Contains("5 columns"));
  CHECK_THAT(msg("0.1,a,x\n"), Catch::Contains("prompt_len 'x'"));
  CHECK_THAT(msg("0.1,a,4,0\n"), Catch::Contains("max_tokens '0'"));
  CHECK_THAT(msg("0.1,,4\n"), Catch::Contains("model name is empty"));
  CHECK_THAT(msg("# nothing\n"), Catch::Contains("no arrivals"));
}

TEST_CASE("a trace naming unknown models is refused", "[workload]") {
  std::istringstream in{"0.1,a\n0.2,zz\n0.3,yy\n"};
  auto s = parse_trace(in, "t.csv");
  REQUIRE(s);
  CHECK(!check_models(*s, {"a", "zz", "yy"}));
  auto err = check_models(*s, {"a", "b"});
  REQUIRE(err);
  CHECK(err.code() == static_cast<uint8_t>(ec::unknown_model));
  CHECK_THAT(render(err), Catch::Contains("unknown models zz, yy (the server has: a, b)"));
}

TEST_CASE("lists of names and numbers are parsed strictly", "[workload]") {
  auto names = split_list("a, b,c", "--models");
  REQUIRE(names);
  CHECK(*names == std::vector<std::string>{"a", "b", "c"});
  CHECK(!split_list("a,,b", "--models"));
  CHECK(!split_list("a,", "--models"));
  auto nums = parse_numbers("10,1,0.5", "--rates");
  REQUIRE(nums);
  CHECK(*nums == std::vector<double>{10, 1, 0.5});
  auto bad = parse_numbers("10,x", "--rates");
  REQUIRE(!bad);
  CHECK_THAT(render(bad.error()), Catch::Contains("--rates: 'x' is not a number"));
}

TEST_CASE("percentiles interpolate between order statistics", "[workload]") {
  std::vector<double> xs;
  for (int i = 100; i >= 1; --i) xs.push_back(i);  // unsorted on purpose
  CHECK(percentile(xs, 0.5) == Approx(50.5));
  CHECK(percentile(xs, 0.9) == Approx(90.1));
  CHECK(percentile(xs, 0.99) == Approx(99.01));
  CHECK(percentile(xs, 0.0) == 1);
  CHECK(percentile(xs, 1.0) == 100);
  CHECK(percentile({}, 0.5) == 0);
  CHECK(percentile({7}, 0.99) == 7);
  auto s = summarize(xs, 25.0);
  CHECK(s.count == 100);
  CHECK(s.mean == Approx(50.5));
  CHECK(s.p99 == Approx(99.01));
  CHECK(s.max == 100);
  CHECK(s.slo_attainment == Approx(0.25));
  CHECK(summarize(xs).slo_attainment == 1);
}
