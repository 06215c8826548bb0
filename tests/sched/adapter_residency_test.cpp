// LoRA adapters as residents of the ledger (issue 47): the residency core fed scripted
// events. An adapter's lease holds its base, its load waits for the base's, evicting the
// base takes its adapters along, and an adapter is a small victim of its own.
#include <catch2/catch.hpp>

#include <algorithm>

#include "sched/residency.hpp"

using namespace computron;
using namespace computron::sched;

namespace {

constexpr uint64_t mb = 1 << 20;

/// Two devices of 100 MB; base "b" (50 MB per shard, tensor-parallel over both), its
/// adapters "x" and "y" (2 MB per shard), and a whole model "w" (60 MB per shard).
struct adapter_fixture {
  std::unique_ptr<residency> core;
  time_point t{};
  model_id b = 0, x = 0, y = 0, w = 0;

  adapter_fixture() {
    refusal why;
    core = residency::make({{100 * mb, 10}, {100 * mb, 10}}, {}, &why);
    REQUIRE(core);
    b = add("b", {{0, 1}, {50 * mb, 50 * mb}});
    x = add("x", adapter({0, 1}, 2 * mb, "b"));
    y = add("y", adapter({0, 1}, 2 * mb, "b"));
    w = add("w", {{0, 1}, {60 * mb, 60 * mb}});
  }

  static placement adapter(std::vector<int32_t> devices, uint64_t bytes, std::string base) {
    placement p;
    p.devices = std::move(devices);
    p.bytes.assign(p.devices.size(), bytes);
    p.base = std::move(base);
    return p;
  }

  model_id add(const std::string& name, const placement& p) {
    refusal why;
    auto id = core->ledger().add(name, p, &why);
    INFO(why.reason);
    REQUIRE(id);
    return *id;
  }

  /// Carries out loads and evictions as a driver would (every load whole at once);
  /// returns every effect on the way.
  residency_effects settle(residency_effects e) {
    residency_effects all;
    for (int round = 0; round < 10 && !e.empty(); ++round) {
      append(all, e);
      residency_effects next;
      for (auto v : e.evictions) append(next, core->evict_done(v, t));
      for (auto l : e.loads) append(next, core->load_done(l, t));
      e = std::move(next);
    }
    append(all, e);
    return all;
  }

  static void append(residency_effects& into, const residency_effects& more) {
    auto cat = [](auto& a, const auto& b) { a.insert(a.end(), b.begin(), b.end()); };
    cat(into.grants, more.grants);
    cat(into.failures, more.failures);
    cat(into.loads, more.loads);
    cat(into.evictions, more.evictions);
  }

  model_state state(model_id m) const { return core->ledger().state_of(m); }
  uint32_t leases(model_id m) const { return core->ledger().model(m).leases; }
};

bool granted(const residency_effects& e, waiter_id w, model_id m) {
  return std::any_of(e.grants.begin(), e.grants.end(),
                     [&](auto& g) { return g.waiter == w && g.model == m; });
}

template <class T>
bool has(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

TEST_CASE("adapters: registration needs a registered base on the same devices", "[adapters]") {
  adapter_fixture f;
  refusal why;
  CHECK_FALSE(f.core->ledger().add("z", adapter_fixture::adapter({0, 1}, mb, "nope"), &why));
  CHECK(why.code == ec::unknown_model);
  CHECK(why.reason.find("nope") != std::string::npos);
  CHECK_FALSE(f.core->ledger().add("z", adapter_fixture::adapter({1, 0}, mb, "b"), &why));
  CHECK(why.code == ec::invalid_configuration);
  CHECK(why.reason.find("devices") != std::string::npos);
  CHECK_FALSE(f.core->ledger().add("z", adapter_fixture::adapter({0, 1}, mb, "x"), &why));
  CHECK(why.reason.find("adapter itself") != std::string::npos);
  CHECK(f.core->ledger().model(f.b).adapters == std::vector<model_id>{f.x, f.y});
  CHECK(*f.core->ledger().model(f.x).base == f.b);
}

TEST_CASE("adapters: a cold adapter loads its base first, then itself, and leases both",
          "[adapters]") {
  adapter_fixture f;
  auto e = f.core->acquire(f.x, 1, f.t);
  // The base goes first; the adapter waits for it.
  CHECK(e.loads == std::vector<model_id>{f.b});
  CHECK(e.grants.empty());
  e = f.core->load_done(f.b, f.t);
  CHECK(e.loads == std::vector<model_id>{f.x});
  CHECK(e.grants.empty());
  e = f.core->load_done(f.x, f.t);
  CHECK(granted(e, 1, f.x));
  CHECK(f.leases(f.x) == 1);
  CHECK(f.leases(f.b) == 1);
  // A second adapter of the resident base is one small load, its lease the base's too.
  e = f.settle(f.core->acquire(f.y, 2, f.t));
  CHECK(granted(e, 2, f.y));
  CHECK(e.loads == std::vector<model_id>{f.y});
  CHECK(f.leases(f.b) == 2);
  // Warm: granted at once.
  e = f.core->acquire(f.x, 3, f.t);
  CHECK(granted(e, 3, f.x));
  CHECK(f.leases(f.b) == 3);
  bool ok = false;
  f.core->release(f.x, f.t, &ok);
  CHECK(ok);
  f.core->release(f.x, f.t, &ok);
  f.core->release(f.y, f.t, &ok);
  CHECK(f.leases(f.x) == 0);
  CHECK(f.leases(f.b) == 0);
}

TEST_CASE("adapters: evicting the base takes its adapters along, and only it frees the room",
          "[adapters]") {
  adapter_fixture f;
  f.settle(f.core->acquire(f.x, 1, f.t));
  f.core->release(f.x, f.t);
  CHECK(f.state(f.b) == model_state::resident);
  CHECK(f.state(f.x) == model_state::resident);
  // w (60 MB) does not fit beside b and x (52 MB of 100), nor beside b alone: b goes, and
  // x with it (an adapter runs on nothing else).
  auto e = f.core->acquire(f.w, 2, f.t);
  CHECK(has(e.evictions, f.b));
  CHECK(has(e.evictions, f.x));
  // The adapter before its base.
  CHECK(std::find(e.evictions.begin(), e.evictions.end(), f.x) <
        std::find(e.evictions.begin(), e.evictions.end(), f.b));
  e = f.settle(std::move(e));
  CHECK(granted(e, 2, f.w));
  CHECK(f.state(f.b) == model_state::offloaded);
  CHECK(f.state(f.x) == model_state::offloaded);
  CHECK(f.core->ledger().device(0).used_bytes == 60 * mb);
}

TEST_CASE("adapters: a leased adapter keeps its base from being a victim", "[adapters]") {
  adapter_fixture f;
  f.settle(f.core->acquire(f.x, 1, f.t));
  // x's batch runs: b is leased through it, so w's load drains b instead of evicting it.
  auto e = f.core->acquire(f.w, 2, f.t);
  CHECK(e.evictions.empty());
  CHECK(e.grants.empty());
  CHECK(f.core->ledger().model(f.b).draining);
  // New leases of b's adapters wait for the drain as b's own do.
  e = f.core->acquire(f.x, 3, f.t);
  CHECK(e.grants.empty());
  // The batch ends: b and x go, w loads, and x's held request waits for b to come back.
  e = f.settle(f.core->release(f.x, f.t));
  CHECK(granted(e, 2, f.w));
  CHECK(f.state(f.w) == model_state::resident);
}

TEST_CASE("adapters: an adapter alone is a victim when it is enough", "[adapters]") {
  refusal why;
  auto core = residency::make({{100 * mb, 10}}, {}, &why);
  REQUIRE(core);
  auto b = *core->ledger().add("b", {{0}, {60 * mb}}, &why);
  placement pa{{0}, {30 * mb}};
  pa.base = "b";
  auto a = *core->ledger().add("a", pa, &why);
  auto w = *core->ledger().add("w", {{0}, {8 * mb}}, &why);
  time_point t{};
  core->acquire(a, 1, t);
  core->load_done(b, t);
  core->load_done(a, t);
  core->release(a, t);
  // 90 MB used: w's 8 MB fits; then v's 5 MB need 3 MB more. The base is in demand, its
  // adapter not: under the cost-aware policy the adapter alone goes.
  core->ledger().note_demand(b, 100, t);
  REQUIRE(core->ledger().set_policy("cost") == std::nullopt);
  auto e = core->acquire(w, 2, t);
  CHECK(e.evictions.empty());
  core->load_done(w, t);
  core->release(w, t);
  auto v = *core->ledger().add("v", {{0}, {5 * mb}}, &why);
  e = core->acquire(v, 3, t);
  CHECK(e.evictions == std::vector<model_id>{a});
  // The adapter's 30 MB cover the 3 MB short; the base is not evicted for it.
  CHECK_FALSE(has(e.evictions, b));
  CHECK(core->ledger().state_of(b) == model_state::resident);
}

TEST_CASE("adapters: a base that can never load refuses its adapters' requests", "[adapters]") {
  refusal why;
  auto core = residency::make({{100 * mb, 10}}, {}, &why);
  REQUIRE(core);
  auto b = *core->ledger().add("b", {{0}, {90 * mb}}, &why);
  placement pa{{0}, {20 * mb}};
  pa.base = "b";
  auto a = *core->ledger().add("a", pa, &why);
  time_point t{};
  // 90 + 20 > 100: the adapter can never run beside its base.
  auto e = core->acquire(a, 1, t);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].waiter == 1);
  CHECK(e.failures[0].why.code == ec::out_of_device_memory);
  CHECK(e.failures[0].why.reason.find("with its base b") != std::string::npos);
  // A base whose load fails fails the adapter's waiters too.
  placement pc{{0}, {5 * mb}};
  pc.base = "b";
  auto c = *core->ledger().add("c", pc, &why);
  e = core->acquire(c, 2, t);
  REQUIRE(e.loads == std::vector<model_id>{b});
  e = core->load_failed(b, {ec::io_error, "disk gone"}, t);
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].waiter == 2);
  CHECK(e.failures[0].why.code == ec::io_error);
  CHECK(e.failures[0].why.reason.find("its base b failed to load: disk gone") != std::string::npos);
  CHECK(core->ledger().pending_loads() == 0);
}

TEST_CASE("adapters: unloading a base evicts its adapters, removal needs them gone first",
          "[adapters]") {
  adapter_fixture f;
  f.settle(f.core->acquire(f.x, 1, f.t));
  // Leased through x: refused.
  auto e = f.core->unload(f.b, 2, f.t);
  REQUIRE(e.failures.size() == 1);
  f.core->release(f.x, f.t);
  e = f.core->unload(f.b, 3, f.t);
  CHECK(e.failures.empty());
  CHECK(has(e.evictions, f.x));
  CHECK(has(e.evictions, f.b));
  f.core->evict_done(f.x, f.t);
  f.core->evict_done(f.b, f.t);
  auto why = f.core->remove(f.b);
  REQUIRE(why);
  CHECK(why->code == ec::invalid_state);
  CHECK(why->reason.find("adapters x, y") != std::string::npos);
  CHECK_FALSE(f.core->remove(f.x));
  CHECK_FALSE(f.core->remove(f.y));
  CHECK_FALSE(f.core->remove(f.b));
  CHECK_FALSE(f.core->ledger().find("b"));
}
