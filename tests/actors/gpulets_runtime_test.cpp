// Gpu-lets on the real stack over one emulated device: two models on two lanes compute at
// the same time, each at its share's speed; without gpu-lets they take turns. A GPU's
// gpu-lets (green contexts) are checked at start and its steps ask for their lane's stream,
// shown here with a stand-in that calls itself a GPU.
#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <mutex>
#include <set>

#include "actors/node.hpp"
#include "common/error.hpp"
#include "tests/support/batch_spans.hpp"
#include "tests/support/stream_device.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;

namespace {

/// Every batch's span.

/// One emulated device, toy models "a" and "b" on it, whose steps take `step_ms` on the
/// whole device.
struct lanes_runtime {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::shared_ptr<test::batch_spans> log = std::make_shared<test::batch_spans>();
  runtime rt;

  explicit lanes_runtime(sched::gpulet_config g, double step_ms = 40) {
    runtime_options o;
    o.obs = log;
    o.devices.kind = "emulated";
    o.devices.count = 1;
    o.devices.emulated_capacity_bytes = 16ull << 20;
    o.devices.emulated_link_gbps = 1.0;
    o.manager.batching.batch_window = 0ms;
    o.manager.gpulets = std::move(g);
    rt = start_runtime(sys, o, torch_free_engines()).value();
    for (auto name : {"a", "b"}) {
      model_config m;
      m.name = name;
      m.kind = "toy";
      m.devices = {0};
      m.toy_compute_ms = step_ms;
      bool ok = false;
      self->request(rt.registry, 30s, register_atom_v, m)
          .receive([&](model_info&) { ok = true; }, [](caf::error& e) { FAIL(render(e)); });
      REQUIRE(ok);
      // Resident before the measured requests: their steps are compute only.
      self->request(rt.manager, 30s, load_atom_v, std::string{name})
          .receive([](model_info&) {}, [](caf::error& e) { FAIL(render(e)); });
    }
    // One request each, one after the other: every lane's thread runs before the measured
    // pair, whose steps then start together.
    for (auto name : {"a", "b"}) one(name);
    log->clear();
  }

  infer_reply one(const char* model) {
    infer_request r;
    r.model = model;
    r.tokens = {1, 2};
    r.max_tokens = 1;
    infer_reply out;
    self->request(rt.frontend, 30s, infer_atom_v, r)
        .receive([&](infer_reply& x) { out = std::move(x); },
                 [](caf::error& e) { FAIL(render(e)); });
    return out;
  }
  ~lanes_runtime() { rt.shutdown(); }

  /// One request each to a and b at once; their replies.
  std::vector<infer_reply> both() {
    std::vector<infer_reply> out;
    auto send = [&](const char* m) {
      infer_request r;
      r.model = m;
      r.tokens = {1, 2};
      r.max_tokens = 1;
      return self->request(rt.frontend, 30s, infer_atom_v, r);
    };
    auto a = send("a");
    auto b = send("b");
    for (auto* h : {&a, &b})
      std::move(*h).receive([&](infer_reply& x) { out.push_back(std::move(x)); },
                            [](caf::error& e) { FAIL(render(e)); });
    return out;
  }
};

}  // namespace

TEST_CASE("two models on gpu-lets of one device compute at once, each at its share",
          "[actors][gpulets]") {
  sched::gpulet_config g;
  g.partitions = {{50, 50}};
  g.plan.interference = 1.0;
  // 200 ms steps: the two overlap unless the second starts 400 ms after the first, far
  // more than a sanitizer beside other tests delays it.
  lanes_runtime f{g, 200};
  auto replies = f.both();
  REQUIRE(replies.size() == 2);
  // Half the device: twice the whole device's 200 ms.
  for (auto& r : replies) CHECK(r.compute_ms >= 398);
  CHECK(test::overlap(f.log->of("a"), f.log->of("b")));
}

TEST_CASE("without gpu-lets the same two models take turns on the device", "[actors][gpulets]") {
  lanes_runtime f{{}};
  auto replies = f.both();
  REQUIRE(replies.size() == 2);
  for (auto& r : replies) CHECK(r.compute_ms >= 38);
  CHECK_FALSE(test::overlap(f.log->of("a"), f.log->of("b")));
}

TEST_CASE("busy partners slow an emulated gpu-let by the interference factor",
          "[actors][gpulets]") {
  sched::gpulet_config g;
  g.partitions = {{50, 50}};
  g.plan.interference = 1.5;
  // 200 ms steps, as above: the later step sees its partner busy for most of it unless it
  // starts over 100 ms late.
  lanes_runtime f{g, 200};
  auto replies = f.both();
  REQUIRE(replies.size() == 2);
  // Both ran side by side: the later one saw its partner busy for most of its step.
  double slowest = std::max(replies[0].compute_ms, replies[1].compute_ms);
  CHECK(slowest >= 400 * 1.3);
}

TEST_CASE("the planner's step costs leave out the slowdown busy partners caused",
          "[actors][gpulets]") {
  sched::gpulet_config g;
  g.partitions = {{50, 50}};
  // A large factor, so that a profile with the slowdown counted in stands far from one
  // without it, whatever a loaded machine adds to every step.
  g.plan.interference = 6.0;
  lanes_runtime f{g};
  double slowest = 0;
  // Eight rounds: the fixture's warm-up step (alone, so nothing is taken off a delay it
  // met) is one step in nine of the mean the planner learns.
  for (int i = 0; i < 8; ++i)
    for (auto& r : f.both()) slowest = std::max(slowest, r.compute_ms);
  // Side by side, a step took up to six times its 80 ms alone at half the device...
  CHECK(slowest >= 240);
  caf::settings report;
  f.self->request(f.rt.manager, 10s, report_atom_v)
      .receive([&](caf::settings& s) { report = std::move(s); },
               [](caf::error& e) { FAIL(render(e)); });
  auto models = caf::get_if<caf::config_value::list>(&report, "manager.models");
  REQUIRE(models);
  int seen = 0;
  for (auto& v : *models) {
    auto m = caf::get_if<caf::settings>(&v);
    REQUIRE(m);
    auto steps = caf::get_if<caf::config_value::list>(&*m, "gpulet-steps");
    REQUIRE(steps);
    REQUIRE(steps->size() == 1);
    auto at = caf::get_if<caf::settings>(&steps->front());
    REQUIRE(at);
    CHECK(caf::get_or(*at, "share", int64_t{0}) == 50);
    // ... but what the planner learns is its cost alone there (a prompt of 2 tokens), to
    // which it adds the interference of the partners each plan gives it.
    double ms = caf::get_or(*at, "fixed-ms", 0.0) + 2 * caf::get_or(*at, "per-token-ms", 0.0);
    INFO(caf::get_or(*m, "model", std::string{}) << ": " << ms << " ms at 50%");
    CHECK(ms >= 70);
    // (Counted twice, the eight steps beside a busy partner would make the mean 300 ms or
    // more; a loaded machine, or a sanitizer, adds some to every step: 164 ms, where the
    // factor was 3, in one ASan CI run beside other tests.)
    CHECK(ms <= 240);
    ++seen;
  }
  CHECK(seen == 2);
}

TEST_CASE("a GPU's gpu-lets are checked at start: missing green contexts and small shares refused",
          "[actors][gpulets]") {
  sched::gpulet_config g;
  g.partitions = {{50, 50}};
  auto missing = make_error(ec::device_error, "cuGreenCtxCreate is missing");
  auto without = std::make_shared<test::stream_device>(16ull << 20, missing);
  auto err = prepare_gpulets({without}, g);
  REQUIRE(err);
  CHECK_THAT(render(err), Catch::Contains("devices.gpulets on device 0 (cuda:0 (stand-in))") &&
                              Catch::Contains("cuGreenCtxCreate is missing"));
  // Without gpu-lets the same GPU starts.
  CHECK_FALSE(prepare_gpulets({without}, {}));
  // A fixed partition's streams are made at start, side by side.
  auto gpu = std::make_shared<test::stream_device>(16ull << 20);
  g.partitions = {{30, 70}};
  CHECK_FALSE(prepare_gpulets({gpu}, g));
  using asks = std::vector<std::pair<std::vector<int32_t>, size_t>>;
  CHECK(gpu->asked() == asks{{{30, 70}, 0}, {{30, 70}, 1}});
  // A share too small for the GPU's smallest green context.
  g.partitions = {{3, 97}};
  err = prepare_gpulets({gpu}, g);
  REQUIRE(err);
  CHECK_THAT(render(err), Catch::Contains("3%"));
  // "auto" tries its smallest share; emulated devices need nothing.
  sched::gpulet_config a;
  a.automatic = true;
  a.plan.shares = {2, 50, 100};
  CHECK(prepare_gpulets({gpu}, a));
  gpu::device_options d;
  d.kind = "emulated";
  d.count = 1;
  CHECK_FALSE(prepare_gpulets(gpu::open_devices(d).value(), a));
}

TEST_CASE("a GPU's gpu-let steps ask for their lane's stream in the device's partition",
          "[actors][gpulets]") {
  for (bool split : {true, false}) {
    system_config cfg;
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    auto gpu = std::make_shared<test::stream_device>(16ull << 20);
    auto node = spawn_node(sys, {gpu}, torch_free_engines(), {}).value();
    runtime_options o;
    o.manager.batching.batch_window = 0ms;
    if (split) o.manager.gpulets.partitions = {{30, 70}};
    o.manager.gpulets.plan.shares = {30, 70, 100};
    auto started =
        start_runtime_over(sys, o, torch_free_engines(),
                           {{node.workers[0], 16ull << 20, 8.0, gpu::device_kind::cuda}});
    INFO((started ? std::string{} : render(started.error())));
    REQUIRE(started);
    auto rt = *started;
    for (auto name : {"a", "b"}) {
      model_config m;
      m.name = name;
      m.kind = "toy";
      m.devices = {0};
      m.toy_compute_ms = 5;
      self->request(rt.registry, 30s, register_atom_v, m)
          .receive([](model_info&) {}, [](caf::error& e) { FAIL(render(e)); });
      infer_request r;
      r.model = name;
      r.tokens = {1, 2};
      r.max_tokens = 2;
      self->request(rt.frontend, 30s, infer_atom_v, r)
          .receive([](infer_reply&) {}, [](caf::error& e) { FAIL(render(e)); });
    }
    auto asked = gpu->asked();
    std::set<std::pair<std::vector<int32_t>, size_t>> distinct(asked.begin(), asked.end());
    if (split)
      // One model on each gpu-let of the device's partition.
      CHECK(distinct ==
            std::set<std::pair<std::vector<int32_t>, size_t>>{{{30, 70}, 0}, {{30, 70}, 1}});
    else
      // The whole GPU runs on its default stream: no gpu-let asked for.
      CHECK(asked.empty());
    rt.shutdown();
    caf::anon_send_exit(node.node, caf::exit_reason::user_shutdown);
    for (auto& w : node.workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  }
}
