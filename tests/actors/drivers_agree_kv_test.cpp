// The two drivers agree with KV blocks in the ledger (issue 30): the same KV asks, joins,
// preemptions and recomputes give the same transfers and the same answer times, in the
// actors (manager and scheduler, asks as messages) and in the simulator (asks answered at
// once). See drivers_agree_test.cpp for how the two are compared.
#include <catch2/catch.hpp>

#include "tests/actors/drivers_agree.hpp"

using namespace computron;
using namespace computron::testing::drivers;
using namespace std::chrono_literals;

TEST_CASE(
    "the actors and the simulator agree with KV in the ledger: growth, evictions for "
    "room, preemption and recompute",
    "[drivers][kv]") {
  // One device of 100 MB; a and b of 30 MB each; KV blocks of 5 MB (16 tokens), so 8
  // blocks fit beside both models and 14 once b is evicted. a's requests (prompt 20, 60
  // tokens: 5 blocks each at their end) run four at a time with continuous batching, b
  // loads first and is lease-free when a's batch needs room; a's later burst must preempt.
  scenario s;
  s.capacity_bytes = {100 * mb};
  s.models = {{"b", 1, {0}, 30 * mb, 5}, {"a", 1, {0}, 30 * mb, 10}};
  s.batching.batch_window = 0ms;
  s.batching.max_batch_size = 4;
  s.kv_block_bytes = 5 * mb;
  s.compute_while_loading = true;
  s.arrivals = {{0, "b", 1, 3}, {100, "a", 60, 20}};
  for (int i = 0; i < 5; ++i) s.arrivals.push_back({150.0 + 20 * i, "a", 60, 20});
  s.arrivals.push_back({600, "b", 1, 3});
  auto simulated = check_drivers_agree(s);
  // What the schedule must exercise: b evicted for a's KV, every request answered.
  auto starts = decisions_of(simulated.starts);
  auto names = names_of(starts);
  CHECK(std::find(names.begin(), names.end(), "evict b@0") != names.end());
  for (auto& o : simulated.outcomes) CHECK(o.status == 200);
  CHECK(simulated.preemptions > 0);
}
