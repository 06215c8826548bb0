#include <catch2/catch.hpp>

#include "actors/policies.hpp"
#include "common/error.hpp"

using namespace computron;
using namespace computron::actors;

TEST_CASE("LRU orders victims by idle time longest first", "[actors][policy]") {
  auto p = make_lru_policy();
  std::vector<victim_candidate> c{{"a", 1, 5.0, 1, 0}, {"b", 1, 50.0, 1, 0}, {"c", 1, 0.5, 1, 0}};
  CHECK(p->order(c) == std::vector<size_t>{1, 0, 2});
}

TEST_CASE("cost-aware evicts the cheapest expected reload first and uses LRU on ties",
          "[actors][policy]") {
  auto p = make_cost_aware_policy();
  std::vector<victim_candidate> c{
      {"hot-small", 1, 100.0, 0.1, 10.0},  // cost 1.0
      {"cold-big", 1, 1.0, 2.0, 0.0},      // cost 0
      {"warm", 1, 5.0, 1.0, 0.5},          // cost 0.5
      {"cold-old", 1, 9.0, 1.0, 0.0},      // cost 0, idle longer than cold-big
  };
  CHECK(p->order(c) == std::vector<size_t>{3, 1, 2, 0});
}

TEST_CASE("fcfs serves the oldest head and resident-first bounds the wait", "[actors][policy]") {
  std::vector<queue_view> q{{"a", 0.2, 1, false}, {"b", 0.05, 3, true}, {"c", 2.0, 1, false}};
  CHECK(make_fcfs_policy()->order(q) == std::vector<size_t>{2, 0, 1});
  // c is overdue (>= 1 s) and goes first; then the resident b before the older a.
  CHECK(make_resident_first_policy(1.0)->order(q) == std::vector<size_t>{2, 1, 0});
  CHECK_FALSE(make_dispatch_policy("random", 1.0));
  CHECK_FALSE(make_eviction_policy("mru"));
  CHECK(make_eviction_policy("cost"));
}

TEST_CASE("the demand meter decays with its time constant", "[actors][policy]") {
  demand_meter m{10.0};
  m.note(100, 1000.0);
  CHECK(m.rate(1000.0) == Approx(10.0));
  CHECK(m.rate(1010.0) == Approx(10.0 * std::exp(-1.0)));
  m.note(0, 1010.0);
  CHECK(m.rate(1010.0) == Approx(10.0 * std::exp(-1.0)));
}
