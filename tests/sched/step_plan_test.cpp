// The typed step plan (sched/step_plan): a mode derived from its rows' counts, whether a
// captured graph can run it, and the plans the dispatch core builds for a batch's first
// step, a chunked join's steps and the batch's next decode step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>

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

/// A dispatch core over one device: batches of up to 4 rows formed at once, prompts
/// joining in chunks of `chunk` tokens (0: whole).
std::unique_ptr<dispatcher> one_device_core(int32_t chunk) {
  batching_options o;
  o.batch_window = 0ms;
  o.max_batch_size = 4;
  o.default_deadline = 10s;
  o.prefill_chunk = chunk;
  refusal why;
  auto d = dispatcher::make(o, 1, &why);
  REQUIRE(d);
  return d;
}

/// Model k's batch of one 15-token prompt for 40 steps (key 1), leased and granted 10
/// blocks: its id, and the effects of its start.
std::pair<batch_id, dispatch_effects> start_one(dispatcher& d, uint32_t k, time_point t) {
  auto id = d.admit(k, 1, t, 0, 40, false, 15).formed.at(0).id;
  REQUIRE(d.leased(id, {t, false, 0, 0, std::nullopt}, t).kv_asks.size() == 1);
  return {id, d.kv_granted(id, k, 10, 100, t)};
}

/// The requeued batch's rows ask again: `id`'s rows by key once it ends, and the keys
/// requeue_rows gave (sorted).
std::pair<std::vector<uint64_t>, std::map<uint64_t, queued_entry>> requeue_and_end(dispatcher& d,
                                                                                   batch_id id,
                                                                                   time_point t) {
  auto keys = d.requeue_rows(id);
  std::sort(keys.begin(), keys.end());
  CHECK(d.requeue_rows(id).empty());  // each row once
  auto done = d.batch_done(id, t, false, 0, 0);
  std::map<uint64_t, queued_entry> rows;
  REQUIRE(done.formed.size() == 1);
  for (auto& r : done.formed[0].rows) rows[r.key] = r;
  return {keys, rows};
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
}

TEST_CASE(
    "the dispatch core plans a batch's steps: its prompts, a chunked join's windows, "
    "the next decode step and the rows that left",
    "[step_plan][cores][kv]") {
  auto d = one_device_core(8);
  auto k = d->add_model("k", 1, 1, {0}, 0, true);
  time_point t{};
  // A 15-token prompt, 40 steps: its first step is the prefill of its prompt.
  auto [id, e] = start_one(*d, k, t);
  REQUIRE(e.started.size() == 1);
  auto& first = e.started[0].plan;
  CHECK(first.batch == id);
  CHECK(first.into == 0);
  REQUIRE(first.rows.size() == 1);
  CHECK(first.rows[0].key == 1);
  CHECK(first.rows[0].computed == 0);
  CHECK(first.rows[0].scheduled == 15);
  CHECK(first.mode() == step_mode::prefill);
  // Its pools may take the 10 blocks granted less the prompt's one beyond the step's need.
  CHECK(first.kv_spare == 9);
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
  // The batch's spare: what it holds less its running row's block and the joiner's two
  // (20 prompt tokens and the next step's one).
  CHECK(chunk.kv_spare == static_cast<int64_t>(d->kv_held(id)) - 3);
  // The running row's next step: a decode step of its one token after its 15.
  auto* next = plan_for(e, id);
  REQUIRE(next);
  REQUIRE(next->rows.size() == 1);
  CHECK(next->rows[0].computed == 15);
  CHECK(next->rows[0].scheduled == 1);
  CHECK(next->mode() == step_mode::decode);
  CHECK(next->finished.empty());
  CHECK(next->kv_spare == chunk.kv_spare);  // the join's steps and the next share it
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

TEST_CASE(
    "the dispatch core names each row's KV blocks, and names a block again only after the "
    "step that drops it has run",
    "[step_plan][cores][kv]") {
  auto d = one_device_core(0);
  auto k = d->add_model("k", 1, 1, {0}, 0, true);
  time_point t{};
  auto blocks_of = [](const step_plan& p, uint64_t key) {
    for (auto& r : p.rows)
      if (r.key == key) return r.blocks;
    FAIL("no row " << key);
    return std::vector<uint32_t>{};
  };
  // Row 1: a 15-token prompt fills one block.
  auto id = d->admit(k, 1, t, 0, 40, false, 15).formed.at(0).id;
  REQUIRE(d->leased(id, {t, false, 0, 0, std::nullopt}, t).kv_asks.size() == 1);
  auto e = d->kv_granted(id, k, 10, 100, t);
  REQUIRE(e.started.size() == 1);
  CHECK(blocks_of(e.started[0].plan, 1) == std::vector<uint32_t>{0});
  // Row 2 (33 tokens) joins: three blocks, the third for its first decode step in the
  // batch (34 positions), whose plan the driver extends without naming blocks. Row 1's
  // 16th position still fits its block.
  CHECK(d->admit(k, 2, t, 0, 40, false, 33).formed.empty());
  e = d->step_boundary(id, {1}, t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].step.into == id);
  CHECK(blocks_of(e.joins[0].step, 2) == std::vector<uint32_t>{1, 2, 3});
  auto* next = plan_for(e, id);
  REQUIRE(next);
  CHECK(blocks_of(*next, 1).empty());
  // Row 1's 17th position takes a new block; row 2's 35th fits its three.
  e = d->step_boundary(id, {1, 2}, t);
  next = plan_for(e, id);
  REQUIRE(next);
  CHECK(blocks_of(*next, 1) == std::vector<uint32_t>{4});
  CHECK(blocks_of(*next, 2).empty());
  CHECK(d->kv_table(id, 1) == std::vector<uint32_t>{0, 4});
  CHECK(d->kv_table(id, 2) == std::vector<uint32_t>{1, 2, 3});
  CHECK(d->kv_ids_held(k) == 5);
  // Row 2 leaves. Row 3 joins at this boundary, whose join step runs before the step that
  // drops row 2's caches: it gets new ids, not row 2's.
  CHECK(d->admit(k, 3, t, 0, 40, false, 40).formed.empty());
  e = d->step_boundary(id, {1}, t);
  REQUIRE(e.joins.size() == 1);
  auto three = blocks_of(e.joins[0].step, 3);
  CHECK(three == std::vector<uint32_t>{5, 6, 7});
  CHECK(d->kv_table(id, 2).empty());
  CHECK(d->kv_ids_held(k) == 8);  // row 2's three wait for the next boundary
  // At the next boundary they are free: row 4 (20 tokens, two blocks) takes the lowest.
  CHECK(d->admit(k, 4, t, 0, 40, false, 20).formed.empty());
  e = d->step_boundary(id, {1, 3}, t);
  REQUIRE(e.joins.size() == 1);
  CHECK(blocks_of(e.joins[0].step, 4) == std::vector<uint32_t>{1, 2});
  CHECK(d->kv_ids_held(k) == 7);
  // The batch ends: every id is free.
  d->batch_done(id, t, true, 0.1, 4);
  CHECK(d->kv_ids_held(k) == 0);
}

TEST_CASE("a row that leaves at its batch's first boundary gives its KV blocks back",
          "[step_plan][cores][kv]") {
  auto d = one_device_core(0);
  auto k = d->add_model("k", 1, 1, {0}, 0, true);
  time_point t{};
  auto id = d->admit(k, 1, t, 0, 1, false, 15).formed.at(0).id;
  REQUIRE(d->leased(id, {t, false, 0, 0, std::nullopt}, t).kv_asks.size() == 1);
  REQUIRE(d->kv_granted(id, k, 10, 100, t).started.size() == 1);
  // Row 1 finished at its prefill; row 2 joins at that boundary, before the step that
  // would drop row 1's caches: it does not get row 1's block, which the plan lists.
  CHECK(d->admit(k, 2, t, 0, 4, false, 20).formed.empty());
  auto e = d->step_boundary(id, {}, t);
  REQUIRE(e.joins.size() == 1);
  REQUIRE(e.joins[0].step.rows.size() == 1);
  CHECK(e.joins[0].step.rows[0].blocks == std::vector<uint32_t>{1, 2});
  CHECK(d->kv_ids_held(k) == 3);
  auto* next = plan_for(e, id);
  REQUIRE(next);
  CHECK(next->finished == std::vector<uint64_t>{1});
  // At the next boundary row 1's block is free.
  d->step_boundary(id, {2}, t);
  CHECK(d->kv_ids_held(k) == 2);
}

TEST_CASE("KV block ids are named lowest first and given back", "[step_plan][kv]") {
  kv_block_ids ids;
  CHECK(ids.take(3) == std::vector<uint32_t>{0, 1, 2});
  ids.give_back({1});
  CHECK(ids.held() == 2);
  CHECK(ids.take(2) == std::vector<uint32_t>{1, 3});
  // Giving back the top lowers the bound; an id not held costs nothing.
  ids.give_back({3, 2, 2, 9});
  CHECK(ids.bound() == 2);
  CHECK(ids.held() == 2);
  ids.give_back({0, 1});
  CHECK(ids.held() == 0);
  CHECK(ids.bound() == 0);
}

TEST_CASE(
    "a batch whose step found its device full gives its rows back to the queue, to be "
    "recomputed",
    "[step_plan][cores][kv]") {
  // Issue 44: the step fails for room the ledger counted (a pool's pages not gone yet);
  // its rows wait and run again, as preempted rows do, rather than fail.
  auto d = one_device_core(8);
  auto k = d->add_model("k", 1, 1, {0}, 0, true);
  time_point t{};
  auto [id, started] = start_one(*d, k, t);
  REQUIRE(started.started.size() == 1);
  // Row 1 ran its prefill (its first token); row 2 joins in chunks.
  CHECK(d->admit(k, 2, t, 0, 3, false, 20).formed.empty());
  REQUIRE(d->step_boundary(id, {1}, t).joins.size() == 1);
  CHECK(d->requeue_rows(id + 100).empty());
  // Both form the next batch: row 1 with its generated token in its prompt and one step
  // fewer, row 2 as it came.
  auto [keys, rows] = requeue_and_end(*d, id, t);
  CHECK(keys == std::vector<uint64_t>{1, 2});
  REQUIRE(rows.size() == 2);
  CHECK(rows[1].prompt_tokens == 16);
  CHECK(rows[1].steps == 39);
  CHECK(rows[2].prompt_tokens == 20);
  CHECK(rows[2].steps == 3);
  CHECK(d->kv_held(id) == 0);
}

TEST_CASE("rows that joined at the last boundary go back to the queue as they came",
          "[step_plan][cores][kv]") {
  auto d = one_device_core(0);  // whole joins
  auto k = d->add_model("k", 1, 1, {0}, 0, true);
  time_point t{};
  auto [id, started] = start_one(*d, k, t);
  REQUIRE(started.started.size() == 1);
  CHECK(d->admit(k, 2, t, 0, 3, false, 5).formed.empty());
  auto e = d->step_boundary(id, {1}, t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].chunk == 0);
  auto [keys, rows] = requeue_and_end(*d, id, t);
  CHECK(keys == std::vector<uint64_t>{1, 2});
  REQUIRE(rows.size() == 2);
  CHECK(rows[1].prompt_tokens == 16);
  CHECK(rows[2].prompt_tokens == 5);
  CHECK(rows[2].steps == 3);
}
