// The row bookkeeping both drivers of the dispatch core share (sched/step_rows): the
// preemption rewrite, the rows that leave at a step boundary, and what the batch does
// next, an impossible boundary included.
#include <catch2/catch.hpp>

#include "sched/step_rows.hpp"

using namespace computron;
using namespace computron::sched;

TEST_CASE("a preempted row is recomputed with what it generated as part of its prompt",
          "[step_rows]") {
  auto b = recompute_budget({20, 60, 5}, 7);
  CHECK(b.prompt_tokens == 27);
  CHECK(b.max_tokens == 53);
  CHECK(b.min_tokens == 0);
  // min_tokens counts generated tokens too.
  CHECK(recompute_budget({20, 60, 9}, 7).min_tokens == 2);
  // An empty prompt counts as one token (the KV rules' count); one token is always left.
  CHECK(recompute_budget({0, 3, 0}, 2).prompt_tokens == 3);
  CHECK(recompute_budget({4, 3, 0}, 3).max_tokens == 1);
  // The queued row's prompt_tokens and steps follow the same rule, its times stay.
  queued_entry row;
  row.key = 9;
  row.prompt_tokens = 20;
  row.steps = 60;
  row.seq = 4;
  auto r = recompute_row(row, 7);
  CHECK(r.key == 9);
  CHECK(r.seq == 4);
  CHECK(r.prompt_tokens == 27);
  CHECK(r.steps == 53);
}

TEST_CASE("the rows of a batch that leave at a step boundary: its preempted and failed ones",
          "[step_rows]") {
  dispatch_effects e;
  queued_entry a, b, c, other;
  a.key = 1;
  b.key = 2;
  c.key = 3;
  other.key = 4;
  e.preempted.push_back({7, 0, {a}});
  e.preempted.push_back({8, 0, {other}});
  e.failures.push_back({0, b, row_end::no_kv_room, 7});
  e.failures.push_back({0, c, row_end::expired, 0});  // a queued request's, not the batch's
  auto l = leavers_at(e, 7);
  CHECK(l.leaves(1));
  CHECK(l.leaves(2));
  CHECK_FALSE(l.leaves(3));
  CHECK_FALSE(l.leaves(4));
  CHECK(l.preempted.size() == 1);
  REQUIRE(l.failed.count(2) == 1);
  CHECK(l.failed.at(2).why == row_end::no_kv_room);
  CHECK(leavers_at(e, 9).empty());
}

TEST_CASE("after a step boundary a batch steps, waits for KV, ends, or is stuck", "[step_rows]") {
  dispatch_effects e;
  // Stepped: it steps, whatever else it was told.
  e.steps = {7};
  CHECK(next_at_boundary(e, 7, true) == boundary_next::step);
  // A KV ask for it: it waits for the answer.
  e.steps.clear();
  e.kv_asks.push_back({7, 0, 4, 2, false});
  CHECK(next_at_boundary(e, 7, true) == boundary_next::wait);
  CHECK(next_at_boundary(e, 7, false) == boundary_next::wait);
  // No row left and none joining: it ends, stepped or not.
  e.kv_asks.clear();
  CHECK(next_at_boundary(e, 7, false) == boundary_next::end);
  e.steps = {7};
  CHECK(next_at_boundary(e, 7, false) == boundary_next::end);
  // Rows left (or a join), yet neither stepped nor asked for: stuck, one error for both
  // drivers (another batch's step or ask is not its own).
  e.steps = {8};
  e.kv_asks.push_back({8, 0, 4, 2, false});
  CHECK(next_at_boundary(e, 7, true) == boundary_next::stuck);
  e.joins.push_back({7, 9, 0, {}, 0, 0});
  CHECK(next_at_boundary(e, 7, false) == boundary_next::stuck);
  auto why = boundary_stuck();
  CHECK(why.code == ec::invalid_state);
  CHECK(why.reason == "a step boundary neither stepped nor waited");
  CHECK(std::string(to_string(boundary_next::stuck)) == "stuck");
}
