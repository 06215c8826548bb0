#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <chrono>
#include <thread>

#include "actors/node.hpp"
#include "common/error.hpp"
#include "gpu/backends.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;

namespace {

/// One shard worker on one emulated device, with the toy engine.
struct worker_fixture {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  gpu::device_ptr dev;
  shard_worker_actor worker;

  explicit worker_fixture(std::chrono::milliseconds step_timeout = 10s) {
    gpu::device_options d;
    d.kind = "emulated";
    d.count = 1;
    d.emulated_capacity_bytes = 8ull << 20;
    d.emulated_link_gbps = 100;
    dev = gpu::open_devices(d).value().at(0);
    shard_worker_options o;
    o.step_timeout = step_timeout;
    o.load_timeout = step_timeout;
    worker = spawn_shard_worker(sys, dev, torch_free_engines(), o).value();
  }

  ~worker_fixture() { caf::anon_send_exit(worker, caf::exit_reason::user_shutdown); }

  static model_config toy(const std::string& name, double compute_ms) {
    model_config m;
    m.name = name;
    m.kind = "toy";
    m.devices = {0};
    m.seed = 1;
    m.toy_shard_bytes = 1 << 20;
    m.toy_compute_ms = compute_ms;
    return m;
  }

  template <class T, class... Ts>
  caf::expected<T> ask(Ts&&... xs) {
    caf::expected<T> out{caf::make_error(caf::sec::request_timeout)};
    self->request(worker, 30s, std::forward<Ts>(xs)...)
        .receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  static step_request prefill(const std::string& model, uint64_t batch) {
    step_request r;
    r.model = model;
    r.input = engine::prefill_step(batch, {{3, 1, 4}}, {row_sampling{}});
    r.input.last = true;
    return r;
  }
};

}  // namespace

TEST_CASE("an eviction waits for a step still computing on the shard, and the step ends well",
          "[actors][worker]") {
  worker_fixture f;
  REQUIRE(
      f.ask<shard_report>(prepare_atom_v, shard_spec{worker_fixture::toy("slow", 400), 0, 0, {}}));
  REQUIRE(f.ask<transfer_report>(load_atom_v, std::string{"slow"}));
  REQUIRE(f.dev->mapped_pages() > 0);
  // The step computes for 400 ms; the eviction comes 100 ms in, while it does (a lease
  // that ended early: a step timeout or a cancel at the manager). A lane that had not
  // started the step by then (a loaded machine, as in CI's sanitizer trees) lets the
  // eviction through, rightly, and the step then finds its shard gone: a clean error.
  // That round is tried again, a few times at most, until the eviction meets the step.
  bool met = false;
  for (uint64_t round = 1; round <= 4 && !met; ++round) {
    if (round > 1) REQUIRE(f.ask<transfer_report>(load_atom_v, std::string{"slow"}));
    const auto sent = std::chrono::steady_clock::now();
    auto step = f.self->request(f.worker, 30s, step_atom_v, worker_fixture::prefill("slow", round));
    std::this_thread::sleep_for(100ms);
    auto evict = f.self->request(f.worker, 30s, evict_atom_v, std::string{"slow"});
    // The eviction's answer first: it comes only once the step's 400 ms are over.
    double evicted_after = 0;
    std::move(evict).receive(
        [&](transfer_report&) {
          evicted_after =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
        },
        [&](caf::error& e) { FAIL_CHECK("the eviction failed: " << render(e)); });
    CHECK(f.dev->mapped_pages() == 0);
    caf::expected<step_result> r{caf::make_error(caf::sec::request_timeout)};
    std::move(step).receive([&](step_result& x) { r = std::move(x); },
                            [&](caf::error& e) { r = std::move(e); });
    if (!r) {
      INFO(render(r.error()));
      CHECK(is(r.error(), ec::not_resident));  // the eviction came first
      continue;
    }
    met = true;
    CHECK(r->tokens.size() == 1);  // the weights were still there when it read them
    CHECK(evicted_after >= 0.4);
  }
  REQUIRE(met);
  // The next step finds the shard offloaded: a clear error, and the worker goes on.
  auto late = f.ask<step_result>(step_atom_v, worker_fixture::prefill("slow", 20));
  REQUIRE_FALSE(late);
  CHECK(is(late.error(), ec::not_resident));
  REQUIRE(f.ask<transfer_report>(load_atom_v, std::string{"slow"}));
  auto again = f.ask<step_result>(step_atom_v, worker_fixture::prefill("slow", 30));
  REQUIRE(again);
  CHECK(again->tokens.size() == 1);
}

TEST_CASE("an eviction that a wedged step keeps out fails clearly and leaves the shard usable",
          "[actors][worker]") {
  // Steps and evictions may wait 150 + 150 ms; this step computes for 2.5 s.
  worker_fixture f{150ms};
  REQUIRE(f.ask<shard_report>(prepare_atom_v,
                              shard_spec{worker_fixture::toy("stuck", 2500), 0, 0, {}}));
  // The worker gives up on the step after 150 ms, while its lane still computes; the
  // eviction comes at 500 ms. A lane that had not started the step by then (a loaded
  // machine: CI run 11's sanitizer tree) lets the eviction through, rightly, and the step
  // then finds its shard gone: a clean error. That round is tried again, a few times at
  // most, until the eviction meets the step computing.
  caf::expected<transfer_report> evict{caf::make_error(caf::sec::request_timeout)};
  bool wedged = false;
  for (int round = 0; round < 4 && !wedged; ++round) {
    REQUIRE(f.ask<transfer_report>(load_atom_v, std::string{"stuck"}));
    auto step = f.self->request(f.worker, 30s, step_atom_v,
                                worker_fixture::prefill("stuck", 1 + static_cast<uint64_t>(round)));
    std::this_thread::sleep_for(500ms);
    evict = f.ask<transfer_report>(evict_atom_v, std::string{"stuck"});
    std::move(step).receive([](step_result&) { FAIL_CHECK("the step outlived its timeout"); },
                            [](caf::error&) {});
    wedged = !evict;
    if (!wedged) CHECK(f.dev->mapped_pages() == 0);
  }
  REQUIRE(wedged);
  CHECK(is(evict.error(), ec::unavailable));
  CHECK_THAT(render(evict.error()), Catch::Contains("still computes on device"));
  CHECK(f.dev->mapped_pages() > 0);  // nothing unmapped under the step
  // Once the step is done, the same eviction goes through (bounded: 2.5 s of compute).
  caf::expected<transfer_report> done{caf::make_error(caf::sec::request_timeout)};
  for (int i = 0; i < 40 && !done; ++i) {
    std::this_thread::sleep_for(100ms);
    done = f.ask<transfer_report>(evict_atom_v, std::string{"stuck"});
  }
  REQUIRE(done);
  CHECK(f.dev->mapped_pages() == 0);
  // Unregistering waits for steps as an eviction does; with none running it is prompt.
  REQUIRE(f.ask<transfer_report>(load_atom_v, std::string{"stuck"}));
  REQUIRE(f.ask<bool>(unregister_atom_v, std::string{"stuck"}));
  CHECK(f.dev->mapped_pages() == 0);
}

TEST_CASE("a load that comes while an eviction waits for a step loads after it",
          "[actors][worker]") {
  worker_fixture f;
  REQUIRE(
      f.ask<shard_report>(prepare_atom_v, shard_spec{worker_fixture::toy("back", 400), 0, 0, {}}));
  // As above, a round whose eviction came before the lane started the step (and so went
  // through) is tried again.
  bool met = false;
  for (uint64_t round = 1; round <= 4 && !met; ++round) {
    REQUIRE(f.ask<transfer_report>(load_atom_v, std::string{"back"}));
    auto step =
        f.self->request(f.worker, 30s, step_atom_v, worker_fixture::prefill("back", 10 + round));
    std::this_thread::sleep_for(100ms);
    // The shard is still resident when the load comes (the eviction waits for the step):
    // answering it at once would leave the model offloaded where the scheduler counts it
    // resident, and every later step would fail (a frozen node's queued eviction did this).
    auto evict = f.self->request(f.worker, 30s, evict_atom_v, std::string{"back"});
    auto load = f.self->request(f.worker, 30s, load_atom_v, std::string{"back"});
    caf::expected<step_result> r{caf::make_error(caf::sec::request_timeout)};
    std::move(step).receive([&](step_result& x) { r = std::move(x); },
                            [&](caf::error& e) { r = std::move(e); });
    std::move(evict).receive(
        [](transfer_report&) {},
        [](caf::error& e) { FAIL_CHECK("the eviction failed: " << render(e)); });
    std::move(load).receive([](transfer_report&) {},
                            [](caf::error& e) { FAIL_CHECK("the load failed: " << render(e)); });
    if (r) {
      met = true;
    } else {
      INFO(render(r.error()));
      CHECK(is(r.error(), ec::not_resident));  // the eviction came first
    }
    // Either way the load came last: the shard is resident.
    CHECK(f.dev->mapped_pages() > 0);
  }
  REQUIRE(met);
  CHECK(f.dev->mapped_pages() > 0);
  auto again = f.ask<step_result>(step_atom_v, worker_fixture::prefill("back", 2));
  REQUIRE(again);
  CHECK(again->tokens.size() == 1);
}
