// The model manager under CAF's test coordinator: its clock moves only when the test
// says, so batch windows, queue times and deadlines are exact, with no sleeps.
#include <catch2/catch.hpp>

#include "actors/model_manager.hpp"
#include "actors/swap_scheduler.hpp"
#include "common/error.hpp"
#include "tests/support/deterministic.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;
using computron::testing::deterministic_fixture;
using computron::testing::fake_worker;
using computron::testing::fake_worker_script;

namespace {

/// One fake worker (loads and steps answer at once), a scheduler and a manager with a
/// 5 ms batch window and batches of up to 4.
struct manager_fixture : deterministic_fixture {
  fake_worker_script script;
  shard_worker_actor worker;
  swap_scheduler_actor scheduler;
  model_manager_actor manager;

  manager_fixture() {
    script.holder = sys.spawn(computron::testing::load_holder);
    worker = sys.spawn(fake_worker, &script, 0);
    swap_scheduler_options so;
    scheduler = spawn_swap_scheduler(sys, {{worker, 100 << 20, 10.0}}, so).value();
    model_manager_options mo;
    mo.max_batch_size = 4;
    mo.batch_window = 5ms;
    mo.default_deadline = 1s;
    manager = spawn_model_manager(sys, {worker}, scheduler, torch_free_engines(), mo).value();
    model_config m;
    m.name = "m";
    m.kind = "toy";
    m.devices = {0};
    REQUIRE(ask<model_info>(manager, register_atom_v, m));
  }

  ~manager_fixture() {
    for (auto a : {caf::actor_cast<caf::actor>(manager), caf::actor_cast<caf::actor>(scheduler),
                   caf::actor_cast<caf::actor>(worker), script.holder})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  auto send(int64_t deadline_ms = 0) {
    infer_request r;
    r.model = "m";
    r.tokens = {1, 2, 3};
    r.max_tokens = 1;
    r.deadline_ms = deadline_ms;
    return self->request(manager, caf::timespan{24h}, infer_atom_v, r);
  }

  bool replied() { return !self->mailbox().empty(); }
};

}  // namespace

TEST_CASE("a batch waits exactly its window on the actor clock, then goes with company",
          "[actors][manager]") {
  manager_fixture f;
  auto a = f.send();
  f.sched.run();
  f.sched.advance_time(3ms);
  auto b = f.send();
  f.sched.run();
  CHECK_FALSE(f.replied());  // the head's window (5 ms) is still open
  f.sched.advance_time(2ms);
  f.sched.run();
  CHECK_FALSE(f.replied());  // the tick fires 100 us after the window closes
  f.sched.advance_time(100us);
  f.sched.run();
  REQUIRE(f.replied());
  std::vector<infer_reply> got;
  for (auto* h : {&a, &b})
    std::move(*h).receive([&](infer_reply& r) { got.push_back(r); },
                          [](caf::error& e) { FAIL(render(e)); });
  REQUIRE(got.size() == 2);
  CHECK(got[0].batch_size == 2);
  CHECK(got[0].tokens == std::vector<int64_t>{7});
  // Virtual time: the first waited 5.1 ms in the queue, the second 2.1 ms.
  CHECK(got[0].queue_ms == Approx(5.1));
  CHECK(got[1].queue_ms == Approx(2.1));
  CHECK(got[0].swapped);  // the first batch loaded the model
}

TEST_CASE("a full batch goes at once and a request past its deadline fails in the queue",
          "[actors][manager]") {
  manager_fixture f;
  std::vector<decltype(f.send())> full;
  for (int i = 0; i < 4; ++i) full.push_back(f.send());
  f.sched.run();
  REQUIRE(f.replied());  // four fill a batch: no window
  for (auto& h : full)
    std::move(h).receive([&](infer_reply& r) { CHECK(r.queue_ms == 0); },
                         [](caf::error& e) { FAIL(render(e)); });
  auto late = f.send(2);  // a 2 ms deadline inside a 5 ms window
  f.sched.run();
  f.sched.advance_time(2ms);
  f.sched.run();
  f.sched.advance_time(100us);
  f.sched.run();
  REQUIRE(f.replied());
  std::move(late).receive([](infer_reply&) { FAIL("a late request was served"); },
                          [](caf::error& e) {
                            CHECK(is(e, ec::deadline_exceeded));
                            CHECK_THAT(render(e), Catch::Contains("in the queue of m"));
                          });
}
