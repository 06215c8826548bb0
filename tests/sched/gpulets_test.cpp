// The gpu-let planner (issue 31): its cost and lane model on hand-computed numbers, the
// plan's rules one by one (own gpu-lets, temporal sharing, same share across devices,
// growth against interference, limits), and what it is for: more rate within the SLOs
// than sharing whole devices in time.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "sched/gpulets.hpp"

using namespace computron::sched;

namespace {

/// Step costs at every allowed share, slower by (100/share)^exponent than at 100: 1 is
/// linear (an emulated device), below 1 a small model that does not fill the SMs.
std::map<int32_t, step_fit::line> costs(step_fit::line at_100, double exponent) {
  std::map<int32_t, step_fit::line> c;
  for (int32_t s : {20, 40, 50, 60, 80, 100}) {
    const double f = std::pow(100.0 / s, exponent);
    c[s] = {at_100.fixed_s * f, at_100.per_token_s * f};
  }
  return c;
}

/// A one-shot model measured at 100 only (other shares scale linearly).
gpulet_model model(std::string name, std::vector<int32_t> devices, double rate, double slo_s,
                   step_fit::line at_100) {
  gpulet_model m;
  m.name = std::move(name);
  m.devices = std::move(devices);
  m.rate = rate;
  m.slo_s = slo_s;
  m.cost = {{100, at_100}};
  return m;
}

gpulet_options options(int32_t devices) {
  gpulet_options o;
  o.device_count = devices;
  return o;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

/// The highest factor on all rates (in steps of 2%) at which `plan` leaves no model at risk.
template <class Plan>
double capacity_scale(std::vector<gpulet_model> models, const gpulet_options& o, Plan plan) {
  double best = 0;
  for (double k = 0.05; k < 50; k *= 1.02) {
    auto scaled = models;
    for (auto& m : scaled) m.rate *= k;
    auto p = plan(scaled, o);
    bool all_meet = p.at_risk.empty();
    for (auto& m : scaled) all_meet = all_meet && p.predicted_latency_s.at(m.name) <= m.slo_s;
    if (all_meet) best = k;
  }
  return best;
}

}  // namespace

TEST_CASE("gpulets: an unmeasured share scales from the nearest measured one above", "[gpulets]") {
  gpulet_model m = model("m", {0}, 0, 0, {0.001, 0.0001});
  m.cost[50] = {0.002, 0.0002};
  CHECK(step_at(m, 50).fixed_s == Approx(0.002));
  CHECK(step_at(m, 40).fixed_s == Approx(0.0025));  // from 50, not from 100
  CHECK(step_at(m, 40).per_token_s == Approx(0.00025));
  CHECK(step_at(m, 80).fixed_s == Approx(0.00125));  // from 100
  m.cost = {{20, {0.005, 0.0005}}};                  // nothing above: the nearest below
  CHECK(step_at(m, 100).fixed_s == Approx(0.001));

  // One prefill of 4 x 10 tokens, then 4 decode steps of 4 rows: 5 x 1 ms + 4 x 0.1 ms x 14.
  m.cost = {{100, {0.001, 0.0001}}};
  m.prompt_tokens = 10;
  m.output_tokens = 5;
  CHECK(round_s(m, step_at(m, 100), 4) == Approx(0.0106));
  CHECK(service_s(m, 100, 4) == Approx(0.0106 / 4));
  CHECK(capacity_rps(m, 100, 4) == Approx(4 / 0.0106));
  CHECK(capacity_rps(m, 50, 4) == Approx(2 / 0.0106));
}

TEST_CASE("gpulets: the lane model waits one cycle, then a round", "[gpulets]") {
  gpulet_options o = options(1);
  // 10 ms a round, 10 requests/s: batches of one row; the shortest cycle with 20%
  // headroom is 12.5 ms, so a request takes 12.5 + 10 ms and keeps the lane 10% busy.
  auto a = model("a", {0}, 10, 0, {0.010, 0});
  auto p = predict_alone(a, 100, 1.0, o.max_utilization);
  REQUIRE(p.keeps_up);
  CHECK(p.cycle_s == Approx(0.0125));
  CHECK(p.latency_s[0] == Approx(0.0225));
  CHECK(p.busy == Approx(0.1));
  CHECK(predict_alone(a, 50, 1.0, o.max_utilization).latency_s[0] == Approx(0.045));
  CHECK(predict_alone(a, 100, 1.5, o.max_utilization).latency_s[0] == Approx(0.03375));

  // 2 ms + 1 ms a row, 300 requests/s: batches of rows = 300 C, so 2 ms + 0.3 C <= 0.8 C.
  auto b = model("b", {0}, 300, 0, {0.002, 0.001});
  p = predict_alone(b, 100, 1.0, o.max_utilization);
  REQUIRE(p.keeps_up);
  CHECK(p.cycle_s == Approx(0.004));
  CHECK(p.rows[0] == Approx(1.2));
  CHECK(p.latency_s[0] == Approx(0.004 + 0.002 + 0.0012));
  CHECK(p.busy == Approx(0.8));

  // Sharing in time: each waits for the other's round too (12 ms + 0.3 C <= 0.8 C).
  p = predict_lane({{&a, step_at(a, 100)}, {&b, step_at(b, 100)}}, o.max_utilization);
  REQUIRE(p.keeps_up);
  CHECK(p.cycle_s == Approx(0.024));
  CHECK(p.rows[0] == 1);
  CHECK(p.rows[1] == Approx(7.2));
  CHECK(p.latency_s[0] == Approx(0.024 + 0.010));
  CHECK(p.latency_s[1] == Approx(0.024 + 0.002 + 0.0072));

  // Past what full batches serve: no cycle, no finite latency, busy past 1.
  b.rate = 1000;
  p = predict_alone(b, 100, 1.0, o.max_utilization);
  CHECK_FALSE(p.keeps_up);
  CHECK(std::isinf(p.latency_s[0]));
  CHECK(p.busy == Approx(1000 * 0.010 / 8));

  CHECK(interference_slowdown(o, 0) == 1.0);
  CHECK(interference_slowdown(o, 0.5) == Approx(1.075));
  CHECK(interference_slowdown(o, 3) == Approx(1.15));
}

TEST_CASE("gpulets: a step's wait on a gpu-let is scaled by its share and the plan's factor",
          "[gpulets]") {
  // The manager's wait for a step and the worker's for its lane both come from here.
  gpulet_options o;
  o.interference = 1.3;
  using std::chrono::milliseconds;
  CHECK(gpulet_timeout(o, milliseconds{1000}, 100) == milliseconds{1000});
  CHECK(gpulet_timeout(o, milliseconds{1000}, 50) == milliseconds{2600});
  CHECK(gpulet_timeout(o, milliseconds{1000}, 25) == milliseconds{5200});
  o.interference = 1;
  CHECK(gpulet_timeout(o, milliseconds{1000}, 50) == milliseconds{2000});
  // What an emulated lane waits out, by the same factor: partners busy half the time.
  o.interference = 1.3;
  CHECK(gpulet_seconds(o, 0.1, 50, 0.5) == Approx(0.1 * 2 * 1.15));
}

TEST_CASE("gpulets: the smallest share is monotone in rate and minimal", "[gpulets]") {
  gpulet_options o = options(1);
  auto m = model("m", {0}, 0, 0.2, {0.004, 0.0005});
  m.prompt_tokens = 16;
  std::optional<int32_t> last = 0;
  std::set<int32_t> seen;
  bool ran_out = false;
  for (double rate = 1; rate < 2000; rate *= 1.1) {
    m.rate = rate;
    auto s = min_share(m, o);
    if (!s) {
      ran_out = true;
      continue;
    }
    CHECK_FALSE(ran_out);  // once even the whole device misses, it keeps missing
    CHECK(*s >= *last);
    last = s;
    seen.insert(*s);
    auto p = predict_alone(m, *s, 1.0, o.max_utilization);
    CHECK((p.keeps_up && p.latency_s[0] <= m.slo_s));
    if (*s > 20) {  // the next smaller allowed share misses
      auto below = std::prev(std::find(o.shares.begin(), o.shares.end(), *s));
      auto q = predict_alone(m, *below, 1.0, o.max_utilization);
      CHECK_FALSE((q.keeps_up && q.latency_s[0] <= m.slo_s));
    }
  }
  CHECK(seen.size() >= 4);
  CHECK(ran_out);
}

TEST_CASE("gpulets: a best-effort model with a low rate gets the smallest share", "[gpulets]") {
  gpulet_options o = options(1);
  auto light = model("light", {0}, 1, 0, {0.010, 0});
  CHECK(min_share(light, o) == 20);
  // Beside a model that needs 80, it gets the 20 that is left.
  auto heavy = model("heavy", {0}, 30, 0, {0.0005, 0.02});  // 20 ms a row
  REQUIRE(min_share(heavy, o) == 80);
  auto p = plan_gpulets({light, heavy}, o);
  CHECK(p.partitions[0] == std::vector<int32_t>{80, 20});
  CHECK(p.share.at("light") == 20);
  CHECK(p.at_risk.empty());
  CHECK(p.temporal.empty());
}

TEST_CASE("gpulets: two light models on one device get a gpu-let each", "[gpulets]") {
  gpulet_options o = options(1);
  auto a = model("a", {0}, 20, 0.05, {0.005, 0});
  auto b = model("b", {0}, 20, 0.05, {0.005, 0});
  auto p = plan_gpulets({a, b}, o);
  CHECK(p.partitions[0] == std::vector<int32_t>{50, 50});
  CHECK(p.lane.at("a") != p.lane.at("b"));
  CHECK(p.temporal.empty());
  CHECK(p.at_risk.empty());
  CHECK(p.predicted_latency_s.at("a") <= a.slo_s);
  CHECK(p.predicted_latency_s.at("b") <= b.slo_s);
  // Interference counted: a little slower than alone at 50.
  CHECK(p.predicted_latency_s.at("a") > predict_alone(a, 50, 1.0, o.max_utilization).latency_s[0]);
}

TEST_CASE("gpulets: a heavy model gets the whole device, the others share it in time",
          "[gpulets]") {
  gpulet_options o = options(1);
  auto heavy = model("heavy", {0}, 70, 0.2, {0.001, 0.01});  // 10 ms a row
  REQUIRE(min_share(heavy, o) == 100);
  auto x = model("x", {0}, 1, 0.5, {0.005, 0});
  auto y = model("y", {0}, 1, 0.5, {0.005, 0});
  auto p = plan_gpulets({x, heavy, y}, o);
  CHECK(p.partitions[0] == std::vector<int32_t>{100});
  CHECK(p.temporal == std::vector<std::string>{"x", "y"});
  CHECK(p.lane.at("x") == p.lane.at("heavy"));
  CHECK(p.at_risk.empty());
  for (auto& m : {heavy, x, y}) CHECK(p.predicted_latency_s.at(m.name) <= m.slo_s);
}

TEST_CASE("gpulets: a model that fits nowhere alone joins where every SLO still holds",
          "[gpulets]") {
  gpulet_options o = options(1);
  o.interference = 1.0;
  auto tight = model("tight", {0}, 1, 0.06, {0.010, 0});  // 56 ms alone at 40
  auto busy = model("busy", {0}, 180, 0, {0.002, 0.001});
  busy.max_batch = 16;
  auto late = model("late", {0}, 1, 0.5, {0.005, 0});
  REQUIRE(min_share(tight, o) == 40);
  REQUIRE(min_share(busy, o) == 40);
  REQUIRE(min_share(late, o) == 20);
  auto p = plan_gpulets({tight, busy, late}, o);
  // The least busy gpu-let, and the one where late would wait least, is tight's, whose
  // SLO a partner in time would break.
  REQUIRE(p.partitions[0].size() == 2);
  CHECK(p.lane.at("late") == p.lane.at("busy"));
  CHECK(p.lane.at("late") != p.lane.at("tight"));
  CHECK(p.temporal == std::vector<std::string>{"late"});
  CHECK(p.at_risk.empty());
}

TEST_CASE("gpulets: a tensor-parallel model gets the same share on both its devices", "[gpulets]") {
  gpulet_options o = options(2);
  auto tp = model("tp", {1, 0}, 10, 0.07, {0.010, 0});  // needs 40
  auto p0 = model("p0", {0}, 20, 0, {0.0005, 0.02});    // need 60
  auto p1 = model("p1", {1}, 20, 0, {0.0005, 0.02});
  REQUIRE(min_share(tp, o) == 40);
  REQUIRE(min_share(p0, o) == 60);
  auto p = plan_gpulets({tp, p0, p1}, o);
  const auto& l = p.lane.at("tp");
  REQUIRE(l.size() == 2);
  CHECK(p.partitions[1][l[0]] == 40);
  CHECK(p.partitions[0][l[1]] == 40);
  CHECK(p.share.at("tp") == 40);
  CHECK(p.at_risk.empty());
  // Alone on device 0, its gpu-let there takes the whole device; its steps still run at
  // device 1's share.
  p = plan_gpulets({tp, p1}, o);
  CHECK(p.partitions[0] == std::vector<int32_t>{100});
  CHECK(p.partitions[1] == std::vector<int32_t>{60, 40});
  CHECK(p.share.at("tp") == 40);
}

TEST_CASE("gpulets: interference that breaks an SLO grows the gpu-let", "[gpulets]") {
  gpulet_options o = options(1);
  auto tight = model("tight", {0}, 1, 0.06, {0.010, 0});  // 56 ms alone at 40
  auto busy = model("busy", {0}, 200, 0, {0.002, 0.001});
  REQUIRE(min_share(tight, o) == 40);
  REQUIRE(min_share(busy, o) == 40);
  o.interference = 1.0;
  auto calm = plan_gpulets({tight, busy}, o);
  CHECK(calm.share.at("tight") == 40);  // the leftover went to the busy one
  CHECK(calm.at_risk.empty());
  o.interference = 1.5;
  auto p = plan_gpulets({tight, busy}, o);
  REQUIRE(p.partitions[0].size() == 2);
  CHECK(p.share.at("tight") > 40);
  CHECK(p.predicted_latency_s.at("tight") <= tight.slo_s);
  CHECK(p.at_risk.empty());
  // At 40, beside a partner that busy, it would miss.
  const double slow = interference_slowdown(o, p.utilization.at("busy"));
  CHECK(predict_alone(tight, 40, slow, o.max_utilization).latency_s[0] > tight.slo_s);
}

TEST_CASE("gpulets: max_per_device is respected", "[gpulets]") {
  std::vector<gpulet_model> ms;
  for (auto n : {"a", "b", "c", "d", "e"}) ms.push_back(model(n, {0}, 5, 0.2, {0.005, 0}));
  for (int32_t max : {1, 2, 3}) {
    gpulet_options o = options(1);
    o.max_per_device = max;
    auto p = plan_gpulets(ms, o);
    CHECK(p.partitions[0].size() == static_cast<size_t>(max));
    for (auto& m : ms) CHECK(p.lane.at(m.name)[0] < max);
    CHECK(p.temporal.size() == ms.size() - max);
    CHECK(p.at_risk.empty());
  }
}

TEST_CASE("gpulets: partitions use allowed shares, fill the device, and do not depend on order",
          "[gpulets]") {
  // A fixed pseudo-random sequence (the test's own), so any failure repeats.
  uint64_t state = 12345;
  auto next = [&](double lo, double hi) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * static_cast<double>(state >> 11) / 9007199254740992.0;
  };
  const std::set<int32_t> allowed{20, 40, 50, 60, 80, 100};
  for (int round = 0; round < 150; ++round) {
    gpulet_options o = options(1 + static_cast<int32_t>(next(0, 3)));
    o.max_per_device = 1 + static_cast<int32_t>(next(0, 3));
    std::vector<gpulet_model> ms;
    const int n = 2 + static_cast<int>(next(0, 6));
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> devs{static_cast<int32_t>(next(0, o.device_count))};
      if (o.device_count > 1 && next(0, 1) < 0.3) devs.push_back((devs[0] + 1) % o.device_count);
      auto m = model("m" + std::to_string(i), devs, next(0, 80),
                     next(0, 1) < 0.2 ? 0 : next(0.02, 0.3), {next(0.001, 0.01), next(0, 0.0002)});
      m.prompt_tokens = next(1, 64);
      m.cost = costs(m.cost[100], next(0.2, 1));
      ms.push_back(m);
    }
    REQUIRE_FALSE(check_gpulet_inputs(ms, o));
    auto p = plan_gpulets(ms, o);
    REQUIRE(p.partitions.size() == static_cast<size_t>(o.device_count));
    for (auto& part : p.partitions) {
      CHECK(part.size() <= static_cast<size_t>(o.max_per_device));
      int32_t sum = 0;
      for (auto s : part) {
        CHECK(allowed.count(s) == 1);
        sum += s;
      }
      CHECK(sum == 100);  // these shares can always fill it
    }
    for (auto& m : ms) {
      const auto& l = p.lane.at(m.name);
      REQUIRE(l.size() == m.devices.size());
      for (size_t k = 0; k < l.size(); ++k) {
        REQUIRE(l[k] >= 0);
        REQUIRE(static_cast<size_t>(l[k]) < p.partitions[m.devices[k]].size());
        CHECK(p.share.at(m.name) <= p.partitions[m.devices[k]][l[k]]);
      }
      CHECK(contains(p.at_risk, m.name) == (m.slo_s > 0
                                                ? p.predicted_latency_s.at(m.name) > m.slo_s
                                                : std::isinf(p.predicted_latency_s.at(m.name))));
    }
    auto reversed = ms;
    std::reverse(reversed.begin(), reversed.end());
    auto q = plan_gpulets(reversed, o);
    CHECK(q.partitions == p.partitions);
    CHECK(q.lane == p.lane);
    CHECK(q.predicted_latency_s == p.predicted_latency_s);
    CHECK(plan_changes(p, q).empty());
  }
}

TEST_CASE("gpulets: temporal_plan puts every model on one gpu-let per device", "[gpulets]") {
  gpulet_options o = options(3);
  auto p =
      temporal_plan({model("a", {0}, 5, 0.1, {0.005, 0}), model("b", {0, 1}, 5, 0.1, {0.005, 0}),
                     model("c", {2}, 5, 0.1, {0.005, 0})},
                    o);
  CHECK(p.partitions == std::vector<std::vector<int32_t>>{{100}, {100}, {100}});
  CHECK(p.lane.at("a") == std::vector<int32_t>{0});
  CHECK(p.lane.at("b") == std::vector<int32_t>{0, 0});
  CHECK(p.lane.at("c") == std::vector<int32_t>{0});
  CHECK(p.temporal == std::vector<std::string>{"a", "b"});  // c has device 2 to itself
  CHECK(p.at_risk.empty());
}

TEST_CASE("gpulets: plan_changes lists exactly the models that moved", "[gpulets]") {
  gpulet_plan from;
  from.partitions = {{50, 50}, {100}};
  from.lane = {{"a", {0}}, {"b", {1}}, {"c", {0}}, {"d", {0, 0}}, {"gone", {1}}};
  from.devices = {{"a", {0}}, {"b", {0}}, {"c", {1}}, {"d", {0, 1}}, {"gone", {0}}};
  auto to = from;
  CHECK(plan_changes(from, to).empty());
  to.partitions = {{60, 40}, {100}};  // every share on device 0 changes; c's stays
  CHECK(plan_changes(from, to) == std::vector<std::string>{"a", "b", "d", "gone"});
  to = from;
  to.lane["c"] = {0};  // same lane index, but it stays; nothing else moved
  CHECK(plan_changes(from, to).empty());
  to.lane["a"] = {1};  // a moves to b's gpu-let (same share)
  to.lane.erase("gone");
  to.devices.erase("gone");
  to.lane["new"] = {0};
  to.devices["new"] = {1};
  CHECK(plan_changes(from, to) == std::vector<std::string>{"a", "gone", "new"});
}

TEST_CASE("gpulets: check_gpulet_inputs names the bad field and its value", "[gpulets]") {
  gpulet_options o = options(2);
  std::vector<gpulet_model> ok{model("a", {0}, 5, 0.1, {0.005, 0}),
                               model("b", {0, 1}, 5, 0.1, {0.005, 0})};
  CHECK_FALSE(check_gpulet_inputs(ok, o));
  auto has = [](const std::optional<refusal>& why, const std::string& what) {
    if (!why) return false;
    INFO(why->reason);
    return why->code == computron::ec::invalid_configuration &&
           why->reason.find(what) != std::string::npos;
  };
  auto bad = ok;
  bad[1].devices = {0, 2};
  CHECK(has(check_gpulet_inputs(bad, o), "models[1] ('b').devices[1] = 2"));
  bad = ok;
  bad[0].rate = -1;
  CHECK(has(check_gpulet_inputs(bad, o), "('a').rate = -1"));
  bad = ok;
  bad[0].slo_s = std::numeric_limits<double>::infinity();
  CHECK(has(check_gpulet_inputs(bad, o), "('a').slo_s = inf"));
  bad = ok;
  bad[1].rate = std::nan("");
  CHECK(has(check_gpulet_inputs(bad, o), "('b').rate = nan"));
  bad = ok;
  bad[1].cost.clear();
  CHECK(has(check_gpulet_inputs(bad, o), "('b').cost is empty"));
  bad = ok;
  bad[1].cost[120] = {0.001, 0};
  CHECK(has(check_gpulet_inputs(bad, o), "('b').cost[120]"));
  bad = ok;
  bad[1].name = "a";
  CHECK(has(check_gpulet_inputs(bad, o), "('a').name: also models[0]"));
  bad = ok;
  bad[0].devices = {1, 1};
  CHECK(has(check_gpulet_inputs(bad, o), "devices[1] = 1: listed twice"));
  auto bo = o;
  bo.shares = {20, 120};
  CHECK(has(check_gpulet_inputs(ok, bo), "shares[1] = 120"));
  bo = o;
  bo.shares = {0};
  CHECK(has(check_gpulet_inputs(ok, bo), "shares[0] = 0"));
  bo = o;
  bo.device_count = 0;
  CHECK(has(check_gpulet_inputs(ok, bo), "device_count = 0"));
  bo = o;
  bo.max_utilization = 1.5;
  CHECK(has(check_gpulet_inputs(ok, bo), "max_utilization = 1.5"));
  bo = o;
  bo.interference = 0.5;
  CHECK(has(check_gpulet_inputs(ok, bo), "interference = 0.5"));
  // A plan of bad inputs is empty rather than half made.
  CHECK(plan_gpulets(bad, o).partitions.empty());
}

TEST_CASE("gpulets: a skewed workload of small models gets 1.5x the rate of time sharing",
          "[gpulets]") {
  gpulet_options o = options(2);
  // Eight small one-shot models of 32 prompt tokens, four per device, rates skewed 30:1.
  // Measured at each share like small models on a real GPU: at half the SMs a step takes
  // (100/50)^0.3 = 1.23x as long, as they do not fill the SMs (Gpu-let's observation).
  std::vector<gpulet_model> ms;
  const std::vector<std::pair<std::string, double>> rates{
      {"a", 60}, {"b", 30}, {"c", 10}, {"d", 5}, {"e", 40}, {"f", 20}, {"g", 8}, {"h", 2}};
  for (size_t i = 0; i < rates.size(); ++i) {
    auto m = model(rates[i].first, {i < 4 ? 0 : 1}, rates[i].second, 0.05, {0.004, 0.00005});
    m.prompt_tokens = 32;
    m.cost = costs({0.004, 0.00005}, 0.3);
    ms.push_back(m);
  }
  const double spatial = capacity_scale(ms, o, plan_gpulets);
  const double in_time = capacity_scale(ms, o, temporal_plan);
  INFO("gpu-lets serve " << spatial << "x the rates, time sharing " << in_time << "x");
  CHECK(in_time >= 1);
  CHECK(spatial >= 1.5 * in_time);

  // Where a share's speed scales linearly (an emulated device), splitting gains nothing:
  // the planner then falls back to time sharing rather than serve less.
  for (auto& m : ms) m.cost = costs({0.004, 0.00005}, 1.0);
  CHECK(capacity_scale(ms, o, plan_gpulets) >= capacity_scale(ms, o, temporal_plan));
}
