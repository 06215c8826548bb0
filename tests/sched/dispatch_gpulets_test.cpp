// The dispatch core's gpu-lets fed scripted events: the gate guards lanes, a fixed
// partition spreads models over them, an automatic plan moves models once they drained,
// and the shared time rule.
#include <catch2/catch.hpp>

#include "sched/dispatch.hpp"

using namespace computron;
using namespace computron::sched;
using namespace std::chrono_literals;

namespace {

lease_info resident(time_point t) {
  return {t, false, 0, 0, std::nullopt};
}

/// Two one-device models "a" and "b" on device 0 (and "c" on both devices).
struct lanes_fixture {
  std::unique_ptr<dispatcher> d;
  time_point t{};
  uint32_t a = 0, b = 0;

  explicit lanes_fixture(gpulet_config g) {
    batching_options o;
    o.batch_window = 0ms;
    o.max_batch_size = 4;
    o.default_deadline = 10s;
    o.continuous = false;
    refusal why;
    d = dispatcher::make(o, 2, &why, std::move(g));
    REQUIRE(d);
    a = d->add_model("a", 1, 1, {0}, 0);
    b = d->add_model("b", 1, 1, {0}, 0);
  }

  /// Admits one request of `m` and leases its batch: the batch id, and whether it started.
  std::pair<batch_id, bool> run(uint32_t m, uint64_t key) {
    auto e = d->admit(m, key, t, 0);
    REQUIRE(e.formed.size() == 1);
    auto id = e.formed[0].id;
    auto l = d->leased(id, resident(t), t);
    return {id, l.started.size() == 1};
  }
};

}  // namespace

TEST_CASE("gpu-lets: two models on lanes of one device run at the same time", "[gpulets][cores]") {
  gpulet_config g;
  g.partitions = {{50, 50}};
  lanes_fixture f{g};
  // The fewest-models rule spreads them, and device 1 stays whole.
  CHECK(f.d->lanes_of(f.a) == std::vector<int32_t>{0});
  CHECK(f.d->lanes_of(f.b) == std::vector<int32_t>{1});
  CHECK(f.d->share_of(f.a, 0) == 50);
  CHECK(f.d->partitions() == std::vector<std::vector<int32_t>>{{50, 50}, {100}});
  CHECK(f.run(f.a, 1).second);
  CHECK(f.run(f.b, 2).second);  // its own lane: no wait for a's batch
}

TEST_CASE("gpu-lets: without them the second model waits for the device", "[gpulets][cores]") {
  lanes_fixture f{{}};
  CHECK(f.d->lanes_of(f.b) == std::vector<int32_t>{0});
  CHECK(f.d->share_of(f.b, 0) == 100);
  auto [ida, started] = f.run(f.a, 1);
  CHECK(started);
  auto [idb, b_started] = f.run(f.b, 2);
  CHECK_FALSE(b_started);
  auto e = f.d->batch_done(ida, f.t, true, 0.01, 1);
  REQUIRE(e.started.size() == 1);
  CHECK(e.started[0].id == idb);
}

TEST_CASE("gpu-lets: a third model shares a lane in time", "[gpulets][cores]") {
  gpulet_config g;
  g.partitions = {{60, 40}};
  lanes_fixture f{g};
  auto c = f.d->add_model("c", 1, 1, {0}, 0);
  CHECK(f.d->lanes_of(c) == std::vector<int32_t>{0});  // ties go to the lowest lane
  auto [ida, a_started] = f.run(f.a, 1);
  CHECK(a_started);
  CHECK(f.run(f.b, 2).second);
  auto [idc, c_started] = f.run(c, 3);
  CHECK_FALSE(c_started);  // a holds lane 0
  auto e = f.d->batch_done(ida, f.t, true, 0.01, 1);
  REQUIRE(e.started.size() == 1);
  CHECK(e.started[0].id == idc);
}

TEST_CASE("gpu-lets: configs that cannot be carried out are refused, naming why",
          "[gpulets][cores]") {
  batching_options o;
  refusal why;
  gpulet_config g;
  g.partitions = {{80, 40}};
  CHECK_FALSE(dispatcher::make(o, 1, &why, g));
  CHECK_THAT(why.reason, Catch::Contains("sum to 120"));
  g.partitions = {{30, 70}};
  CHECK_FALSE(dispatcher::make(o, 1, &why, g));
  CHECK_THAT(why.reason, Catch::Contains("share 30"));
  g.partitions = {{50, 50}, {100}};
  CHECK_FALSE(dispatcher::make(o, 1, &why, g));
  CHECK_THAT(why.reason, Catch::Contains("2 partitions for 1 devices"));
  g.partitions = {{20, 20, 60}};
  CHECK_FALSE(dispatcher::make(o, 1, &why, g));
  CHECK_THAT(why.reason, Catch::Contains("at most 2"));
  g.partitions = {{20, 20, 60}};
  g.plan.max_per_device = 3;
  CHECK(dispatcher::make(o, 1, &why, g));
}

TEST_CASE("gpu-lets: an automatic plan splits the device and moves a model once it drained",
          "[gpulets][cores]") {
  gpulet_config g;
  g.automatic = true;
  g.replan_s = 1;
  lanes_fixture f{g};
  CHECK(f.d->partitions() == std::vector<std::vector<int32_t>>{{100}, {100}});
  // a: long steps, a loose SLO; b: short steps that must not wait behind a's.
  f.d->set_profile(f.a, {{100, {0.2, 0}}}, 5.0);
  f.d->set_profile(f.b, {{100, {0.01, 0}}}, 0.15);
  auto first = f.d->admit(f.a, 1, f.t, 0);
  REQUIRE(first.ticks.size() >= 1);  // the re-plan is armed
  auto id = first.formed.at(0).id;
  REQUIRE(f.d->leased(id, resident(f.t), f.t).started.size() == 1);
  uint64_t key = 2;
  for (int i = 0; i < 4; ++i) {
    f.t += 100ms;
    auto e = f.d->admit(f.b, key++, f.t, 0);
    for (auto& x : e.formed) f.d->leased(x.id, resident(f.t), f.t);
  }
  f.t += 700ms;
  auto e = f.d->tick(f.t);
  // a still runs: the plan waits for it (and b, on the same lane, for nothing new).
  REQUIRE(f.d->pending_plan());
  CHECK_FALSE(e.gpulets_changed);
  CHECK(f.d->partitions()[0] == std::vector<int32_t>{100});
  // A request of the model that moves forms its batch once the running one ended (one
  // batch in flight per stage), and runs on the new lanes.
  auto more = f.d->admit(f.a, key++, f.t, 0);
  CHECK(more.formed.empty());
  e = f.d->batch_done(id, f.t, true, 0.2, 1);
  CHECK(e.gpulets_changed);
  REQUIRE(e.formed.size() == 1);
  CHECK(f.d->leased(e.formed[0].id, resident(f.t), f.t).started.size() == 1);
  CHECK_FALSE(f.d->pending_plan());
  REQUIRE(f.d->partitions()[0].size() == 2);
  CHECK(f.d->lanes_of(f.a) != f.d->lanes_of(f.b));
  CHECK(f.d->share_of(f.a, 0) + f.d->share_of(f.b, 0) <= 100);
}

TEST_CASE("gpu-lets: a step takes its share's time, more while partners are busy",
          "[gpulets][cores]") {
  gpulet_options o;
  o.interference = 1.2;
  CHECK(gpulet_seconds(o, 0.01, 100, 0) == Approx(0.01));
  CHECK(gpulet_seconds(o, 0.01, 50, 0) == Approx(0.02));
  CHECK(gpulet_seconds(o, 0.01, 50, 0.5) == Approx(0.022));
  CHECK(gpulet_seconds(o, 0.01, 50, 3) == Approx(0.024));  // busy counts up to all of it
}

TEST_CASE("gpu-lets: within a fixed partition the short-step models get a lane of their own",
          "[gpulets][cores]") {
  gpulet_options o;
  o.device_count = 1;
  auto model = [](std::string name, double step_s, double slo_s, double rate) {
    gpulet_model m;
    m.name = std::move(name);
    m.devices = {0};
    m.rate = rate;
    m.slo_s = slo_s;
    m.cost[100] = {step_s, 0};
    return m;
  };
  std::vector<gpulet_model> ms{model("big", 0.08, 2.0, 2), model("s0", 0.005, 0.06, 4),
                               model("s1", 0.005, 0.06, 2)};
  auto p = plan_lanes({{60, 40}}, ms, o);
  CHECK(p.partitions == std::vector<std::vector<int32_t>>{{60, 40}});
  CHECK(p.lane.at("s0") == p.lane.at("s1"));
  CHECK(p.lane.at("big") != p.lane.at("s0"));
  CHECK(p.at_risk.empty());
  // All on one lane, the short steps wait behind the long ones: what the plan avoids.
  gpulet_plan together = p;
  for (auto& [name, l] : together.lane) l = {0};
  CHECK_FALSE(evaluate_plan(together, ms, o).at_risk.empty());
}

TEST_CASE("gpu-lets: an unregistered model no longer counts where models are spread",
          "[gpulets][cores]") {
  gpulet_config g;
  g.partitions = {{50, 50}};
  lanes_fixture f{g};  // a on lane 0, b on lane 1
  auto c = f.d->add_model("c", 1, 1, {0}, 0);
  CHECK(f.d->lanes_of(c) == std::vector<int32_t>{0});
  f.d->remove_model(f.a);
  f.d->remove_model(c);
  auto d = f.d->add_model("d", 1, 1, {0}, 0);
  CHECK(f.d->lanes_of(d) == std::vector<int32_t>{0});  // lane 0 holds nobody now
}

TEST_CASE("gpu-lets: a re-plan armed behind an earlier tick is armed again by it",
          "[gpulets][cores]") {
  gpulet_config g;
  g.automatic = true;
  g.replan_s = 1;
  batching_options o;
  o.batch_window = 5ms;
  refusal why;
  auto d = dispatcher::make(o, 1, &why, g);
  REQUIRE(d);
  auto a = d->add_model("a", 1, 1, {0}, 0);
  auto b = d->add_model("b", 1, 1, {0}, 0);
  time_point t{};
  d->admit(a, 1, t, 0);                    // arms the re-plan at 1 s, and a's window
  d->tick(t + 6ms);                        // a's batch forms (it waits for a lease from here on)
  d->admit(b, 2, t + 999ms, 0);            // b's window tick at 1.004 s
  d->tick(t + 1s);                         // the re-plan; b's window tick stays armed
  auto e = d->admit(a, 3, t + 1001ms, 0);  // the next re-plan, due at 2 s, is behind it
  for (auto at : e.ticks) CHECK(at < t + 1500ms);
  e = d->tick(t + 1005ms);
  bool replan_armed = false;
  for (auto at : e.ticks) replan_armed = replan_armed || (at >= t + 2s && at < t + 2100ms);
  CHECK(replan_armed);
}
