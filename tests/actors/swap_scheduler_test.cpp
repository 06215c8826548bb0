#include <catch2/catch.hpp>

#include "actors/swap_scheduler.hpp"
#include "common/error.hpp"
#include "tests/support/deterministic.hpp"

using namespace computron;
using namespace computron::actors;
using computron::testing::deterministic_fixture;
using computron::testing::fake_worker;
using computron::testing::fake_worker_script;

namespace {

constexpr uint64_t mb = 1 << 20;

/// Two devices of 100 MB; every model has one 40 MB shard on each (so two fit).
struct scheduler_fixture : deterministic_fixture {
  fake_worker_script script;
  std::vector<shard_worker_actor> workers;
  swap_scheduler_actor sched_actor;

  ~scheduler_fixture() {
    // Held promises keep actors alive: end them all, or ~actor_system waits forever.
    caf::anon_send_exit(script.holder, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(sched_actor, caf::exit_reason::user_shutdown);
    for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  }

  explicit scheduler_fixture(const std::string& policy = "lru", bool compute_while_loading = true) {
    script.holder = sys.spawn(computron::testing::load_holder);
    std::vector<scheduler_device> devs;
    for (int32_t d = 0; d < 2; ++d) {
      workers.push_back(sys.spawn(fake_worker, &script, d));
      devs.push_back({workers.back(), 100 * mb, 10.0});
    }
    swap_scheduler_options o;
    o.ledger.policy = policy;
    o.ledger.compute_while_loading = compute_while_loading;
    o.load_timeout = std::chrono::seconds(5);
    sched_actor = spawn_swap_scheduler(sys, devs, o).value();
  }

  void add(const std::string& name, uint64_t bytes = 40 * mb, bool pinned = false) {
    REQUIRE(ask<bool>(sched_actor, register_atom_v,
                      model_placement{name, {0, 1}, {bytes, bytes}, pinned})
                .value());
  }

  std::string state_of(const std::string& name) {
    auto st = ask<std::vector<residency_report>>(sched_actor, status_atom_v);
    if (!st) return "no status: " + caf::to_string(st.error());
    for (auto& r : *st)
      if (r.model == name) return to_string(r.state);
    return "missing";
  }

  caf::expected<lease> acquire(const std::string& name) {
    return ask<lease>(sched_actor, acquire_atom_v, name);
  }

  void release(const std::string& name) {
    self->send(sched_actor, release_atom_v, name);
    sched.run();
  }

  /// A batch on the model; the scheduler's clock (the test coordinator's) then moves on
  /// a millisecond, so recency is well defined.
  void use(const std::string& name) {
    REQUIRE(acquire(name));
    release(name);
    sched.advance_time(std::chrono::milliseconds(1));
  }
};

}  // namespace

TEST_CASE("LRU evicts the least recently used model counted in bytes", "[actors][scheduler]") {
  scheduler_fixture f{"lru"};
  f.add("a");
  f.add("b");
  f.add("c");
  f.use("a");
  f.use("b");
  f.use("a");  // a is now more recent than b
  f.use("c");
  CHECK(f.state_of("a") == "resident");
  CHECK(f.state_of("b") == "offloaded");
  CHECK(f.state_of("c") == "resident");
  CHECK(f.script.evictions["b"] == 2);  // one evict per device
  CHECK(f.script.evictions["a"] == 0);
}

TEST_CASE("small models fill the room one large model frees", "[actors][scheduler]") {
  scheduler_fixture f{"lru"};
  f.add("big", 90 * mb);
  f.add("s1", 30 * mb);
  f.add("s2", 30 * mb);
  f.add("s3", 30 * mb);
  f.use("s1");
  f.use("s2");
  f.use("s3");  // 90 MB of small models resident: counted in bytes, three fit
  CHECK(f.state_of("s1") == "resident");
  CHECK(f.state_of("s3") == "resident");
  f.use("big");  // needs all three gone
  CHECK(f.state_of("big") == "resident");
  CHECK(f.state_of("s1") == "offloaded");
  CHECK(f.state_of("s2") == "offloaded");
  CHECK(f.state_of("s3") == "offloaded");
}

TEST_CASE("the cost-aware policy keeps the model in demand even when LRU would evict it",
          "[actors][scheduler]") {
  for (std::string policy : {"lru", "cost"}) {
    scheduler_fixture f{policy};
    f.add("hot");
    f.add("cold");
    f.add("new");
    f.use("hot");
    f.self->send(f.sched_actor, demand_atom_v, std::string{"hot"}, uint32_t{100});
    f.use("cold");  // more recent than hot, but nobody asks for it
    f.use("new");
    INFO(policy);
    if (policy == "lru") {
      CHECK(f.state_of("hot") == "offloaded");
      CHECK(f.state_of("cold") == "resident");
    } else {
      CHECK(f.state_of("hot") == "resident");
      CHECK(f.state_of("cold") == "offloaded");
    }
  }
}

TEST_CASE("concurrent acquires of a loading model wait for one load", "[actors][scheduler]") {
  scheduler_fixture f{"lru", false};
  f.add("a");
  f.script.hanging.insert("a");
  auto h1 = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                            std::string{"a"});
  auto h2 = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                            std::string{"a"});
  f.sched.run();
  CHECK(f.state_of("a") == "loading");
  CHECK(f.script.loads["a"] == 2);  // one per device, not one per acquire
  f.self->send(f.script.holder, caf::ok_atom_v);
  f.sched.run();
  int leases = 0;
  for (auto* h : {&h1, &h2})
    std::move(*h).receive([&](lease& l) { leases += l.loaded ? 1 : 0; }, [&](caf::error&) {});
  CHECK(leases == 2);
  CHECK(f.script.loads["a"] == 2);
  CHECK(f.state_of("a") == "resident");
}

TEST_CASE("a leased model is never evicted and the load waits for the release",
          "[actors][scheduler]") {
  scheduler_fixture f;
  f.add("a");
  f.add("b");
  f.add("c");
  REQUIRE(f.acquire("a"));  // held
  REQUIRE(f.acquire("b"));  // held
  auto h = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                           std::string{"c"});
  f.sched.run();
  CHECK(f.state_of("c") == "offloaded");
  CHECK(f.script.evictions["a"] == 0);
  CHECK(f.script.evictions["b"] == 0);
  f.release("b");
  CHECK(f.state_of("b") == "offloaded");
  CHECK(f.state_of("c") == "resident");
  CHECK(f.state_of("a") == "resident");
  bool got = false;
  std::move(h).receive([&](lease& l) { got = l.model == "c"; }, [&](caf::error&) {});
  CHECK(got);
}

TEST_CASE("a victim in use drains: no new leases until the waiting load had its turn",
          "[actors][scheduler]") {
  scheduler_fixture f;
  f.add("a");
  f.add("b");
  f.add("c");
  REQUIRE(f.acquire("a"));  // held; a is the least recently used
  f.sched.advance_time(std::chrono::milliseconds(1));
  REQUIRE(f.acquire("b"));  // held
  auto hc = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                            std::string{"c"});
  f.sched.run();
  CHECK(f.state_of("c") == "offloaded");
  // A new batch of a would keep it leased for ever (overlapping batches): held back.
  auto ha = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                            std::string{"a"});
  f.sched.run();
  auto leases_of = [&](const std::string& name) {
    auto st = f.ask<std::vector<residency_report>>(f.sched_actor, status_atom_v);
    if (st)
      for (auto& r : *st)
        if (r.model == name) return r.leases;
    return uint32_t{99};
  };
  REQUIRE(leases_of("a") == 1);  // else the receives below would wait for ever
  // The first batch of a ends: a goes, c comes.
  f.release("a");
  CHECK(f.state_of("a") == "offloaded");
  CHECK(f.state_of("c") == "resident");
  bool c_loaded = false;
  std::move(hc).receive([&](lease& l) { c_loaded = l.loaded; }, [](caf::error&) {});
  CHECK(c_loaded);
  // a's held request now waits for a like any other, and gets it when room frees.
  f.release("b");
  CHECK(f.state_of("a") == "resident");
  bool a_loaded = false;
  std::move(ha).receive([&](lease& l) { a_loaded = l.loaded && l.model == "a"; },
                        [](caf::error&) {});
  CHECK(a_loaded);
}

TEST_CASE("a load that can never fit is refused before anything moves", "[actors][scheduler]") {
  scheduler_fixture f;
  // Larger than its devices: refused at registration, with the sizes, and never listed.
  auto huge = f.ask<bool>(f.sched_actor, register_atom_v,
                          model_placement{"huge", {0, 1}, {150 * mb, 150 * mb}, false});
  REQUIRE_FALSE(huge);
  CHECK(is(huge.error(), ec::out_of_device_memory));
  CHECK_THAT(render(huge.error()),
             Catch::Contains("model huge needs 150.0 MiB on device 0, which holds 100.0 MiB"));
  CHECK(f.state_of("huge") == "missing");
  auto r = f.acquire("huge");
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), ec::unknown_model));
  CHECK(f.script.loads["huge"] == 0);
  f.add("pinned", 60 * mb, true);
  f.add("fits-alone", 60 * mb);
  // A pinned model's bytes never free: 60 + 60 > 100 on each device.
  f.use("pinned");
  auto r2 = f.acquire("fits-alone");
  REQUIRE_FALSE(r2);
  CHECK(is(r2.error(), ec::out_of_device_memory));
  CHECK(f.state_of("pinned") == "resident");
  auto unknown = f.acquire("nope");
  REQUIRE_FALSE(unknown);
  CHECK(is(unknown.error(), ec::unknown_model));
}

TEST_CASE("a worker that fails a load fails only that model", "[actors][scheduler]") {
  scheduler_fixture f{"lru", false};
  f.add("bad");
  f.add("good");
  f.script.failing.insert("bad");
  auto r = f.acquire("bad");
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), ec::device_error));
  CHECK(render(r.error()).find("injected failure") != std::string::npos);
  CHECK(f.state_of("bad") == "offloaded");
  CHECK(f.acquire("good"));
  CHECK(f.state_of("good") == "resident");
  // The failed model's room was given back: the other one still fits next to good.
  f.script.failing.clear();
  CHECK(f.acquire("bad"));
}

TEST_CASE("the load join fails on a timeout and the model can load again", "[actors][scheduler]") {
  scheduler_fixture f{"lru", false};
  f.add("slow");
  f.script.hanging.insert("slow");
  auto h = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                           std::string{"slow"});
  f.sched.run();
  CHECK(f.state_of("slow") == "loading");
  f.sched.advance_time(std::chrono::seconds(6));  // past the 5 s load timeout
  f.sched.run();
  REQUIRE_FALSE(f.self->mailbox().empty());
  caf::error got;
  std::move(h).receive([](lease&) {}, [&](caf::error& e) { got = e; });
  CHECK(got);
  CHECK(f.state_of("slow") == "offloaded");
  f.script.hanging.clear();
  CHECK(f.acquire("slow"));
}

TEST_CASE("unload is refused under a lease and evicts otherwise", "[actors][scheduler]") {
  scheduler_fixture f;
  f.add("a");
  REQUIRE(f.acquire("a"));
  auto refused = f.ask<residency_report>(f.sched_actor, unload_atom_v, std::string{"a"});
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::invalid_state));
  f.release("a");
  auto ok = f.ask<residency_report>(f.sched_actor, unload_atom_v, std::string{"a"});
  REQUIRE(ok);
  CHECK(ok->state == model_lifecycle::offloaded);
  CHECK(f.script.evictions["a"] == 2);
}

TEST_CASE("a lost device makes its models unavailable and frees their other shards",
          "[actors][scheduler]") {
  scheduler_fixture f;
  f.add("a");
  f.use("a");
  REQUIRE(f.state_of("a") == "resident");
  auto used = [&](int32_t d) {
    auto u = f.ask<std::vector<device_usage>>(f.sched_actor, devices_atom_v);
    REQUIRE(u);
    return u->at(static_cast<size_t>(d)).used_bytes;
  };
  REQUIRE(used(0) == 40 * mb);
  f.self->send(f.sched_actor, lost_atom_v, std::vector<int32_t>{1});
  f.sched.run();
  CHECK(f.state_of("a") == "unavailable");
  CHECK(used(0) == 0);  // its shard on the surviving device was given back
  CHECK(f.script.evictions["a"] == 2);
  auto refused = f.acquire("a");
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::unavailable));
  auto load = f.ask<residency_report>(f.sched_actor, load_atom_v, std::string{"a"});
  REQUIRE_FALSE(load);
  CHECK(is(load.error(), ec::unavailable));
  // Back: it loads again on demand.
  f.self->send(f.sched_actor, found_atom_v, std::vector<int32_t>{1});
  f.sched.run();
  CHECK(f.state_of("a") == "offloaded");
  f.use("a");
  CHECK(f.state_of("a") == "resident");
  CHECK(f.script.loads["a"] == 4);
}

TEST_CASE("with compute while loading, leases come when the copies start, loads when they end",
          "[actors][scheduler]") {
  scheduler_fixture f;
  f.add("a");
  f.add("b");
  f.add("c");
  f.use("b");
  f.script.hanging.insert("a");
  auto h1 = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                            std::string{"a"});
  auto h2 = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                            std::string{"a"});
  auto explicit_load = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)},
                                       load_atom_v, std::string{"a"});
  f.sched.run();
  // Both leases are here while the copies still run; the explicit load still waits.
  CHECK(f.script.begins["a"] == 2);
  CHECK(f.state_of("a") == "loading");
  int granted = 0;
  for (auto* h : {&h1, &h2})
    std::move(*h).receive(
        [&](lease& l) {
          CHECK(l.loaded);
          CHECK(l.loading);
          CHECK(l.load_left_ms > 0);
          ++granted;
        },
        [&](caf::error& e) { FAIL(render(e)); });
  CHECK(granted == 2);
  CHECK(f.self->mailbox().empty());  // the explicit load has no answer yet
  // A third acquire while it loads is granted at once.
  auto third = f.acquire("a");
  REQUIRE(third);
  CHECK_FALSE(third->loaded);
  CHECK(third->loading);
  // It says what the load still takes (40 MiB at 10 GB/s, none of it elapsed), so the
  // manager can start the batch late enough not to hold the devices.
  CHECK(third->load_left_ms == Approx(40.0 * (1 << 20) / 10e9 * 1e3).epsilon(1e-6));
  // A loading model is no victim, leased or not: c's room comes from b.
  auto hc = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(1)}, acquire_atom_v,
                            std::string{"c"});
  f.sched.run();
  CHECK(f.state_of("a") == "loading");
  f.self->send(f.script.holder, caf::ok_atom_v);
  f.sched.run();
  CHECK(f.state_of("a") == "resident");
  CHECK(f.state_of("b") == "offloaded");  // the victim was b, never the leased a
  CHECK(f.state_of("c") == "resident");
  CHECK(f.script.loads["a"] == 2);
  bool loaded = false;
  std::move(explicit_load)
      .receive([&](residency_report& r) { loaded = r.state == model_lifecycle::resident; },
               [&](caf::error& e) { FAIL(render(e)); });
  CHECK(loaded);
  std::move(hc).receive([](lease&) {}, [&](caf::error& e) { FAIL(render(e)); });
  for (int i = 0; i < 3; ++i) f.release("a");
  f.release("c");
  // Three leases, three releases: a is free to go now.
  f.use("b");
  CHECK(f.state_of("a") == "offloaded");
}

TEST_CASE("a load a device refuses for room waits for it and is retried, not failed",
          "[actors][scheduler]") {
  // Issue 44: the ledger counted the room as free (a KV pool still held it): the lease
  // waits, the load is tried again on the scheduler's own timer, and the lease comes.
  scheduler_fixture f;
  f.add("a");
  f.script.failing_begin.insert("a");
  auto rh = f.self->request(f.sched_actor, caf::timespan{std::chrono::hours(24)}, acquire_atom_v,
                            std::string{"a"});
  f.sched.run();
  CHECK(f.script.begins["a"] >= 1);
  CHECK(f.state_of("a") == "offloaded");
  CHECK(f.self->mailbox().empty());  // no answer: the lease waits
  // Still refused at the next try (20 ms on): still waiting; then the room is there.
  f.sched.advance_time(std::chrono::milliseconds(25));
  f.sched.run();
  auto tries = f.script.begins["a"];
  CHECK(tries >= 2);
  CHECK(f.self->mailbox().empty());
  f.script.failing_begin.clear();
  f.sched.advance_time(std::chrono::milliseconds(100));
  f.sched.run();
  CHECK(f.script.begins["a"] > tries);
  bool leased = false;
  std::move(rh).receive([&](lease& l) { leased = l.model == "a"; },
                        [&](caf::error& e) { FAIL(render(e)); });
  CHECK(leased);
  f.release("a");
  CHECK(f.state_of("a") == "resident");
}

TEST_CASE(
    "with compute while loading, a load that fails to start on a device error fails its "
    "leases",
    "[actors][scheduler]") {
  scheduler_fixture f;
  f.add("a");
  f.script.failing_begin_error = ec::device_error;
  f.script.failing_begin.insert("a");
  auto refused = f.acquire("a");
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::device_error));
  CHECK(f.state_of("a") == "offloaded");
  CHECK(f.script.loads["a"] == 0);  // never got to the second half
  f.script.failing_begin.clear();
  CHECK(f.acquire("a"));
}

TEST_CASE("with compute while loading, a load that fails midway leaves a model that loads again",
          "[actors][scheduler]") {
  scheduler_fixture f;
  f.add("a");
  f.script.failing.insert("a");
  // The lease comes at the start; the copies then fail (the batch on it would fail by
  // itself, at its next layer).
  auto l = f.acquire("a");
  REQUIRE(l);
  CHECK(l->loading);
  CHECK(f.state_of("a") == "offloaded");
  f.release("a");
  f.script.failing.clear();
  f.use("a");
  CHECK(f.state_of("a") == "resident");
  CHECK(f.script.begins["a"] == 4);
}
