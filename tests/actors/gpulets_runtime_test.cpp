// Gpu-lets on the real stack over one emulated device: two models on two lanes compute at
// the same time, each at its share's speed; without gpu-lets they take turns. A CUDA
// device with gpu-lets is refused at start, naming what is missing.
#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <mutex>

#include "actors/node.hpp"
#include "common/error.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;

namespace {

/// Every batch's span.
struct spans final : observer {
  struct span {
    std::string model;
    double start_s = 0, seconds = 0;
  };
  std::mutex mtx;
  std::vector<span> all;
  void batch_done(const std::string& m, const std::vector<int32_t>&, const std::vector<int32_t>&,
                  size_t, double start, double s) override {
    std::lock_guard<std::mutex> g{mtx};
    all.push_back({m, start, s});
  }
  span of(const std::string& m) {
    std::lock_guard<std::mutex> g{mtx};
    for (auto& x : all)
      if (x.model == m) return x;
    return {};
  }
};

/// One emulated device, toy models "a" and "b" of 40 ms steps on it.
struct lanes_runtime {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::shared_ptr<spans> log = std::make_shared<spans>();
  runtime rt;

  explicit lanes_runtime(sched::gpulet_config g) {
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
      m.toy_compute_ms = 40;
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
    std::lock_guard<std::mutex> hold{log->mtx};
    log->all.clear();
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

bool overlap(const spans::span& x, const spans::span& y) {
  return x.start_s < y.start_s + y.seconds && y.start_s < x.start_s + x.seconds;
}

}  // namespace

TEST_CASE("two models on gpu-lets of one device compute at once, each at its share",
          "[actors][gpulets]") {
  sched::gpulet_config g;
  g.partitions = {{50, 50}};
  g.plan.interference = 1.0;
  lanes_runtime f{g};
  auto replies = f.both();
  REQUIRE(replies.size() == 2);
  // Half the device: twice the whole device's 40 ms.
  for (auto& r : replies) CHECK(r.compute_ms >= 78);
  CHECK(overlap(f.log->of("a"), f.log->of("b")));
}

TEST_CASE("without gpu-lets the same two models take turns on the device", "[actors][gpulets]") {
  lanes_runtime f{{}};
  auto replies = f.both();
  REQUIRE(replies.size() == 2);
  for (auto& r : replies) CHECK(r.compute_ms >= 38);
  CHECK_FALSE(overlap(f.log->of("a"), f.log->of("b")));
}

TEST_CASE("busy partners slow an emulated gpu-let by the interference factor",
          "[actors][gpulets]") {
  sched::gpulet_config g;
  g.partitions = {{50, 50}};
  g.plan.interference = 1.5;
  lanes_runtime f{g};
  auto replies = f.both();
  REQUIRE(replies.size() == 2);
  // Both ran side by side: the later one saw its partner busy for most of its step.
  double slowest = std::max(replies[0].compute_ms, replies[1].compute_ms);
  CHECK(slowest >= 80 * 1.3);
}

TEST_CASE("gpu-lets on a CUDA device are refused at start, naming green contexts",
          "[actors][gpulets]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  gpu::device_options d;
  d.kind = "emulated";
  d.count = 1;
  auto devs = gpu::open_devices(d).value();
  auto node = spawn_node(sys, devs, torch_free_engines(), {}).value();
  runtime_options o;
  o.manager.gpulets.partitions = {{50, 50}};
  // The scheduler accounts the worker as a CUDA device.
  auto rt = start_runtime_over(sys, o, torch_free_engines(),
                               {{node.workers[0], 16ull << 20, 1.0, gpu::device_kind::cuda}});
  REQUIRE_FALSE(rt);
  CHECK_THAT(render(rt.error()), Catch::Contains("green contexts"));
  caf::anon_send_exit(node.node, caf::exit_reason::user_shutdown);
  for (auto& w : node.workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
}
