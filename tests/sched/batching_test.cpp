#include <catch2/catch.hpp>

#include "sched/batching.hpp"

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
