#include <catch2/catch.hpp>

#include <cmath>

#include "sched/policies.hpp"

using namespace computron;
using namespace computron::sched;

TEST_CASE("LRU orders victims by idle time longest first", "[sched][policy]") {
  auto p = make_lru_policy();
  std::vector<victim_candidate> c{{"a", 1, 5.0, 1, 0}, {"b", 1, 50.0, 1, 0}, {"c", 1, 0.5, 1, 0}};
  CHECK(p->order(c) == std::vector<size_t>{1, 0, 2});
}

TEST_CASE("cost-aware evicts the cheapest expected reload first and uses LRU on ties",
          "[sched][policy]") {
  auto p = make_cost_aware_policy();
  std::vector<victim_candidate> c{
      {"hot-small", 1, 100.0, 0.1, 10.0},  // cost 1.0
      {"cold-big", 1, 1.0, 2.0, 0.0},      // cost 0
      {"warm", 1, 5.0, 1.0, 0.5},          // cost 0.5
      {"cold-old", 1, 9.0, 1.0, 0.0},      // cost 0, idle longer than cold-big
  };
  CHECK(p->order(c) == std::vector<size_t>{3, 1, 2, 0});
}

TEST_CASE("fcfs serves the oldest head and resident-first bounds the wait", "[sched][policy]") {
  std::vector<queue_view> q{{"a", 0.2, 1, false}, {"b", 0.05, 3, true}, {"c", 2.0, 1, false}};
  CHECK(make_fcfs_policy()->order(q) == std::vector<size_t>{2, 0, 1});
  // A higher priority class goes first whatever its age.
  q[1].priority = 1;
  CHECK(make_fcfs_policy()->order(q) == std::vector<size_t>{1, 2, 0});
  q[1].priority = 0;
  // c is overdue (>= 1 s) and goes first; then the resident b before the older a.
  CHECK(make_resident_first_policy(1.0)->order(q) == std::vector<size_t>{2, 1, 0});
  refusal why;
  CHECK_FALSE(make_dispatch_policy("random", 1.0, &why));
  CHECK(why.code == ec::invalid_configuration);
  CHECK(why.reason.find("fcfs, resident-first or edf") != std::string::npos);
  CHECK_FALSE(make_eviction_policy("mru", &why));
  CHECK(make_eviction_policy("cost", nullptr));
}

TEST_CASE("earliest deadline first serves the least slack, priority classes first",
          "[sched][policy]") {
  std::vector<queue_view> q{
      {"a", 0.5, 1, false, 2.0}, {"b", 0.1, 1, true, 0.3}, {"c", 0.9, 1, false, 9.0}};
  CHECK(make_edf_policy()->order(q) == std::vector<size_t>{1, 0, 2});
  q[2].priority = 2;
  CHECK(make_edf_policy()->order(q) == std::vector<size_t>{2, 1, 0});
}

TEST_CASE("eviction policies take a lower priority class first", "[sched][policy]") {
  std::vector<victim_candidate> c{{"idle-important", 1, 500.0, 1, 0, 1}, {"busy", 1, 0.1, 1, 5, 0}};
  CHECK(make_lru_policy()->order(c) == std::vector<size_t>{1, 0});
  CHECK(make_cost_aware_policy()->order(c) == std::vector<size_t>{1, 0});
}

TEST_CASE("the demand meter decays with its time constant", "[sched][policy]") {
  demand_meter m{10.0};
  time_point t0{};
  m.note(100, t0 + from_seconds(1000.0));
  CHECK(m.rate(t0 + from_seconds(1000.0)) == Approx(10.0));
  CHECK(m.rate(t0 + from_seconds(1010.0)) == Approx(10.0 * std::exp(-1.0)));
  m.note(0, t0 + from_seconds(1010.0));
  CHECK(m.rate(t0 + from_seconds(1010.0)) == Approx(10.0 * std::exp(-1.0)));
}
