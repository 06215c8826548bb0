// The typed step plan (sched/step_plan): a mode derived from its rows' counts, whether a
// captured graph can run it, and the plans the dispatch core builds for a batch's first
// step, a chunked join's steps and the batch's next decode step.
#include <catch2/catch.hpp>

#include <algorithm>

#include "sched/dispatch.hpp"
#include "sched/step_plan.hpp"

using namespace computron;
using namespace computron::sched;
using namespace std::chrono_literals;

namespace {

step_plan plan_of(std::vector<planned_row> rows) {
  step_plan p;
  p.rows = std::move(rows);
  return p;
}

const step_plan* plan_for(const dispatch_effects& e, batch_id id) {
  for (auto& p : e.plans)
    if (p.batch == id) return &p;
  return nullptr;
}

}  // namespace

TEST_CASE("a step's mode comes from its rows' counts, and only a decode step fits a graph",
          "[step_plan]") {
  // key, prompt tokens, computed, scheduled
  auto whole = plan_of({{1, 10, 0, 10}, {2, 3, 0, 3}});
  CHECK(whole.mode() == step_mode::prefill);
  CHECK(whole.tokens() == 13);
  auto part = plan_of({{1, 10, 0, 2}, {2, 3, 0, 0}});
  CHECK(part.mode() == step_mode::chunk);
  auto later = plan_of({{1, 10, 6, 4}, {2, 3, 0, 3}});
  CHECK(later.mode() == step_mode::chunk);
  auto decode = plan_of({{1, 10, 10, 1}, {2, 3, 7, 1}});
  CHECK(decode.mode() == step_mode::decode);
  CHECK(decode.tokens() == 2);
  auto mixed = plan_of({{1, 10, 10, 1}, {2, 3, 0, 3}});
  CHECK(mixed.mode() == step_mode::mixed);
  CHECK(std::string(to_string(step_mode::mixed)) == "mixed");
  // A graph per batch bucket: a decode step of at most the largest bucket's rows.
  CHECK(decode.graph_eligible(2));
  CHECK_FALSE(decode.graph_eligible(1));
  CHECK_FALSE(whole.graph_eligible(8));
  CHECK_FALSE(mixed.graph_eligible(8));
  CHECK_FALSE(step_plan{}.graph_eligible(8));
}

TEST_CASE(
    "the dispatch core plans a batch's steps: its prompts, a chunked join's windows, "
    "the next decode step and the rows that left",
    "[step_plan][cores][kv]") {
  batching_options o;
  o.batch_window = 0ms;
  o.max_batch_size = 4;
  o.default_deadline = 10s;
  o.prefill_chunk = 8;
  refusal why;
  auto d = dispatcher::make(o, 1, &why);
  REQUIRE(d);
  auto k = d->add_model("k", 1, 1, {0}, 0, true);
  time_point t{};
  // A 15-token prompt, 40 steps: its first step is the prefill of its prompt.
  auto id = d->admit(k, 1, t, 0, 40, false, 15).formed.at(0).id;
  REQUIRE(d->leased(id, {t, false, 0, 0, std::nullopt}, t).kv_asks.size() == 1);
  auto e = d->kv_granted(id, k, 10, 100, t);
  REQUIRE(e.started.size() == 1);
  auto& first = e.started[0].plan;
  CHECK(first.batch == id);
  CHECK(first.into == 0);
  REQUIRE(first.rows.size() == 1);
  CHECK(first.rows[0].key == 1);
  CHECK(first.rows[0].computed == 0);
  CHECK(first.rows[0].scheduled == 15);
  CHECK(first.mode() == step_mode::prefill);
  CHECK(first.kv_blocks == 10);
  // A 20-token prompt joins in chunks of 8 (4, 8, 8): each chunk's plan is its window.
  CHECK(d->admit(k, 2, t, 0, 3, false, 20).formed.empty());
  e = d->step_boundary(id, {1}, t);
  REQUIRE(e.joins.size() == 1);
  auto chunk = e.joins[0].step;
  CHECK(chunk.batch == e.joins[0].id);
  CHECK(chunk.into == 0);  // a chunk that leaves more joins nothing yet
  CHECK(chunk.chunk == 4);
  CHECK(chunk.left == 16);
  REQUIRE(chunk.rows.size() == 1);
  CHECK(chunk.rows[0].computed == 0);
  CHECK(chunk.rows[0].scheduled == 4);
  CHECK(chunk.mode() == step_mode::chunk);
  CHECK(chunk.kv_blocks == d->kv_held(id));
  // The running row's next step: a decode step of its one token after its 15.
  auto* next = plan_for(e, id);
  REQUIRE(next);
  REQUIRE(next->rows.size() == 1);
  CHECK(next->rows[0].computed == 15);
  CHECK(next->rows[0].scheduled == 1);
  CHECK(next->mode() == step_mode::decode);
  CHECK(next->graph_eligible(4));
  CHECK(next->finished.empty());
  e = d->step_boundary(id, {1}, t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].step.rows.at(0).computed == 4);
  CHECK(e.joins[0].step.rows.at(0).scheduled == 8);
  CHECK(e.joins[0].step.into == 0);
  // The last chunk joins the batch.
  e = d->step_boundary(id, {1}, t);
  REQUIRE(e.joins.size() == 1);
  auto last = e.joins[0].step;
  CHECK(last.into == id);
  CHECK(last.rows.at(0).computed == 12);
  CHECK(last.rows.at(0).scheduled == 8);
  CHECK(last.mode() == step_mode::chunk);
  // Row 1 finishes: the next plan lists it as finished, and the joiner decodes after its
  // prompt and the token its prefill and the shared step computed.
  e = d->step_boundary(id, {2}, t);
  next = plan_for(e, id);
  REQUIRE(next);
  CHECK(next->finished == std::vector<uint64_t>{1});
  REQUIRE(next->rows.size() == 1);
  CHECK(next->rows[0].key == 2);
  CHECK(next->rows[0].computed == 21);
  CHECK(next->rows[0].scheduled == 1);
}
