// The two drivers of the decision code, side by side: the runtime's actors (swap scheduler
// and model manager, under CAF's test coordinator) and the simulator (sim::run) get the
// same devices, models and arrivals, and must carry out the same effects: the same shard
// loads and evictions in the same order, and the same outcome for every request. Both
// claim to run sched/'s decisions unchanged, so any rule written twice (a tick, a drain, a
// lease on a loading model) shows up here as a difference.
//
// The actors' workers are paced fakes: a load takes bytes / link rate, an eviction the
// simulator's evict_s, and a forward step holds each stage's device for its share of the
// model's step time, after the stage's bytes arrived, one job per device at a time. That
// is the simulator's cost model with every overhead zero, so the virtual times must agree
// too, not only the orders.
#include <catch2/catch.hpp>

#include "tests/actors/drivers_agree.hpp"

using namespace computron;
using namespace computron::testing::drivers;
using namespace std::chrono_literals;

namespace {

/// Two devices of 100 MB; a (60 MB) and b (50 MB) on device 0 never fit together, p is a
/// two-stage pipeline with 40 MB on each device, c (70 MB) never fits beside p on device 1.
scenario contended() {
  scenario s;
  s.capacity_bytes = {100 * mb, 100 * mb};
  s.link_gbps = 1.0;
  s.evict_ms = 1.0;
  s.models = {{"a", 1, {0}, 60 * mb, 30},
              {"b", 1, {0}, 50 * mb, 20},
              {"p", 2, {0, 1}, 40 * mb, 40},
              {"c", 1, {1}, 70 * mb, 10}};
  s.batching.max_batch_size = 2;
  s.batching.batch_window = 5ms;
  s.batching.max_queue = 2;
  s.batching.default_deadline = 125ms;
  // Times chosen so that no two events meet at one instant (see the walk-through in the
  // test); the comments say what each arrival is for.
  s.arrivals = {
      {0, "a"},    // cold: a loads
      {10, "p"},   // cold: p loads after a (one transfer per link)
      {110, "c"},  // needs p's room on device 1 while p's batch runs: p drains
      {120, "p"},  // p is draining: held; when p is evicted it waits for p to load again,
                   // and its deadline (245 ms) passes before its batch can start: refused
      {130, "p"},  // two batches of p in flight already: queued until one ends
      {300, "b"},  // needs a's room on device 0 (a idle, p leased): a is evicted
      {303, "b"},  // joins the same batch
      {306, "b"},  // queued behind the running batch
      {309, "b"},  // queued
      {312, "b"},  // the queue (2) is full: refused
      {600, "a"},  // a again: b is the victim
      {700, "c"},  // c again
      {900, "p"},  // p again
  };
  return s;
}

/// What the contended scenario must exercise (else agreeing would prove little), checked
/// on the simulator's run (the runtime's is checked against it).
void check_contended_coverage(const effects& simulated, double drain_end_s) {
  // p's first eviction waits for its batch (drain_end_s), not for c's request (115.1 ms): a
  // drain. c's second load evicts p from both devices; a and b take turns on device 0;
  // b's burst overflows its queue; the request held during p's drain expires.
  auto starts = decisions_of(simulated.starts);
  std::vector<std::string> expected{"load a@0",    "load p@0,1", "evict p@0,1", "load c@1",
                                    "evict c@1",   "load p@0,1", "evict a@0",   "load b@0",
                                    "evict p@0,1", "evict b@0",  "load a@0",    "load c@1",
                                    "evict c@1",   "load p@0,1"};
  CHECK(names_of(starts) == expected);
  REQUIRE(starts.size() >= 3);
  CHECK(starts[2].at_s == Approx(drain_end_s).margin(1e-6));
  std::map<int, int> statuses;
  int swapped = 0, warm = 0;
  for (auto& o : simulated.outcomes) {
    ++statuses[o.status];
    if (o.status == 200) ++(o.swapped ? swapped : warm);
  }
  CHECK(statuses[429] == 1);
  CHECK(statuses[503] >= 1);
  CHECK(simulated.outcomes.at(3).status == 503);
  CHECK(swapped >= 5);
  CHECK(warm >= 2);
}

}  // namespace

TEST_CASE("the actors and the simulator agree on a contended schedule, leases once loaded",
          "[drivers]") {
  auto s = contended();
  s.compute_while_loading = false;
  check_contended_coverage(check_drivers_agree(s), 0.1451);
}

TEST_CASE("the actors and the simulator agree on a contended schedule, compute while loading",
          "[drivers]") {
  auto s = contended();
  s.compute_while_loading = true;
  // p's first batch, leased as its load started, runs at the tick after the load (100 us
  // later: nobody tells the manager the load ended), and ends 0.1 ms later than above.
  check_contended_coverage(check_drivers_agree(s), 0.1452);
}

TEST_CASE("the actors and the simulator agree on one cold request, compute while loading",
          "[drivers]") {
  // The smallest case of the contended run's first difference: a model's first batch,
  // leased while its load runs, with no step time measured yet, so it is due when the
  // load ends (sched::overlap_start).
  scenario s;
  s.capacity_bytes = {100 * mb};
  s.models = {{"a", 1, {0}, 60 * mb, 30}};
  s.batching.batch_window = 5ms;
  s.arrivals = {{0, "a"}};
  s.compute_while_loading = true;
  auto simulated = check_drivers_agree(s);
  REQUIRE(simulated.outcomes.size() == 1);
  // Window 5 ms + tick 0.1 ms, load 60 ms + tick 0.1 ms (the batch is due when the load
  // ends and starts at the tick armed for then, in both drivers), step 30 ms.
  CHECK(simulated.outcomes[0].done_s == Approx(0.0952).margin(1e-6));
}

TEST_CASE("the actors and the simulator agree on continuous batching: joins and leaves",
          "[drivers][continuous]") {
  // One model, 10 ms steps: a long request decodes; two short ones arrive while it runs
  // and join it at step boundaries (one prefill step for them), leave when done, and a
  // request of another model waits for the device, so a later one of the first does not
  // join but waits for the batch to end.
  for (bool continuous : {true, false}) {
    INFO("continuous " << continuous);
    scenario s;
    s.capacity_bytes = {100 * mb};
    s.models = {{"a", 1, {0}, 10 * mb, 10}, {"b", 1, {0}, 10 * mb, 10}};
    s.batching.max_batch_size = 4;
    s.batching.batch_window = 5ms;
    s.batching.continuous = continuous;
    s.arrivals = {{0, "a", 20},  {52, "a", 3},  {54.5, "a", 2}, {60, "a", 2},
                  {101, "b", 2}, {123, "a", 4}, {400, "a", 3}};
    auto simulated = check_drivers_agree(s);
    // The request at 60 ms arrives during the others' joining prefill: it joins at the
    // boundary after the next decode step, in both drivers.
    REQUIRE(simulated.outcomes.size() == 7);
    for (auto& o : simulated.outcomes) CHECK(o.status == 200);
    // The short requests are answered long before the long one with joins, after it
    // without.
    if (continuous)
      CHECK(simulated.outcomes[1].done_s < simulated.outcomes[0].done_s);
    else
      CHECK(simulated.outcomes[1].done_s > simulated.outcomes[0].done_s);
  }
}

TEST_CASE("the actors and the simulator agree on chunked prefill: joiners come in chunks",
          "[drivers][continuous][chunked]") {
  // A long request decodes; one with a 10-token prompt joins in chunks of 4 (2, 4 and 4
  // tokens), each a step of its own between the running row's; one arriving meanwhile
  // joins only after the chunked join ends; a long prompt while nothing else runs is
  // prefilled whole.
  scenario s;
  s.capacity_bytes = {100 * mb};
  s.models = {{"a", 1, {0}, 10 * mb, 10}};
  s.batching.max_batch_size = 4;
  s.batching.batch_window = 5ms;
  s.batching.prefill_chunk = 4;
  s.arrivals = {{0, "a", 20, 3}, {52, "a", 3, 10}, {61, "a", 2, 3}, {600, "a", 2, 12}};
  auto simulated = check_drivers_agree(s);
  REQUIRE(simulated.outcomes.size() == 4);
  for (auto& o : simulated.outcomes) CHECK(o.status == 200);
  CHECK(simulated.outcomes[1].done_s < simulated.outcomes[0].done_s);
  // Steps here take 10 ms whatever their tokens: the two partial chunks and the running
  // row's steps after them put the joiner 40 ms behind its whole prefill.
  s.batching.prefill_chunk = 0;
  auto whole = check_drivers_agree(s);
  REQUIRE(whole.outcomes.size() == 4);
  CHECK(simulated.outcomes[1].done_s - whole.outcomes[1].done_s == Approx(0.040).margin(0.002));
}

TEST_CASE("the actors and the simulator agree when the running rows end during a chunked join",
          "[drivers][continuous][chunked]") {
  // The running request ends two steps into a 16-token prompt's chunks of 4: the batch does
  // not end, the rest of the prompt goes in one step and the joiner decodes on.
  scenario s;
  s.capacity_bytes = {100 * mb};
  s.models = {{"a", 1, {0}, 10 * mb, 10}};
  s.batching.max_batch_size = 4;
  s.batching.batch_window = 5ms;
  s.batching.prefill_chunk = 4;
  s.arrivals = {{0, "a", 4, 3}, {22, "a", 3, 16}, {300, "a", 2, 3}};
  auto simulated = check_drivers_agree(s);
  REQUIRE(simulated.outcomes.size() == 3);
  for (auto& o : simulated.outcomes) CHECK(o.status == 200);
}

TEST_CASE("the actors and the simulator agree on gpu-lets: lanes at their share, side by side",
          "[drivers][gpulets]") {
  // One device split 60/40: a and c on the 60% lane (the fewest-models rule), b alone on
  // the 40% one. a and b compute side by side, each at its share's speed; c waits for a.
  scenario s;
  s.capacity_bytes = {100 * mb};
  s.models = {{"a", 1, {0}, 10 * mb, 10}, {"b", 1, {0}, 10 * mb, 10}, {"c", 1, {0}, 10 * mb, 10}};
  s.batching.max_batch_size = 4;
  s.batching.batch_window = 5ms;
  s.gpulets.partitions = {{60, 40}};
  s.gpulets.plan.interference = 1.0;
  s.arrivals = {{0, "a", 3}, {2, "b", 3}, {4, "c", 2}, {150, "b", 1}};
  auto simulated = check_drivers_agree(s);
  REQUIRE(simulated.outcomes.size() == 4);
  for (auto& o : simulated.outcomes) CHECK(o.status == 200);
  // a: window 5 ms + tick 0.1, its 10 ms load, then 3 steps of 10 ms at 60% (16.7 ms
  // each).
  CHECK(simulated.outcomes[0].done_s == Approx(0.0151 + 0.05).margin(5e-4));
  // b: its load follows a's on the link (one transfer per link), then 3 steps of 25 ms at
  // 40%, on its own lane while a's batch runs (time sharing would add a's 50 ms).
  CHECK(simulated.outcomes[1].done_s == Approx(0.0251 + 0.075).margin(5e-4));
  // c shares a's lane in time: it starts when a's batch ended.
  CHECK(simulated.outcomes[2].done_s > simulated.outcomes[0].done_s + 0.03);
}

TEST_CASE("the actors and the simulator agree on LoRA adapters: leased per batch, evicted first",
          "[drivers][adapters]") {
  // A base and three adapters on one device with room for the base and two of them: two
  // adapters' rows share the base's first batch (each adapter loads after the base), a
  // third adapter's row joins it at a step boundary (its load evicts an idle adapter,
  // never the base under its running batch), the base's own rows run beside them.
  for (bool overlap : {false, true}) {
    INFO("compute while loading " << overlap);
    scenario s;
    s.capacity_bytes = {100 * mb};
    s.models = {{"b", 1, {0}, 60 * mb, 10},
                {"a1", 1, {0}, 15 * mb, 0, "b"},
                {"a2", 1, {0}, 15 * mb, 0, "b"},
                {"a3", 1, {0}, 15 * mb, 0, "b"}};
    s.batching.batch_window = 5ms;
    s.batching.max_batch_size = 8;
    s.compute_while_loading = overlap;
    s.arrivals = {{0, "a1", 6}, {1, "a2", 2}, {2, "b", 2}, {120, "a3", 2}, {121, "b", 1}};
    auto simulated = check_drivers_agree(s);
    REQUIRE(simulated.outcomes.size() == 5);
    for (auto& o : simulated.outcomes) CHECK(o.status == 200);
    auto starts = names_of(decisions_of(simulated.starts));
    INFO(render_groups(decisions_of(simulated.starts)));
    // The base first, then its adapters; a3's load had to evict an adapter (a2, the one
    // whose rows were done), not the base.
    REQUIRE(starts.size() >= 4);
    CHECK(starts[0] == "load b@0");
    CHECK(std::count(starts.begin(), starts.end(), "evict b@0") == 0);
    CHECK(std::find(starts.begin(), starts.end(), "load a3@0") != starts.end());
    CHECK(std::count_if(starts.begin(), starts.end(),
                        [](auto& x) { return x.rfind("evict a", 0) == 0; }) >= 1);
  }
}
