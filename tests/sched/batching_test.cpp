#include <catch2/catch.hpp>

#include <set>

#include "sched/batching.hpp"
#include "sched/step_fit.hpp"

using namespace computron;
using namespace computron::sched;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<batcher> make(batching_options o) {
  refusal why;
  auto b = batcher::make(std::move(o), &why);
  REQUIRE(b);
  return b;
}

}  // namespace

TEST_CASE("a queue goes when it is full or its head waited a batch window", "[sched][batching]") {
  batching_options o;
  o.max_batch_size = 3;
  o.batch_window = 5ms;
  auto b = make(o);
  auto m = b->add_model("m", 1);
  time_point t{};
  REQUIRE_FALSE(b->admit(m, 1, t, 0));
  REQUIRE_FALSE(b->admit(m, 2, t + 1ms, 0));
  auto d = b->dispatch(t + 1ms);
  CHECK(d.batches.empty());
  REQUIRE(d.next_tick);
  CHECK(*d.next_tick == t + 5ms);  // the head's window closes
  d = b->dispatch(t + 5ms);
  REQUIRE(d.batches.size() == 1);
  CHECK(d.batches[0].rows.size() == 2);
  CHECK(d.batches[0].rows[0].key == 1);
  CHECK(b->in_flight(m) == 1);
  // A full queue goes at once, but only max_in_flight batches of a model run.
  for (uint64_t k = 3; k <= 6; ++k) REQUIRE_FALSE(b->admit(m, k, t + 6ms, 0));
  CHECK(b->dispatch(t + 6ms).batches.empty());
  b->batch_ended(m);
  d = b->dispatch(t + 6ms);
  REQUIRE(d.batches.size() == 1);
  CHECK(d.batches[0].rows.size() == 3);
  CHECK(b->queued(m) == 1);
}

TEST_CASE("admission bounds each queue and gives every request its deadline", "[sched][batching]") {
  batching_options o;
  o.max_queue = 2;
  o.default_deadline = 60s;
  auto b = make(o);
  auto m = b->add_model("m", 1);
  time_point t{}, d1, d2;
  REQUIRE_FALSE(b->admit(m, 1, t, 0, &d1));
  REQUIRE_FALSE(b->admit(m, 2, t, 250, &d2));
  CHECK(d1 == t + 60s);
  CHECK(d2 == t + 250ms);
  auto why = b->admit(m, 3, t, 0);
  REQUIRE(why);
  CHECK(why->code == ec::overloaded);
  CHECK(why->reason == "the queue of m is full (2 requests)");
  CHECK(deadline_of(t, 0, 3s) == t + 3s);
}

TEST_CASE("requests past their deadline leave the queue as expired", "[sched][batching]") {
  batching_options o;
  o.batch_window = 1s;
  auto b = make(o);
  auto m = b->add_model("m", 1);
  time_point t{};
  b->admit(m, 1, t, 100);
  b->admit(m, 2, t, 0);
  auto d = b->dispatch(t + 10ms);
  REQUIRE(d.next_tick);
  CHECK(*d.next_tick == t + 100ms);  // the deadline comes before the window
  d = b->dispatch(t + 100ms);
  REQUIRE(d.expired.size() == 1);
  CHECK(d.expired[0].second.key == 1);
  CHECK(b->queued(m) == 1);
}

TEST_CASE("the dispatch policy orders the models' batches", "[sched][batching]") {
  for (std::string policy : {"fcfs", "resident-first", "edf"}) {
    batching_options o;
    o.max_batch_size = 1;
    o.dispatch = policy;
    auto b = make(o);
    auto cold = b->add_model("cold", 1), warm = b->add_model("warm", 1);
    b->set_resident(warm, true);
    time_point t{};
    b->admit(cold, 1, t, 0);         // oldest, generous deadline
    b->admit(warm, 2, t + 1ms, 50);  // resident, tight deadline
    auto d = b->dispatch(t + 2ms);
    REQUIRE(d.batches.size() == 2);
    INFO(policy);
    auto first = d.batches[0].model;
    CHECK(first == (policy == "fcfs" ? cold : warm));
  }
}

TEST_CASE("the device gate lets one placement share devices up to its depth", "[sched][batching]") {
  device_gate g{4};
  auto pipe = g.placement_key(1, 2, {0, 1});
  auto other = g.placement_key(1, 1, {1});
  CHECK(g.placement_key(1, 2, {0, 1}) == pipe);
  auto pass = g.begin_pass();
  CHECK(g.try_start(pass, pipe, {0, 1}, 2));
  CHECK(g.try_start(pass, pipe, {0, 1}, 2));  // stage 0 and stage 1 both busy
  CHECK_FALSE(g.try_start(pass, pipe, {0, 1}, 2));
  CHECK_FALSE(g.try_start(pass, other, {1}, 1));  // another placement never shares
  g.finish({0, 1});
  g.finish({0, 1});
  pass = g.begin_pass();
  CHECK(g.try_start(pass, other, {1}, 1));
  // A waiting batch reserves its devices for the rest of the pass.
  pass = g.begin_pass();
  CHECK_FALSE(g.try_start(pass, pipe, {0, 1}, 2));
  CHECK_FALSE(g.try_start(pass, g.placement_key(1, 1, {0}), {0}, 1));
}

TEST_CASE("batching options are checked", "[sched][batching]") {
  refusal why;
  batching_options o;
  o.max_batch_size = 0;
  CHECK_FALSE(batcher::make(o, &why));
  o.max_batch_size = 1;
  o.dispatch = "lifo";
  CHECK_FALSE(batcher::make(o, &why));
  CHECK(why.code == ec::invalid_configuration);
}

TEST_CASE("requests that asked to be dropped rather than served late are dropped at their turn",
          "[sched][batching][slo]") {
  batching_options o;
  o.batch_window = 0ms;
  auto b = make(o);
  auto m = b->add_model("m", 8);
  time_point t{};
  auto keys = [](const std::vector<std::pair<uint32_t, queued_entry>>& es) {
    std::vector<uint64_t> out;
    for (auto& e : es) out.push_back(e.second.key);
    return out;
  };
  // Nothing measured yet: no estimate, nothing is dropped.
  CHECK_FALSE(b->estimate_s(m, 1));
  b->admit(m, 1, t, 10, nullptr, 1, true);
  auto d = b->dispatch(t);
  CHECK(d.dropped.empty());
  REQUIRE(d.batches.size() == 1);

  // 100 ms a step, a load of 1 s.
  b->note_steps(m, 0.2, 2);
  b->note_load(m, 1.0);
  b->batch_ended(m);
  CHECK(*b->estimate_s(m, 3) == Approx(1.3));  // not resident: the load comes first
  b->set_resident(m, true);
  CHECK(*b->estimate_s(m, 3) == Approx(0.3));
  b->admit(m, 2, t, 50, nullptr, 1, true);   // 100 ms of work, 50 ms left: dropped
  b->admit(m, 3, t, 500, nullptr, 1, true);  // fits
  b->admit(m, 4, t, 50, nullptr, 1, false);  // late, but it did not ask: served
  b->admit(m, 5, t, 250, nullptr, 3, true);  // three steps, 300 ms: dropped
  d = b->dispatch(t);
  CHECK(keys(d.dropped) == std::vector<uint64_t>{2, 5});
  REQUIRE(d.batches.size() == 1);
  std::vector<uint64_t> batched;
  for (auto& e : d.batches[0].rows) batched.push_back(e.key);
  CHECK(batched == std::vector<uint64_t>{3, 4});
  CHECK(b->queued(m) == 0);

  // Not resident, the load counts: 500 ms is not enough any more; but not while a batch
  // of the model is in flight (it is loading the model already).
  b->set_resident(m, false);
  CHECK(*b->estimate_s(m, 1) == Approx(0.1));
  b->batch_ended(m);
  CHECK(*b->estimate_s(m, 1) == Approx(1.1));
  b->admit(m, 6, t, 500, nullptr, 1, true);
  d = b->dispatch(t);
  CHECK(keys(d.dropped) == std::vector<uint64_t>{6});
  CHECK(d.batches.empty());
  // The averages move towards new measurements.
  b->note_steps(m, 0.5, 1);
  CHECK(*b->estimate_s(m, 1) == Approx(1.0 + 0.1 + 0.25 * 0.4));
}

TEST_CASE("the queue matches a plain list under random admissions, expiries and batches",
          "[sched][batching]") {
  // The batcher's queue keeps tombstones and a lazy heap; this replays a random history
  // against a plain vector that scans everything, the obvious (slow) implementation.
  batching_options o;
  o.max_batch_size = 4;
  o.batch_window = 3ms;
  o.max_queue = 1000;
  auto b = make(o);
  auto m = b->add_model("m", 1 << 20);
  struct ref_entry {
    uint64_t key;
    time_point arrival, deadline;
  };
  std::vector<ref_entry> ref;
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  time_point t{};
  uint64_t key = 1;
  for (int round = 0; round < 3000; ++round) {
    t += std::chrono::microseconds(next() % 2000);
    for (auto n = next() % 4; n > 0; --n) {
      auto deadline_ms = static_cast<int64_t>(1 + next() % 40);
      time_point dl;
      REQUIRE_FALSE(b->admit(m, key, t, deadline_ms, &dl));
      ref.push_back({key++, t, dl});
    }
    auto d = b->dispatch(t);
    // Expired: exactly those past their deadline.
    std::set<uint64_t> want_expired, got_expired;
    std::vector<ref_entry> live;
    for (auto& e : ref) (e.deadline <= t ? want_expired.insert(e.key), void() : live.push_back(e));
    for (auto& [_, e] : d.expired) got_expired.insert(e.key);
    REQUIRE(got_expired == want_expired);
    ref = std::move(live);
    // A batch: the first ones in arrival order when full or the head waited its window.
    std::vector<uint64_t> want_batch, got_batch;
    if (!ref.empty() && (ref.size() >= 4 || t - ref.front().arrival >= 3ms)) {
      auto n = std::min<size_t>(4, ref.size());
      for (size_t i = 0; i < n; ++i) want_batch.push_back(ref[i].key);
      ref.erase(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(n));
    }
    for (auto& p : d.batches)
      for (auto& e : p.rows) got_batch.push_back(e.key);
    REQUIRE(got_batch == want_batch);
    REQUIRE(b->queued(m) == ref.size());
    if (!ref.empty()) {
      REQUIRE(d.next_tick);
      auto earliest = ref.front().deadline;
      for (auto& e : ref) earliest = std::min(earliest, e.deadline);
      CHECK(*d.next_tick <= earliest);
    }
  }
}

TEST_CASE("a batch leased on a loading model starts when the rest takes its first stage",
          "[sched][batching]") {
  time_point t{};
  auto at = [&](double left, double step, int32_t pp) {
    return seconds_between(t, overlap_start(t, left, step, pp));
  };
  CHECK(at(1.0, 0.2, 1) == Approx(0.8));  // its one stage meets the last bytes
  CHECK(at(1.0, 0.2, 2) == Approx(0.9));  // the first of two stages: 0.1 s
  CHECK(at(0.1, 0.4, 1) == Approx(0.0));  // compute outlasts the load: at once
  CHECK(at(1.0, 0.0, 1) == Approx(1.0));  // step unknown: about the whole load
  CHECK(at(0.0, 0.2, 4) == Approx(0.0));  // nothing left
}

TEST_CASE("step_fit: a step's fixed cost and cost per token from measured steps",
          "[batching][step_fit]") {
  sched::step_fit f;
  CHECK(f.fitted().fixed_s == 0);
  // One token count only: its mean as the fixed cost.
  f.add(8, 0.040);
  f.add(8, 0.044);
  CHECK(f.fitted().fixed_s == Approx(0.042));
  CHECK(f.fitted().per_token_s == 0);
  // Decode steps of 8 rows and prefills of 512 tokens: 42 ms + 0.5 ms per token.
  for (int i = 0; i < 4; ++i) f.add(512, 0.042 + 0.0005 * 504);
  auto l = f.fitted();
  CHECK(l.fixed_s + 8 * l.per_token_s == Approx(0.042).epsilon(0.01));
  CHECK(l.fixed_s + 512 * l.per_token_s == Approx(0.294).epsilon(0.01));
  // Never negative: a line through below the origin gives no fixed cost.
  sched::step_fit g;
  g.add(10, 0.001);
  g.add(100, 0.0105);
  CHECK(g.fitted().fixed_s == 0);
  CHECK(g.fitted().per_token_s > 0);
}
