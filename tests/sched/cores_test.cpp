// The two decision cores fed scripted events: what each event must return, step by step.
// The drivers (actors, simulator) only carry these effects out; tests/actors/
// drivers_agree_test.cpp checks that they carry out the same ones.
#include <catch2/catch.hpp>

#include <algorithm>

#include "sched/dispatch.hpp"
#include "sched/residency.hpp"

using namespace computron;
using namespace computron::sched;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t mb = 1 << 20;

/// One device of 100 MB with room for one of two 60 MB models.
struct residency_fixture {
  std::unique_ptr<residency> core;
  time_point t{};
  model_id a = 0, b = 0;

  explicit residency_fixture(bool compute_while_loading = true) {
    refusal why;
    ledger_options o;
    o.compute_while_loading = compute_while_loading;
    core = residency::make({{100 * mb, 10}}, o, &why);
    REQUIRE(core);
    a = *core->ledger().add("a", {{0}, {60 * mb}, false, 0}, &why);
    b = *core->ledger().add("b", {{0}, {60 * mb}, false, 0}, &why);
  }

  model_state state(model_id m) const { return core->ledger().state_of(m); }
};

bool granted(const residency_effects& e, waiter_id w, bool loaded) {
  return std::any_of(e.grants.begin(), e.grants.end(),
                     [&](auto& g) { return g.waiter == w && g.loaded == loaded; });
}

}  // namespace

TEST_CASE("residency: a lease waits for the load's start, an explicit load for its end",
          "[cores]") {
  residency_fixture f;
  auto e = f.core->acquire(f.a, 1, f.t);
  CHECK(e.loads == std::vector<model_id>{f.a});
  CHECK(e.grants.empty());
  e = f.core->load(f.a, 2, f.t);
  CHECK(e.empty());  // already loading
  e = f.core->load_started(f.a, f.t);
  CHECK(granted(e, 1, true));
  CHECK(e.done.empty());
  e = f.core->load_done(f.a, f.t);
  CHECK(e.grants.empty());
  REQUIRE(e.done.size() == 1);
  CHECK(e.done[0].waiter == 2);
  CHECK(f.state(f.a) == model_state::resident);
  // Resident: granted at once, not a swap.
  e = f.core->acquire(f.a, 3, f.t);
  CHECK(granted(e, 3, false));
  CHECK(f.core->ledger().model(f.a).leases == 2);
}

TEST_CASE("residency: without compute while loading, leases wait for the whole load", "[cores]") {
  residency_fixture f{false};
  auto e = f.core->acquire(f.a, 1, f.t);
  REQUIRE(e.loads.size() == 1);
  CHECK(f.core->load_started(f.a, f.t).empty());
  e = f.core->load_done(f.a, f.t);
  CHECK(granted(e, 1, true));
}

TEST_CASE("residency: a drain holds new leases, the drained model comes back for them", "[cores]") {
  residency_fixture f;
  f.core->acquire(f.a, 1, f.t);
  f.core->load_started(f.a, f.t);
  f.core->load_done(f.a, f.t);
  // b needs a's room while a is leased: a drains, nothing starts yet.
  auto e = f.core->acquire(f.b, 2, f.t);
  CHECK(e.loads.empty());
  CHECK(e.evictions.empty());
  // A new lease on the draining a is held.
  e = f.core->acquire(f.a, 3, f.t);
  CHECK(e.empty());
  // a's last lease ends: it is evicted for b.
  bool ok = false;
  e = f.core->release(f.a, f.t, &ok);
  CHECK(ok);
  CHECK(e.evictions == std::vector<model_id>{f.a});
  e = f.core->evict_done(f.a, f.t);
  CHECK(e.loads == std::vector<model_id>{f.b});
  // The held lease waits for a to load again, behind b.
  e = f.core->load_started(f.b, f.t);
  CHECK(granted(e, 2, true));
  CHECK_FALSE(granted(e, 3, true));
  f.core->load_done(f.b, f.t);
  e = f.core->release(f.b, f.t, &ok);
  CHECK(e.evictions == std::vector<model_id>{f.b});
  e = f.core->evict_done(f.b, f.t);
  CHECK(e.loads == std::vector<model_id>{f.a});
  e = f.core->load_started(f.a, f.t);
  CHECK(granted(e, 3, true));
}

TEST_CASE("residency: a failed load discards its shards and fails its waiters", "[cores]") {
  residency_fixture f;
  f.core->acquire(f.a, 1, f.t);
  f.core->load(f.a, 2, f.t);
  auto e = f.core->load_failed(f.a, {ec::device_error, "boom"}, f.t);
  CHECK(e.discards == std::vector<model_id>{f.a});
  REQUIRE(e.failures.size() == 2);
  for (auto& x : e.failures) {
    CHECK(x.why.code == ec::device_error);
    CHECK(x.why.reason == "boom");
  }
  CHECK(f.state(f.a) == model_state::offloaded);
  CHECK(f.core->ledger().device(0).used_bytes == 0);
}

TEST_CASE(
    "residency: a device short of room the ledger counted waits and retries instead of failing",
    "[cores]") {
  // The ledger planned a's load into room a KV pool still held (or a discard had not yet
  // freed): the device refused it. Its requests wait; the load comes back after a pause
  // that doubles with every refusal in a row, and succeeds once the room is there.
  residency_fixture f;
  f.core->acquire(f.a, 1, f.t);
  f.core->load(f.a, 2, f.t);
  auto e = f.core->load_failed(f.a, {ec::out_of_device_memory, "no pages"}, f.t);
  CHECK(e.discards == std::vector<model_id>{f.a});
  CHECK(e.failures.empty());
  CHECK(e.loads.empty());  // not at once: that would refuse again at the speed of messages
  REQUIRE(e.wake_at);
  CHECK(*e.wake_at == f.t + 20ms);
  CHECK(f.core->ledger().device(0).used_bytes == 0);
  // Too early: nothing; on time: the load again.
  CHECK(f.core->tick(f.t + 10ms).loads.empty());
  e = f.core->tick(f.t + 20ms);
  CHECK(e.loads == std::vector<model_id>{f.a});
  // Refused again: the pause doubles.
  e = f.core->load_failed(f.a, {ec::out_of_device_memory, "no pages"}, f.t + 20ms);
  REQUIRE(e.wake_at);
  CHECK(*e.wake_at == f.t + 60ms);
  // Meanwhile b's load goes ahead: the waiting load holds no device.
  e = f.core->acquire(f.b, 3, f.t + 30ms);
  CHECK(e.loads == std::vector<model_id>{f.b});
  f.core->load_started(f.b, f.t + 30ms);
  f.core->load_done(f.b, f.t + 31ms);
  f.core->release(f.b, f.t + 32ms);
  // At a's time it evicts b for room, loads, and its waiters get what they asked for.
  e = f.core->tick(f.t + 60ms);
  CHECK(e.evictions == std::vector<model_id>{f.b});
  e = f.core->evict_done(f.b, f.t + 61ms);
  CHECK(e.loads == std::vector<model_id>{f.a});
  e = f.core->load_started(f.a, f.t + 62ms);
  CHECK(granted(e, 1, true));
  e = f.core->load_done(f.a, f.t + 70ms);
  REQUIRE(e.done.size() == 1);
  CHECK(e.done[0].waiter == 2);
  CHECK(f.core->ledger().model(f.a).device_refusals == 0);
  // A device error is not room: its waiters fail as before.
  f.core->release(f.a, f.t + 71ms);
  f.core->unload(f.a, 4, f.t + 72ms);
  f.core->evict_done(f.a, f.t + 73ms);
  f.core->acquire(f.a, 5, f.t + 74ms);
  e = f.core->load_failed(f.a, {ec::device_error, "boom"}, f.t + 75ms);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].waiter == 5);
}

TEST_CASE("residency: a refused load nobody waits for is not retried", "[cores]") {
  residency_fixture f;
  auto e = f.core->ledger().model(f.a).state;
  CHECK(e == model_state::offloaded);
  // A prefetch (no waiter) refused by the device: dropped, no timer.
  auto out = f.core->acquire(f.a, 1, f.t);
  REQUIRE(out.loads.size() == 1);
  f.core->load_started(f.a, f.t);
  f.core->release(f.a, f.t);
  auto r = f.core->load_failed(f.a, {ec::out_of_device_memory, "no pages"}, f.t);
  CHECK_FALSE(r.wake_at);
  CHECK(r.failures.empty());
  CHECK(f.state(f.a) == model_state::offloaded);
}

TEST_CASE("residency: a lost device discards its models and refuses their leases", "[cores]") {
  residency_fixture f;
  f.core->acquire(f.a, 1, f.t);
  f.core->load_started(f.a, f.t);
  f.core->load_done(f.a, f.t);
  f.core->release(f.a, f.t);
  auto e = f.core->lose({0}, f.t);
  CHECK(e.discards == std::vector<model_id>{f.a});
  e = f.core->acquire(f.a, 2, f.t);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].why.code == ec::unavailable);
  f.core->find_devices({0}, f.t);
  e = f.core->acquire(f.a, 3, f.t);
  CHECK(e.loads == std::vector<model_id>{f.a});
}

TEST_CASE("residency: unload is refused while leased, done at once when offloaded", "[cores]") {
  residency_fixture f;
  auto e = f.core->unload(f.a, 1, f.t);
  REQUIRE(e.done.size() == 1);
  f.core->acquire(f.a, 2, f.t);
  f.core->load_started(f.a, f.t);
  f.core->load_done(f.a, f.t);
  e = f.core->unload(f.a, 3, f.t);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].why.code == ec::invalid_state);
  f.core->release(f.a, f.t);
  e = f.core->unload(f.a, 4, f.t);
  CHECK(e.evictions == std::vector<model_id>{f.a});
  e = f.core->evict_failed(f.a, {ec::device_error, "stuck"}, f.t);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].waiter == 4);
  CHECK(f.state(f.a) == model_state::resident);
  // A model with leases or waiters cannot be removed; an offloaded, idle one can.
  CHECK(f.core->remove(f.a));
  CHECK_FALSE(f.core->remove(f.b));
}

namespace {

/// Two devices; "x" on device 0, "y" on devices 0 and 1 (another placement: they never
/// share device 0), "z" a two-stage pipeline on devices 0 and 1.
struct dispatch_fixture {
  std::unique_ptr<dispatcher> d;
  time_point t{};
  uint32_t x = 0, y = 0, z = 0;

  explicit dispatch_fixture(duration window = 0ms, uint32_t batch = 2) {
    batching_options o;
    o.batch_window = window;
    o.max_batch_size = batch;
    o.default_deadline = 1s;
    refusal why;
    d = dispatcher::make(o, 2, &why);
    REQUIRE(d);
    x = d->add_model("x", 1, 1, {0}, 0);
    y = d->add_model("y", 2, 1, {0, 1}, 0);
    z = d->add_model("z", 1, 2, {0, 1}, 0);
  }

  lease_info resident() const { return {t, false, 0, 0, std::nullopt}; }
};

}  // namespace

TEST_CASE("dispatch: admit forms a batch, a lease starts it, its end frees the way", "[cores]") {
  dispatch_fixture f;
  auto e = f.d->admit(f.x, 1, f.t, 0);
  CHECK_FALSE(e.refused);
  CHECK(e.dispatched);
  REQUIRE(e.formed.size() == 1);
  auto id = e.formed[0].id;
  e = f.d->leased(id, f.resident(), f.t);
  REQUIRE(e.started.size() == 1);
  CHECK(e.started[0].rows.size() == 1);
  CHECK(e.started[0].start == f.t);
  // y shares device 0 under another placement: it waits for x's batch.
  e = f.d->admit(f.y, 2, f.t, 0);
  REQUIRE(e.formed.size() == 1);
  auto yid = e.formed[0].id;
  e = f.d->leased(yid, f.resident(), f.t);
  CHECK(e.started.empty());
  f.t += 10ms;
  e = f.d->batch_done(id, f.t, true, 0.01, 1);
  REQUIRE(e.releases.size() == 1);
  CHECK(e.releases[0].model == f.x);
  REQUIRE(e.started.size() == 1);
  CHECK(e.started[0].id == yid);
  CHECK(f.d->queues().step_seconds(f.x) == Approx(0.01));
}

TEST_CASE("dispatch: a pipeline keeps pp batches in flight on its devices", "[cores]") {
  dispatch_fixture f{0ms, 1};
  std::vector<batch_id> ids;
  for (uint64_t k = 1; k <= 3; ++k) {
    auto e = f.d->admit(f.z, k, f.t, 0);
    for (auto& b : e.formed) ids.push_back(b.id);
  }
  REQUIRE(ids.size() == 2);  // the third waits for a slot
  CHECK(f.d->leased(ids[0], f.resident(), f.t).started.size() == 1);
  CHECK(f.d->leased(ids[1], f.resident(), f.t).started.size() == 1);
  auto e = f.d->batch_done(ids[0], f.t, true, 0.01, 1);
  CHECK(e.formed.size() == 1);
}

TEST_CASE("dispatch: the window arms a tick, the tick forms the batch", "[cores]") {
  dispatch_fixture f{5ms, 4};
  auto e = f.d->admit(f.x, 1, f.t, 0);
  CHECK(e.formed.empty());
  REQUIRE(e.ticks.size() == 1);
  CHECK(e.ticks[0] == f.t + 5ms + tick_slack);
  // A second admission within the window arms nothing new.
  e = f.d->admit(f.x, 2, f.t + 1ms, 0);
  CHECK(e.formed.empty());
  CHECK(e.ticks.empty());
  // Before the window closes nothing forms; at the tick both go together.
  CHECK(f.d->tick(f.t + 4ms).formed.empty());
  e = f.d->tick(f.t + 5ms + tick_slack);
  REQUIRE(e.formed.size() == 1);
  CHECK(e.formed[0].rows.size() == 2);
}

TEST_CASE("dispatch: a batch leased on a loading model waits for its overlap start", "[cores]") {
  dispatch_fixture f;
  auto e = f.d->admit(f.x, 1, f.t, 0);
  auto id = e.formed.at(0).id;
  // No step time known: it is due when the load ends, 200 ms from now.
  e = f.d->leased(id, {f.t, true, 0.2, 0.2, std::nullopt}, f.t);
  CHECK(e.started.empty());
  REQUIRE(e.ticks.size() == 1);
  CHECK(e.ticks[0] == f.t + 200ms + tick_slack);
  e = f.d->tick(f.t + 100ms);
  CHECK(e.started.empty());
  e = f.d->tick(f.t + 200ms + tick_slack);
  CHECK(e.started.size() == 1);
}

TEST_CASE("dispatch: rows cancelled or expired before the start fail, an empty batch ends",
          "[cores]") {
  dispatch_fixture f;
  auto e = f.d->admit(f.x, 1, f.t, 50);
  auto id = e.formed.at(0).id;
  f.d->cancel(id, 1);
  e = f.d->leased(id, f.resident(), f.t);
  CHECK(e.started.empty());
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].why == row_end::cancelled);
  CHECK(e.failures[0].batch == id);
  REQUIRE(e.releases.size() == 1);
  CHECK(e.releases[0].batch == id);
  CHECK(f.d->queues().in_flight(f.x) == 0);

  e = f.d->admit(f.x, 2, f.t, 50);
  id = e.formed.at(0).id;
  f.t += 60ms;  // the lease took longer than the deadline
  e = f.d->leased(id, f.resident(), f.t);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].why == row_end::expired_waiting);
  CHECK(e.started.empty());
}

TEST_CASE("dispatch: a lease refused ends the batch and lets the next one form", "[cores]") {
  dispatch_fixture f{0ms, 1};
  auto e = f.d->admit(f.x, 1, f.t, 0);
  auto id = e.formed.at(0).id;
  e = f.d->admit(f.x, 2, f.t, 0);
  CHECK(e.formed.empty());  // x has one batch in flight at most
  e = f.d->lease_failed(id, f.t);
  REQUIRE(e.formed.size() == 1);
  CHECK(e.formed[0].rows.at(0).key == 2);
  CHECK_FALSE(f.d->queues().resident(f.x));
}

TEST_CASE("dispatch: a full queue refuses, a request past its deadline fails in the queue",
          "[cores]") {
  batching_options o;
  o.max_queue = 1;
  o.batch_window = 1s;
  o.max_batch_size = 4;
  refusal why;
  auto d = dispatcher::make(o, 1, &why);
  REQUIRE(d);
  auto m = d->add_model("m", 1, 1, {0}, 0);
  time_point t{};
  CHECK_FALSE(d->admit(m, 1, t, 10).refused);
  auto e = d->admit(m, 2, t, 10);
  REQUIRE(e.refused);
  CHECK(e.refused->code == ec::overloaded);
  e = d->tick(t + 20ms);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].why == row_end::expired);
  CHECK(e.failures[0].batch == 0);
}

TEST_CASE("dispatch: at a step boundary queued requests join, up to the batch size",
          "[cores][continuous]") {
  dispatch_fixture f{0ms, 3};
  auto e = f.d->admit(f.x, 1, f.t, 0);
  auto id = e.formed.at(0).id;
  REQUIRE(f.d->leased(id, f.resident(), f.t).started.size() == 1);
  for (uint64_t k = 2; k <= 5; ++k) CHECK(f.d->admit(f.x, k, f.t, 0).formed.empty());
  // One row runs: two of the four queued join (batch of 3), in queue order.
  e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].into == id);
  CHECK(e.joins[0].id != id);
  REQUIRE(e.joins[0].rows.size() == 2);
  CHECK(e.joins[0].rows[0].key == 2);
  CHECK(e.joins[0].rows[1].key == 3);
  // Full: nobody joins.
  CHECK(f.d->step_boundary(id, {1, 2, 3}, f.t).joins.empty());
  // A request that expired in the queue fails at the boundary instead of joining.
  CHECK(f.d->admit(f.x, 6, f.t, 5).formed.empty());
  f.t += 10ms;
  e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].rows.size() == 2);  // keys 4 and 5
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].row.key == 6);
  CHECK(e.failures[0].why == row_end::expired);
}

TEST_CASE("dispatch: no joins when off, before the start, or while another model waits",
          "[cores][continuous]") {
  SECTION("off") {
    dispatch_fixture f;
    batching_options o;
    o.continuous = false;
    o.batch_window = 0ms;
    refusal why;
    auto d = dispatcher::make(o, 1, &why);
    auto m = d->add_model("m", 1, 1, {0}, 0);
    auto id = d->admit(m, 1, f.t, 0).formed.at(0).id;
    REQUIRE(d->leased(id, f.resident(), f.t).started.size() == 1);
    d->admit(m, 2, f.t, 0);
    CHECK(d->step_boundary(id, {1}, f.t).joins.empty());
  }
  SECTION("another model's batch waits for a device of it") {
    dispatch_fixture f;
    auto id = f.d->admit(f.x, 1, f.t, 0).formed.at(0).id;
    REQUIRE(f.d->leased(id, f.resident(), f.t).started.size() == 1);
    auto yid = f.d->admit(f.y, 2, f.t, 0).formed.at(0).id;
    f.d->admit(f.x, 3, f.t, 0);
    CHECK(f.d->step_boundary(id, {1}, f.t).joins.empty());
    // Once y's batch ran and ended, x's batch takes joins again.
    f.d->batch_done(id, f.t, true, 0.01, 1);
    auto e = f.d->leased(yid, f.resident(), f.t);
    REQUIRE(e.started.size() == 1);
    f.d->batch_done(yid, f.t, true, 0.01, 1);
  }
  SECTION("a batch not started yet") {
    dispatch_fixture f;
    auto id = f.d->admit(f.x, 1, f.t, 0).formed.at(0).id;
    f.d->admit(f.x, 2, f.t, 0);
    CHECK(f.d->step_boundary(id, {1}, f.t).joins.empty());
  }
}

TEST_CASE("residency: the free blocks a transfer reports count in the pass it triggers",
          "[cores]") {
  // a and b fill 80 of 100 MB; b's load reports a largest free block of 20 MB. c (40 MB)
  // needs a's room: once a's eviction reports a 60 MB block, c starts, and b stays.
  refusal why;
  auto core = residency::make({{100 * mb, 10}}, {}, &why);
  REQUIRE(core);
  auto add = [&](const char* name) {
    return *core->ledger().add(name, {{0}, {40 * mb}, false, 0}, &why);
  };
  auto a = add("a"), b = add("b"), c = add("c");
  time_point t{};
  for (auto m : {a, b}) {
    core->acquire(m, 1, t);
    core->load_started(m, t);
    core->load_done(m, t, {{0, m == a ? 60 * mb : 20 * mb}});
    core->release(m, t);
    t += 1ms;
  }
  auto e = core->acquire(c, 2, t);
  REQUIRE(e.evictions == std::vector<model_id>{a});
  e = core->evict_done(a, t, {{0, 60 * mb}});
  CHECK(e.evictions.empty());
  CHECK(e.loads == std::vector<model_id>{c});
  CHECK(core->ledger().state_of(b) == model_state::resident);
}

TEST_CASE("dispatch: a running row past its answer limit ends at the next step boundary",
          "[cores][continuous][deadline]") {
  dispatch_fixture f{0ms, 3};
  CHECK(answer_limit(f.t, true, 5s) == f.t);
  CHECK(answer_limit(f.t, false, 5s) == f.t + 5s);
  // Rows 1 (drop_late) and 2 (served late, up to late_grace past its deadline).
  auto e = f.d->admit(f.x, 1, f.t, 0, 100, true);
  auto id = e.formed.at(0).id;
  REQUIRE(f.d->leased(id, f.resident(), f.t).started.size() == 1);
  f.t += 500ms;
  CHECK(f.d->admit(f.x, 2, f.t, 0, 100).formed.empty());
  e = f.d->step_boundary(id, {1}, f.t);
  CHECK(e.failures.empty());
  REQUIRE(e.joins.size() == 1);
  // The fixture's deadline is 1 s: row 1 (drop_late) passes it and leaves; row 2 steps on.
  f.t += 600ms;
  e = f.d->step_boundary(id, {1, 2}, f.t);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].row.key == 1);
  CHECK(e.failures[0].why == row_end::expired_running);
  CHECK(e.failures[0].batch == id);
  CHECK(e.steps == std::vector<batch_id>{id});
  // Row 2 is served late, up to late_grace (30 s) past its deadline: then nothing is
  // left, the batch ends (no step).
  f.t += 1s;
  e = f.d->step_boundary(id, {2}, f.t);
  CHECK(e.failures.empty());
  f.t += 30s;
  e = f.d->step_boundary(id, {2}, f.t);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.steps.empty());
}
