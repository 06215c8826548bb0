#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "sim/simulator.hpp"

using namespace computron;
using namespace computron::sim;

namespace {

/// Runs a config the simulator must accept.
sim_result accepted(const sim_config& cfg, const workload::schedule& s) {
  auto r = run(cfg, s);
  if (!r) FAIL(render(r.error()));
  return std::move(*r);
}

constexpr uint64_t gb = 1000000000;

/// One device with room for one of two 1 GB models, a 1 GB/s link, 100 ms per forward
/// step, batches of one that go at once, and every overhead zero: each latency is known.
sim_config two_models() {
  sim_config c;
  c.devices = {{1500000000, 1.0}};
  c.batching.max_batch_size = 1;
  c.batching.batch_window = std::chrono::milliseconds(0);
  c.cost = {1.0, 0, 0, 0, 0, 0};
  for (auto name : {"a", "b"}) {
    sim_model m;
    m.name = name;
    m.devices = {0};
    m.shard_bytes = {gb};
    m.step_s = 0.1;
    c.models.push_back(m);
  }
  return c;
}

workload::schedule arrivals(std::vector<std::pair<double, uint32_t>> xs) {
  workload::schedule s;
  s.models = {"a", "b"};
  for (auto& [t, m] : xs) s.arrivals.push_back({t, m, 0, 0});
  s.duration_s = xs.back().first + 1;
  return s;
}

}  // namespace

TEST_CASE("a hand-computed scenario: every latency is load plus compute, or compute alone",
          "[sim]") {
  auto cfg = two_models();
  // a cold; b cold (a evicted); a again; a warm; b while a's batch runs (a drains first).
  auto s = arrivals({{0, 0}, {5, 1}, {10, 0}, {20, 0}, {20.05, 1}});
  auto r = accepted(cfg, s);
  REQUIRE(r.records.size() == 5);
  // A model's first batch, leased as its load starts, knows no step time yet: it waits for
  // the whole load and starts at the tick armed for then, 100 us later (as the manager's
  // does: the end of a load reaches the scheduler, not the manager). Later batches start a
  // step before the load ends and meet the bytes as they arrive.
  std::vector<double> expected{1.1001, 1.1001, 1.1, 0.1, 1.15};
  for (size_t i = 0; i < 5; ++i) {
    INFO("request " << i);
    CHECK(r.records[i].ok());
    CHECK(r.records[i].latency_s() == Approx(expected[i]).margin(1e-6));
  }
  CHECK(r.records[0].swapped);
  CHECK_FALSE(r.records[3].swapped);
  // Waited for a's batch to drain; leased when b's load started (compute while loading;
  // one layer per stage here, so the step still waits for all of b).
  CHECK(r.records[4].load_ms == Approx(50).margin(1e-3));
  REQUIRE(r.devices.size() == 1);
  CHECK(r.devices[0].shard_loads == 4);
  CHECK(r.devices[0].evictions == 3);
  CHECK(r.devices[0].bytes_loaded == Approx(4.0 * gb));
  CHECK(r.swaps.size() == 7);
}

TEST_CASE("batching in the simulator follows the batch window and size", "[sim]") {
  auto cfg = two_models();
  cfg.batching.max_batch_size = 2;
  cfg.batching.batch_window = std::chrono::milliseconds(50);
  cfg.warm_up = true;  // b is resident at the start (the last one warmed)
  auto s = arrivals({{0, 1}, {0.01, 1}, {0.02, 1}, {1.0, 1}});
  auto r = accepted(cfg, s);
  // The first two fill a batch at 0.01 s; the third waits a window (to 0.07 + the tick's
  // 100 us) and then for the first batch's device (to 0.11); the fourth waits a window.
  CHECK(r.records[0].latency_s() == Approx(0.11).margin(1e-6));
  CHECK(r.records[1].latency_s() == Approx(0.10).margin(1e-6));
  CHECK(r.records[2].latency_s() == Approx(0.19).margin(1e-6));
  CHECK(r.records[3].latency_s() == Approx(0.1501).margin(1e-6));
  for (auto& rec : r.records) CHECK_FALSE(rec.swapped);
}

TEST_CASE("the simulator is deterministic for a seed", "[sim]") {
  auto cfg = two_models();
  cfg.batching.max_batch_size = 4;
  cfg.batching.batch_window = std::chrono::milliseconds(5);
  cfg.cost = cost_model{};
  auto run_seed = [&](uint64_t seed) {
    auto s = workload::generate({{"a", "b"}, {4, 2}, 2.0, 20, seed});
    REQUIRE(s);
    auto r = accepted(cfg, *s);
    std::vector<double> out;
    for (auto& rec : r.records) out.push_back(rec.done_s);
    return out;
  };
  auto x = run_seed(3), y = run_seed(3), z = run_seed(4);
  CHECK(x.size() > 50);
  CHECK(x == y);
  CHECK(x != z);
}

TEST_CASE("the simulator refuses what the runtime refuses", "[sim]") {
  auto cfg = two_models();
  cfg.models[1].shard_bytes = {2 * gb};  // larger than the device
  auto r = accepted(cfg, arrivals({{0, 1}, {1, 0}}));
  CHECK(r.records[0].status == 503);
  CHECK(r.records[1].ok());

  cfg = two_models();
  cfg.batching.max_queue = 1;
  cfg.batching.max_batch_size = 2;  // the first waits a window, so the second finds it full
  cfg.batching.batch_window = std::chrono::milliseconds(100);
  r = accepted(cfg, arrivals({{0, 0}, {0, 0}}));
  CHECK(r.records[1].status == 429);

  // A refused config is an error with a code, as the runtime's are.
  auto refused = [](const sim_config& c, const workload::schedule& s, ec code,
                    const std::string& what) {
    auto x = run(c, s);
    if (x) return false;
    INFO(render(x.error()));
    return is(x.error(), code) && render(x.error()).find(what) != std::string::npos;
  };
  cfg = two_models();
  cfg.models[0].devices = {3};
  CHECK(refused(cfg, arrivals({{0, 0}}), ec::invalid_configuration, "device 3"));
  cfg = two_models();
  cfg.cost.link_efficiency = 0;
  CHECK(refused(cfg, arrivals({{0, 0}}), ec::invalid_configuration, "link_efficiency"));
  auto s = arrivals({{0, 0}});
  s.models = {"a", "zz"};
  CHECK(refused(two_models(), s, ec::unknown_model, "zz"));
}

TEST_CASE("prefetch in the simulator: the model in demand comes back before its request",
          "[sim][prefetch]") {
  // a is asked four times at 0 and b once at 5: b's load evicts a. When b's batch ends
  // (6.1 s), a's decayed demand (4 e^-0.61 / 10 s = 0.22/s) is over twice b's (0.09/s), so
  // with prefetch a comes back over the idle link and the request at 8 s finds it resident.
  auto s = arrivals({{0, 0}, {0, 0}, {0, 0}, {0, 0}, {5, 1}, {8, 0}});
  for (bool prefetch : {false, true}) {
    auto cfg = two_models();
    cfg.scheduler.prefetch = prefetch;
    auto r = accepted(cfg, s);
    INFO("prefetch " << prefetch);
    // b's first batch: its load, the tick's 100 us (see the hand-computed scenario), a step.
    CHECK(r.records[4].latency_s() == Approx(1.1001).margin(1e-6));
    CHECK(r.records[5].latency_s() == Approx(prefetch ? 0.1 : 1.1).margin(1e-6));
    CHECK(r.records[5].swapped == !prefetch);
    CHECK(r.prefetches == (prefetch ? 1u : 0u));
    CHECK(r.prefetch_hits == (prefetch ? 1u : 0u));
  }
}

TEST_CASE("drop-late in the simulator refuses at dispatch what expiry refuses after a load",
          "[sim][slo]") {
  auto cfg = two_models();
  cfg.drop_late_deadline_ms = 500;
  // Leased only once loaded, so a deadline can pass during the load.
  cfg.scheduler.compute_while_loading = false;
  // a cold (its deadline passes while it loads); a warm; b cold (likewise); a cold again:
  // its 1 s load is known now, so it is refused at once and nothing loads for it.
  auto s = arrivals({{0, 0}, {5, 0}, {10, 1}, {20, 0}});
  auto r = accepted(cfg, s);
  REQUIRE(r.records.size() == 4);
  CHECK(r.records[0].status == 503);
  CHECK(r.records[0].done_s == Approx(1.0).margin(1e-6));
  CHECK(r.records[1].ok());
  CHECK(r.records[1].latency_s() == Approx(0.1).margin(1e-6));
  CHECK(r.records[2].status == 503);
  CHECK(r.records[2].done_s == Approx(11.0).margin(1e-6));
  CHECK(r.records[3].status == 503);
  CHECK(r.records[3].done_s == Approx(20.0).margin(1e-6));
  CHECK(r.devices[0].shard_loads == 2);
}

TEST_CASE("compute while loading in the simulator: a cold request costs its load and one layer",
          "[sim]") {
  for (bool overlap : {true, false}) {
    INFO("compute while loading " << overlap);
    auto cfg = two_models();
    cfg.scheduler.compute_while_loading = overlap;
    cfg.models[0].layers = 4;
    // b: two pipeline stages on two devices, 50 ms each, 1 GB each, loading in parallel.
    cfg.devices.push_back({1500000000, 1.0});
    cfg.models[1].pp = 2;
    cfg.models[1].devices = {0, 1};
    cfg.models[1].shard_bytes = {gb, gb};
    cfg.models[1].layers = 4;
    // Each model served once before (unmeasured): its step time is known, so a batch
    // leased while it loads starts when the rest of the load takes about its first stage.
    cfg.warm_up = true;
    auto s = arrivals({{0, 0}, {5, 1}});
    auto r = accepted(cfg, s);
    REQUIRE(r.records.size() == 2);
    // a: layer i of 4 waits for (i+1)/4 of the 1 s load; the last ends 25 ms after it.
    CHECK(r.records[0].latency_s() == Approx(overlap ? 1.025 : 1.1).margin(1e-6));
    // b: stage 0's last layer ends at 1.0125 s; stage 1 (loaded at 1.0) takes its 50 ms.
    CHECK(r.records[1].latency_s() == Approx(overlap ? 1.0625 : 1.1).margin(1e-6));
    CHECK(r.records[1].load_ms == Approx(overlap ? 0 : 1000).margin(1e-3));
    // Each step time learned is the step's own, never the wait.
    CHECK(r.records[0].compute_ms == Approx(100).margin(1e-3));
  }
}

TEST_CASE("the simulator runs one stage job per device at a time, whatever its model", "[sim]") {
  auto cfg = two_models();
  // Both models on the same two devices as two pipeline stages, both resident.
  cfg.devices = {{4000000000, 1.0}, {4000000000, 1.0}};
  for (auto& m : cfg.models) {
    m.pp = 2;
    m.devices = {0, 1};
    m.shard_bytes = {gb / 2, gb / 2};
  }
  cfg.warm_up = true;
  auto s = arrivals({{0, 0}, {0, 1}});
  auto r = accepted(cfg, s);
  REQUIRE(r.records.size() == 2);
  // a: stage 0 on device 0 for 50 ms, then stage 1 on device 1. b's stage 0 waits for
  // device 0 (the worker's one compute lane), then follows a through the pipeline.
  CHECK(r.records[0].latency_s() == Approx(0.10).margin(1e-6));
  CHECK(r.records[1].latency_s() == Approx(0.15).margin(1e-6));
}

TEST_CASE("a layer computed while its shard loads waits for the chunk holding its bytes", "[sim]") {
  auto cfg = two_models();
  cfg.models[0].layers = 4;
  cfg.warm_up = true;  // the step time is known: the batch starts 100 ms before the end
  for (uint64_t chunk : {uint64_t{0}, uint64_t{600000000}}) {
    INFO("chunk " << chunk);
    cfg.chunk_bytes = chunk;
    auto s = arrivals({{0, 0}});
    auto r = accepted(cfg, s);
    // Continuous bytes: the last layer meets the last bytes at 1.0 s, ends at 1.025.
    // 600 MB chunks: layers 0-1 come with the first chunk (0.6 s), layers 2-3 only with
    // the second (1.0 s): 0.9-0.95 computing, then 1.0-1.05.
    CHECK(r.records[0].latency_s() == Approx(chunk == 0 ? 1.025 : 1.05).margin(1e-6));
  }
}

namespace {

/// Models a and b of 1 GB on one device of 2.5 GB: 0.5 GB beside both, 50 KV blocks of
/// 10 MB. Eight requests of a (prompt 100 tokens, 100 to generate) need 13 blocks each at
/// their end, 104 in all.
sim_config kv_pressure() {
  auto c = two_models();
  c.devices = {{2500000000, 1.0}};
  c.batching.max_batch_size = 8;
  for (auto& m : c.models) {
    m.kv_block_bytes = {10000000};
    m.step_s = 0.01;
  }
  return c;
}

workload::schedule eight_long(double at) {
  workload::schedule s;
  s.models = {"a", "b"};
  for (int i = 0; i < 8; ++i) s.arrivals.push_back({at, 0, 100, 100});
  s.duration_s = at + 1;
  return s;
}

}  // namespace

TEST_CASE(
    "KV blocks share the device with the weights: a lease-free model is evicted for "
    "a batch's growing KV, and nothing fails",
    "[sim][kv]") {
  auto cfg = kv_pressure();
  auto s = eight_long(1);
  // b first, then a: both resident when a's batch starts.
  s.arrivals.insert(s.arrivals.begin(), {0.5, 0, 8, 1});
  s.arrivals.insert(s.arrivals.begin(), {0, 1, 8, 1});
  auto r = accepted(cfg, s);
  REQUIRE(r.records.size() == 10);
  for (auto& rec : r.records) {
    INFO(rec.status << " " << rec.error_kind << " at " << rec.done_s);
    CHECK(rec.ok());
  }
  // b's eviction made the room: more than the 0.5 GB beside both models was held.
  CHECK(r.peak_kv_bytes > 500000000);
  CHECK(r.devices[0].evictions == 1);
  CHECK(r.preemptions == 0);
}

TEST_CASE(
    "short of KV room with nothing to evict, the youngest rows are preempted and "
    "recomputed, every request still succeeds",
    "[sim][kv]") {
  auto cfg = kv_pressure();
  cfg.models[1].pinned = true;  // b stays: 50 blocks is all a's batches get
  auto s = eight_long(1);
  s.arrivals.insert(s.arrivals.begin(), {0, 1, 8, 1});
  auto r = accepted(cfg, s);
  REQUIRE(r.records.size() == 9);
  for (auto& rec : r.records) {
    INFO(rec.status << " " << rec.error_kind << " at " << rec.done_s);
    CHECK(rec.ok());
  }
  CHECK(r.preemptions > 0);
  CHECK(r.peak_kv_bytes <= 500000000);
  CHECK(r.devices[0].evictions == 0);
}

TEST_CASE(
    "a request whose KV can never fit beside its model fails (503, as the runtime answers), the "
    "rest "
    "are served",
    "[sim][kv]") {
  auto cfg = kv_pressure();
  cfg.models[1].pinned = true;
  workload::schedule s;
  s.models = {"a", "b"};
  s.arrivals = {{0, 1, 8, 1}, {1, 0, 1000, 1}, {1.5, 0, 10, 5}};
  s.duration_s = 3;
  auto r = accepted(cfg, s);
  REQUIRE(r.records.size() == 3);
  CHECK(r.records[0].ok());
  CHECK(r.records[1].status == 503);
  CHECK(r.records[2].ok());
}
