#include <catch2/catch.hpp>

#include "actors/worker_guard.hpp"
#include "common/error.hpp"
#include "tests/support/deterministic.hpp"

using namespace computron;
using namespace computron::actors;
using computron::testing::deterministic_fixture;
using computron::testing::fake_worker;
using computron::testing::fake_worker_script;

namespace {

struct guard_fixture : deterministic_fixture {
  fake_worker_script script;
  shard_worker_actor worker;
  worker_guard_actor guard;

  guard_fixture() {
    script.holder = sys.spawn(computron::testing::load_holder);
    worker = sys.spawn(fake_worker, &script, 0);
    worker_guard_options o;
    o.device_index = 5;
    o.node = "10.0.0.9:7001";
    guard = spawn_worker_guard(sys, worker, o).value();
  }

  ~guard_fixture() {
    caf::anon_send_exit(script.holder, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(guard, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
  }
};

model_config model(const std::string& name) {
  model_config m;
  m.name = name;
  m.kind = "toy";
  m.devices = {5};
  return m;
}

}  // namespace

TEST_CASE("a worker guard relays and renumbers the worker's replies", "[actors][guard]") {
  guard_fixture f;
  auto r = f.ask<shard_report>(f.guard, prepare_atom_v, shard_spec{model("a"), 0, 0, {}});
  REQUIRE(r);
  CHECK(r->device == 5);  // the controller's numbering, not the node's
  auto t = f.ask<transfer_report>(f.guard, load_atom_v, std::string{"a"});
  REQUIRE(t);
  CHECK(t->device == 5);
  CHECK(f.script.loads["a"] == 1);
  auto d = f.ask<device_report>(f.guard, devices_atom_v);
  REQUIRE(d);
  CHECK(d->node == "10.0.0.9:7001");
  CHECK(d->online);
}

TEST_CASE("a worker guard fails what is in flight when its worker dies and rebinds later",
          "[actors][guard]") {
  guard_fixture f;
  REQUIRE(f.ask<shard_report>(f.guard, prepare_atom_v, shard_spec{model("a"), 0, 0, {}}));
  f.script.hanging.insert("a");
  auto pending =
      f.self->request(f.guard, caf::timespan{std::chrono::hours(1)}, load_atom_v, std::string{"a"});
  f.sched.run();
  REQUIRE(f.self->mailbox().empty());  // the load hangs on the worker
  caf::anon_send_exit(f.worker, caf::exit_reason::kill);
  f.sched.run();
  REQUIRE_FALSE(f.self->mailbox().empty());  // answered without any timeout
  caf::error got;
  std::move(pending).receive([](transfer_report&) {}, [&](caf::error& e) { got = e; });
  CHECK(is(got, ec::unavailable));
  CHECK(render(got).find("10.0.0.9:7001") != std::string::npos);
  // Meanwhile it answers at once, and reports the device offline.
  auto again = f.ask<transfer_report>(f.guard, load_atom_v, std::string{"a"});
  REQUIRE_FALSE(again);
  CHECK(is(again.error(), ec::unavailable));
  auto d = f.ask<device_report>(f.guard, devices_atom_v);
  REQUIRE(d);
  CHECK_FALSE(d->online);
  // The node restarted: the guard prepares the shard on the new worker, starts it clean
  // (evicted), and relays again.
  f.script.hanging.clear();
  f.worker = f.sys.spawn(fake_worker, &f.script, 0);
  auto back = f.ask<bool>(f.guard, rebind_atom_v, f.worker);
  REQUIRE(back);
  CHECK(*back);
  CHECK(f.script.evictions["a"] == 1);
  CHECK(f.ask<transfer_report>(f.guard, load_atom_v, std::string{"a"}));
}
