#include <catch2/catch.hpp>

#include "sched/ledger.hpp"

using namespace computron;
using namespace computron::sched;

namespace {

constexpr uint64_t mb = 1 << 20;

/// Two devices of 100 MB and a virtual clock; every model has one shard per device.
/// Loads and evictions finish only when the test says so, like a real link would.
struct ledger_fixture {
  std::unique_ptr<ledger> l;
  time_point t{};

  explicit ledger_fixture(const std::string& policy = "lru", uint32_t transfers = 1,
                          bool prefetch = false) {
    refusal why;
    l = ledger::make({{100 * mb, 10}, {100 * mb, 10}}, {policy, transfers, prefetch}, &why);
    REQUIRE(l);
  }

  model_id add(const std::string& name, uint64_t bytes = 40 * mb, bool pinned = false,
               int32_t priority = 0) {
    refusal why;
    auto id = l->add(name, {{0, 1}, {bytes, bytes}, pinned, priority}, &why);
    REQUIRE(id);
    return *id;
  }

  void tick() { t += std::chrono::milliseconds(1); }

  /// Acquires, completing whatever loads and evictions that takes, then releases.
  void use(model_id id) {
    auto r = l->acquire(id, t);
    if (r == acquire_result::wait_load) {
      settle();
      REQUIRE(l->model(id).state == model_state::resident);
      l->grant(id, t);
    } else {
      REQUIRE(r == acquire_result::granted);
    }
    bool last = false;
    REQUIRE(l->release(id, t, &last));
    if (last) settle();
    tick();
  }

  /// Pumps and completes every transfer until nothing more is decided.
  void settle() {
    for (int i = 0; i < 100; ++i) {
      auto d = l->pump(t);
      if (d.evictions.empty() && d.loads.empty()) return;
      for (auto v : d.evictions) l->evict_done(v);
      for (auto m : d.loads) l->load_done(m, t);
    }
    FAIL("the ledger did not settle");
  }

  std::string state(model_id id) const { return to_string(l->state_of(id)); }
};

}  // namespace

TEST_CASE("LRU evicts the least recently used model, counted in bytes", "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a"), b = f.add("b"), c = f.add("c");
  f.use(a);
  f.use(b);
  f.use(a);  // a is now more recent than b
  f.use(c);
  CHECK(f.state(a) == "resident");
  CHECK(f.state(b) == "offloaded");
  CHECK(f.state(c) == "resident");
  CHECK(f.l->model(b).evictions == 1);
  CHECK(f.l->device(0).used_bytes == 80 * mb);
}

TEST_CASE("small models fill the room one large model needs, and it evicts them all",
          "[sched][ledger]") {
  ledger_fixture f;
  auto big = f.add("big", 90 * mb);
  auto s1 = f.add("s1", 30 * mb), s2 = f.add("s2", 30 * mb), s3 = f.add("s3", 30 * mb);
  f.use(s1);
  f.use(s2);
  f.use(s3);
  CHECK(f.l->device(1).used_bytes == 90 * mb);
  f.use(big);
  CHECK(f.state(big) == "resident");
  for (auto s : {s1, s2, s3}) CHECK(f.state(s) == "offloaded");
}

TEST_CASE("cost-aware keeps the model in demand where LRU evicts it", "[sched][ledger]") {
  for (std::string policy : {"lru", "cost"}) {
    ledger_fixture f{policy};
    auto hot = f.add("hot"), cold = f.add("cold"), fresh = f.add("new");
    f.use(hot);
    f.l->note_demand(hot, 100, f.t);
    f.use(cold);
    f.use(fresh);
    INFO(policy);
    CHECK(f.state(hot) == (policy == "lru" ? "offloaded" : "resident"));
    CHECK(f.state(cold) == (policy == "lru" ? "resident" : "offloaded"));
  }
}

TEST_CASE("concurrent wants of a loading model start one load", "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a");
  CHECK(f.l->acquire(a, f.t) == acquire_result::wait_load);
  auto d = f.l->pump(f.t);
  REQUIRE(d.loads == std::vector<model_id>{a});
  CHECK(f.l->acquire(a, f.t) == acquire_result::wait_load);
  CHECK(f.l->acquire(a, f.t) == acquire_result::wait_load);
  CHECK(f.l->pump(f.t).loads.empty());
  CHECK(f.l->device(0).transfers == 1);
  f.l->load_done(a, f.t);
  CHECK(f.l->model(a).loads == 1);
  CHECK(f.l->device(0).transfers == 0);
}

TEST_CASE("a leased model is never evicted, its drain holds new leases until the load ran",
          "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a", 60 * mb), b = f.add("b", 60 * mb);
  f.use(a);
  REQUIRE(f.l->acquire(a, f.t) == acquire_result::granted);  // a batch runs on a
  CHECK(f.l->acquire(b, f.t) == acquire_result::wait_load);
  auto d = f.l->pump(f.t);
  CHECK(d.evictions.empty());
  CHECK(d.loads.empty());
  CHECK(f.l->model(a).draining);
  // A new batch for a is held back: otherwise steady traffic starves b forever.
  CHECK(f.l->acquire(a, f.t) == acquire_result::wait_drain);
  bool last = false;
  REQUIRE(f.l->release(a, f.t, &last));
  CHECK(last);
  d = f.l->pump(f.t);
  REQUIRE(d.evictions == std::vector<model_id>{a});
  CHECK(f.state(a) == "evicting");
  // The pass that evicts a ends its drain: the held request goes on, and since a is on
  // its way out it will wait for a load like any other.
  CHECK(d.undrained == std::vector<model_id>{a});
  CHECK(f.l->model(a).held == 0);
  f.l->evict_done(a);
  d = f.l->pump(f.t);
  CHECK(d.loads == std::vector<model_id>{b});
  CHECK(f.state(a) == "offloaded");
}

TEST_CASE("a load that can never fit is refused before anything moves", "[sched][ledger]") {
  ledger_fixture f;
  auto pinned = f.add("pinned", 50 * mb, true);
  auto huge = f.add("huge", 120 * mb);
  auto mid = f.add("mid", 60 * mb);
  f.use(pinned);
  CHECK(f.l->acquire(huge, f.t) == acquire_result::wait_load);
  auto d = f.l->pump(f.t);
  REQUIRE(d.refused.size() == 1);
  CHECK(d.refused[0].first == huge);
  CHECK(d.refused[0].second.code == ec::out_of_device_memory);
  CHECK(d.refused[0].second.reason.find("needs 125829120 bytes") != std::string::npos);
  // 60 MB fits beside nothing but the pinned 50 MB: refused, naming the pinned bytes.
  CHECK(f.l->acquire(mid, f.t) == acquire_result::wait_load);
  d = f.l->pump(f.t);
  REQUIRE(d.refused.size() == 1);
  CHECK(d.refused[0].second.reason.find("pinned models hold") != std::string::npos);
  CHECK(d.evictions.empty());
  f.l->pin(pinned, false);
  f.use(mid);
  CHECK(f.state(pinned) == "offloaded");
}

TEST_CASE("a placement larger than its devices is refused with the sizes", "[sched][ledger]") {
  constexpr uint64_t dev = 100 * mb;
  auto huge = check_fits("huge", {{0, 1}, {40 * mb, 120 * mb}}, {dev, dev});
  REQUIRE(huge);
  CHECK(huge->code == ec::out_of_device_memory);
  CHECK(huge->reason.find("model huge needs 120.0 MiB on device 1, which holds 100.0 MiB") !=
        std::string::npos);
  // Exactly the device's bytes fit; one byte more does not, and the text says by how much.
  CHECK_FALSE(check_fits("full", {{0}, {dev}}, {dev}));
  auto over = check_fits("over", {{0}, {dev + 1}}, {dev});
  REQUIRE(over);
  CHECK(over->reason.find("(104857601 bytes)") != std::string::npos);
  // The shards a placement puts on one device add up; a device past the list holds nothing.
  auto twice = check_fits("t", {{0, 0}, {60 * mb, 60 * mb}}, {dev});
  REQUIRE(twice);
  CHECK(twice->reason.find("needs 120.0 MiB on device 0") != std::string::npos);
  CHECK_FALSE(check_fits("t", {{0, 1}, {60 * mb, 60 * mb}}, {dev, dev}));
  CHECK(check_fits("t", {{2}, {1}}, {dev, dev}));
}

TEST_CASE("a failed load frees its bytes and the model can load again", "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a");
  f.l->acquire(a, f.t);
  REQUIRE(f.l->pump(f.t).loads.size() == 1);
  CHECK(f.l->device(0).used_bytes == 40 * mb);
  f.l->load_failed(a);
  CHECK(f.l->device(0).used_bytes == 0);
  CHECK(f.l->device(0).transfers == 0);
  CHECK(f.state(a) == "offloaded");
  f.use(a);
  CHECK(f.state(a) == "resident");
}

TEST_CASE("transfer slots per link queue the second load", "[sched][ledger]") {
  ledger_fixture f{"lru", 1};
  auto a = f.add("a", 10 * mb), b = f.add("b", 10 * mb);
  f.l->acquire(a, f.t);
  f.l->acquire(b, f.t);
  auto d = f.l->pump(f.t);
  CHECK(d.loads == std::vector<model_id>{a});
  CHECK(f.l->pending_loads() == 1);
  f.l->load_done(a, f.t);
  CHECK(f.l->pump(f.t).loads == std::vector<model_id>{b});

  ledger_fixture g{"lru", 2};
  auto c = g.add("c", 10 * mb), e = g.add("e", 10 * mb);
  g.l->acquire(c, g.t);
  g.l->acquire(e, g.t);
  CHECK(g.l->pump(g.t).loads.size() == 2);
}

TEST_CASE("explicit unloads are refused under a lease and while loading", "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a");
  bool start = false;
  f.l->acquire(a, f.t);
  f.l->pump(f.t);
  auto why = f.l->begin_unload(a, &start);
  REQUIRE(why);
  CHECK(why->code == ec::invalid_state);
  f.l->load_done(a, f.t);
  f.l->grant(a, f.t);
  why = f.l->begin_unload(a, &start);
  REQUIRE(why);
  CHECK(why->reason.find("1 batches in flight") != std::string::npos);
  f.l->release(a, f.t, nullptr);
  CHECK_FALSE(f.l->begin_unload(a, &start));
  CHECK(start);
  CHECK(f.state(a) == "evicting");
}

TEST_CASE("a lost device makes its models unavailable with a reason until it is back",
          "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a");
  f.use(a);
  auto gone = f.l->lose({1});
  REQUIRE(gone == std::vector<model_id>{a});
  f.l->forget(a);
  CHECK(f.state(a) == "unavailable");
  CHECK(f.l->unavailable_reason(a).find("device 1 is unreachable") != std::string::npos);
  CHECK(f.l->acquire(a, f.t) == acquire_result::unavailable);
  CHECK(f.l->device(0).used_bytes == 0);
  f.l->find_devices({1});
  f.use(a);
  CHECK(f.state(a) == "resident");
}

TEST_CASE("priority classes are evicted last", "[sched][ledger]") {
  ledger_fixture f;
  auto vip = f.add("vip", 40 * mb, false, 1), a = f.add("a"), b = f.add("b");
  f.use(vip);  // least recently used, but in a higher class
  f.use(a);
  f.use(b);
  CHECK(f.state(vip) == "resident");
  CHECK(f.state(a) == "offloaded");
}

TEST_CASE(
    "a fragmented device evicts for a contiguous block, and loads anyway when nothing "
    "is left to evict",
    "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a", 30 * mb), b = f.add("b", 30 * mb), c = f.add("c", 40 * mb);
  f.use(a);
  f.use(b);
  // 40 MB free in bytes, but the device says its largest block is 20 MB.
  f.l->note_largest_free(0, 20 * mb);
  f.l->acquire(c, f.t);
  auto d = f.l->pump(f.t);
  CHECK(d.loads.empty());
  CHECK(d.evictions == std::vector<model_id>{a});
  f.l->evict_done(a);
  f.l->note_largest_free(0, 70 * mb);
  CHECK(f.l->pump(f.t).loads == std::vector<model_id>{c});

  ledger_fixture g;
  auto x = g.add("x", 40 * mb);
  g.l->note_largest_free(0, 10 * mb);  // nobody to evict: try, rather than wait forever
  g.l->acquire(x, g.t);
  CHECK(g.l->pump(g.t).loads == std::vector<model_id>{x});
}

TEST_CASE("registration refuses malformed placements and a second placement under a name",
          "[sched][ledger]") {
  ledger_fixture f;
  refusal why;
  CHECK_FALSE(f.l->add("x", {{0, 7}, {1, 1}}, &why));
  CHECK(why.reason.find("names device 7") != std::string::npos);
  CHECK_FALSE(f.l->add("x", {{0, 0}, {1, 1}}, &why));
  CHECK(why.reason.find("twice") != std::string::npos);
  CHECK_FALSE(f.l->add("x", {{0}, {1, 1}}, &why));
  auto a = f.add("a");
  CHECK(f.l->add("a", {{0, 1}, {40 * mb, 40 * mb}}, &why) == a);
  CHECK_FALSE(f.l->add("a", {{0}, {40 * mb}}, &why));
  CHECK(why.code == ec::invalid_state);
  CHECK_FALSE(ledger::make({}, {}, &why));
  CHECK_FALSE(ledger::make({{1, 1}}, {"mru", 1}, &why));
  CHECK_FALSE(ledger::make({{1, 1}}, {"lru", 0}, &why));
}

TEST_CASE("a removed model frees its name for any placement and never counts again",
          "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a", 40 * mb, true);  // pinned
  f.use(a);
  REQUIRE(f.l->model(a).state == model_state::resident);
  // Resident or leased: refused.
  auto busy = f.l->remove(a);
  REQUIRE(busy);
  CHECK(busy->code == ec::invalid_state);
  bool start = false;
  f.l->pin(a, false);
  REQUIRE_FALSE(f.l->begin_unload(a, &start));
  REQUIRE(start);
  f.l->evict_done(a);
  REQUIRE_FALSE(f.l->remove(a));
  CHECK(f.l->model(a).removed);
  CHECK_FALSE(f.l->find("a"));
  CHECK_FALSE(f.l->remove(a));  // twice is fine
  // The name comes back with another placement and size: a new model.
  refusal why;
  auto again = f.l->add("a", {{1}, {90 * mb}, false, 0}, &why);
  REQUIRE(again);
  CHECK(*again != a);
  f.use(*again);
  CHECK(f.l->model(*again).state == model_state::resident);
}

TEST_CASE("prefetch loads the model most in demand into free room once the links are idle",
          "[sched][ledger][prefetch]") {
  ledger_fixture f{"lru", 1, true};
  auto a = f.add("a"), b = f.add("b");
  // Nothing is in demand: a pass decides nothing.
  CHECK(f.l->pump(f.t).empty());
  f.l->note_demand(a, 1, f.t);
  f.l->note_demand(b, 5, f.t);
  auto d = f.l->pump(f.t);
  // One prefetch per pass, the most wanted first.
  REQUIRE(d.loads == std::vector<model_id>{b});
  CHECK(d.evictions.empty());
  CHECK(f.state(b) == "loading");
  CHECK(f.l->model(b).prefetches == 1);
  // Its links are busy: a waits for the next pass after the load.
  CHECK(f.l->pump(f.t).empty());
  f.l->load_done(b, f.t);
  d = f.l->pump(f.t);
  CHECK(d.loads == std::vector<model_id>{a});
  f.l->load_done(a, f.t);
  // A batch that uses a prefetched model counts a hit, once.
  CHECK(f.l->acquire(b, f.t) == acquire_result::granted);
  CHECK(f.l->model(b).prefetch_hits == 1);
  bool last = false;
  f.l->release(b, f.t, &last);
  CHECK(f.l->acquire(b, f.t) == acquire_result::granted);
  CHECK(f.l->model(b).prefetch_hits == 1);
  CHECK(f.l->model(a).prefetch_hits == 0);
}

TEST_CASE("prefetch evicts only lease-free models clearly less in demand",
          "[sched][ledger][prefetch]") {
  // Room for two of three 40 MB models.
  ledger_fixture f{"lru", 1, true};
  auto hot = f.add("hot"), cold = f.add("cold"), next = f.add("next");
  f.use(hot);
  f.use(cold);
  f.l->note_demand(hot, 20, f.t);
  f.l->note_demand(cold, 4, f.t);
  SECTION("nearly as wanted: nothing moves") {
    f.l->note_demand(next, 7, f.t);  // 7 < 4 x 2
    CHECK(f.l->pump(f.t).empty());
    CHECK(f.l->model(next).prefetches == 0);
  }
  SECTION("clearly more wanted: the cold one goes, never the hot one") {
    f.l->note_demand(next, 10, f.t);
    auto d = f.l->pump(f.t);
    CHECK(d.evictions == std::vector<model_id>{cold});
    CHECK(d.loads.empty());
    f.l->evict_done(cold);
    // The load waits for its room like a requested one, then starts.
    d = f.l->pump(f.t);
    CHECK(d.loads == std::vector<model_id>{next});
    f.l->load_done(next, f.t);
    CHECK(f.state(hot) == "resident");
    CHECK(f.state(next) == "resident");
    CHECK(f.l->model(next).prefetches == 1);
    // cold is now the most wanted offloaded model, but evicting next (twice as wanted)
    // is not allowed.
    CHECK(f.l->pump(f.t).empty());
  }
  SECTION("a leased victim is never taken") {
    f.l->note_demand(next, 10, f.t);
    REQUIRE(f.l->acquire(cold, f.t) == acquire_result::granted);
    CHECK(f.l->pump(f.t).empty());
    CHECK(f.state(cold) == "resident");
  }
  SECTION("nor a pinned one") {
    f.l->note_demand(next, 10, f.t);
    f.l->pin(cold, true);
    CHECK(f.l->pump(f.t).empty());
  }
}

TEST_CASE("prefetch is off by default and never delays a requested load",
          "[sched][ledger][prefetch]") {
  {
    ledger_fixture f;  // prefetch off
    auto a = f.add("a");
    f.l->note_demand(a, 5, f.t);
    CHECK(f.l->pump(f.t).empty());
  }
  ledger_fixture f{"lru", 1, true};
  auto a = f.add("a"), b = f.add("b");
  f.l->note_demand(b, 50, f.t);
  // a is requested: its load goes first, and no prefetch joins a pass that loads.
  REQUIRE(f.l->acquire(a, f.t) == acquire_result::wait_load);
  auto d = f.l->pump(f.t);
  CHECK(d.loads == std::vector<model_id>{a});
  CHECK(f.l->model(b).prefetches == 0);
}

TEST_CASE("the residency epoch moves exactly when the resident set changes", "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a"), b = f.add("b"), c = f.add("c");
  auto epoch = f.l->residency_epoch();
  f.use(a);  // a loads
  CHECK(f.l->residency_epoch() != epoch);
  epoch = f.l->residency_epoch();
  f.use(a);  // a lease on a resident model changes nothing
  f.l->note_demand(b, 3, f.t);
  CHECK(f.l->pump(f.t).empty());
  CHECK(f.l->residency_epoch() == epoch);
  f.use(b);
  f.use(c);  // c evicts a
  CHECK(f.l->residency_epoch() != epoch);
  epoch = f.l->residency_epoch();
  f.l->lose({0});  // a lost device makes b and c unavailable
  CHECK(f.l->residency_epoch() != epoch);
}

TEST_CASE("compute while loading: leases once the copies start, never a victim, time left",
          "[sched][ledger]") {
  for (bool overlap : {true, false}) {
    INFO("compute while loading " << overlap);
    refusal why;
    auto l = ledger::make({{100 * mb, 10}, {100 * mb, 10}}, {"lru", 1, false, overlap}, &why);
    REQUIRE(l);
    auto a = *l->add("a", {{0, 1}, {40 * mb, 40 * mb}, false, 0}, &why);
    time_point t{};
    REQUIRE(l->acquire(a, t) == acquire_result::wait_load);
    auto d = l->pump(t);
    REQUIRE(d.loads == std::vector<model_id>{a});
    // Loading but not started: nothing to lease yet.
    CHECK(l->acquire(a, t) == acquire_result::wait_load);
    CHECK(l->load_started(a, t) == overlap);
    // 40 MiB over a 10 GB/s link: 4.2 ms; 1 ms later 3.2 ms are left.
    t += std::chrono::milliseconds(1);
    CHECK(l->load_left_seconds(a, t) ==
          Approx(overlap ? 40.0 * mb / 10e9 - 0.001 : 0).margin(1e-9));
    CHECK(l->acquire(a, t) == (overlap ? acquire_result::granted : acquire_result::wait_load));
    CHECK(l->model(a).leases == (overlap ? 1u : 0u));
    CHECK(l->model(a).state == model_state::loading);
    l->load_done(a, t);
    CHECK(l->load_left_seconds(a, t) == 0);
    CHECK_FALSE(l->model(a).computable);
  }
}

TEST_CASE("a load that fails with leases on it leaves them to their releases", "[sched][ledger]") {
  ledger_fixture f;
  auto a = f.add("a");
  REQUIRE(f.l->acquire(a, f.t) == acquire_result::wait_load);
  REQUIRE(f.l->pump(f.t).loads.size() == 1);
  REQUIRE(f.l->load_started(a, f.t));  // on by default
  f.l->grant(a, f.t);
  f.l->load_failed(a);
  CHECK(f.l->model(a).state == model_state::offloaded);
  CHECK(f.l->device(0).used_bytes == 0);
  CHECK(f.l->model(a).leases == 1);
  bool last = false;
  CHECK(f.l->release(a, f.t, &last));
  CHECK(last);
  // It loads again on the next want.
  f.use(a);
  CHECK(f.l->model(a).state == model_state::resident);
}

TEST_CASE(
    "a link the config leaves unknown is learned from the loads over it, and a configured one is "
    "kept",
    "[ledger]") {
  // A GPU's link is not configured: 10 GB/s was assumed for every load, so on a 55 GB/s
  // link a batch leased while its model loaded started 5x later than the load ended.
  refusal why;
  auto l = ledger::make({{4096 * mb, 0}, {4096 * mb, 2}}, {"lru", 1, false}, &why);
  REQUIRE(l);
  auto gpu_model = l->add("g", {{0}, {2000 * mb}, false, 0}, &why);
  auto emu_model = l->add("e", {{1}, {200 * mb}, false, 0}, &why);
  REQUIRE(gpu_model);
  REQUIRE(emu_model);
  auto seconds_at = [](uint64_t bytes, double gbps) { return bytes / (gbps * 1e9); };
  CHECK(l->load_seconds(*gpu_model) == Approx(seconds_at(2000 * mb, 10)));
  CHECK(l->link_gbps(0) == 10);

  l->note_transfer(0, 2000 * mb, seconds_at(2000 * mb, 55));
  CHECK(l->link_gbps(0) == Approx(55));
  CHECK(l->load_seconds(*gpu_model) == Approx(seconds_at(2000 * mb, 55)));
  // The newest load weighs half: a slow one moves the estimate without replacing it.
  l->note_transfer(0, 2000 * mb, seconds_at(2000 * mb, 45));
  CHECK(l->link_gbps(0) == Approx(50));
  // Tiny copies (their time is mostly submission) and empty reports teach nothing.
  l->note_transfer(0, 64 * 1024, 1.0);
  l->note_transfer(0, 2000 * mb, 0);
  l->note_transfer(7, 2000 * mb, 1.0);  // no such device
  CHECK(l->link_gbps(0) == Approx(50));

  // A configured rate (an emulated device's throttle) is what the device promises.
  l->note_transfer(1, 200 * mb, seconds_at(200 * mb, 1.5));
  CHECK(l->link_gbps(1) == 2);
  CHECK(l->load_seconds(*emu_model) == Approx(seconds_at(200 * mb, 2)));
}
