// The runner (engine/runner.hpp) over a recording backend: which rows of a batch go on (from
// the plan's row keys, not from positions the manager counted), joins, the batch's end, the
// samplers it keeps, and the steps it refuses. Torch-free.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "engine/generate.hpp"
#include "engine/runner.hpp"

using namespace computron;
using namespace computron::engine;

namespace {

/// Logits that peak at each row's own value, so that a greedy sampler answers it; every
/// call is recorded.
struct recording_backend : backend {
  struct call {
    uint64_t batch = 0;
    bool prefill = false;
    std::vector<int32_t> keep;
    std::vector<std::vector<uint32_t>> tables;
    /// The draws it was given: -1 none (a rank that does not sample), else how many.
    int draws = -1;
  };
  std::vector<call> calls;
  std::vector<uint64_t> ended;
  std::vector<std::pair<uint64_t, uint64_t>> joined;
  /// The row values the next run answers (default: 10 + the row's position).
  std::vector<int64_t> answer;
  bool fail = false;

  caf::expected<models::host_tensor> run(const step_input& in, const std::vector<int32_t>& keep,
                                         const std::vector<std::vector<uint32_t>>& tables,
                                         const models::host_tensor*,
                                         const std::vector<models::device_draw>* draws) override {
    calls.push_back(
        {in.plan.batch, in.prefills(), keep, tables, draws ? static_cast<int>(draws->size()) : -1});
    if (fail) return make_error(ec::device_error, "injected");
    if (in.partial_prefill()) return models::host_tensor{};
    const int64_t vocab = 64;
    models::host_tensor t;
    t.shape = {static_cast<int64_t>(in.rows()), vocab};
    std::vector<float> v(in.rows() * vocab, 0.0f);
    for (size_t r = 0; r < in.rows(); ++r) {
      auto peak = r < answer.size() ? answer[r] : static_cast<int64_t>(10 + r);
      v[r * vocab + static_cast<size_t>(peak)] = 5.0f;
    }
    t.bytes.resize(v.size() * sizeof(float));
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
  }
  void end_batch(uint64_t batch) override { ended.push_back(batch); }
  caf::error join_batch(uint64_t from, uint64_t into) override {
    joined.emplace_back(from, into);
    return {};
  }
};

/// A decode step of `batch` over rows `keys` (their prompts of one token, `done` computed).
step_input decode(uint64_t batch, std::vector<uint64_t> keys, int64_t done = 2) {
  step_input in;
  in.step = 1;
  in.plan.batch = batch;
  for (auto k : keys) {
    in.plan.rows.push_back({k, 1, done, 1});
    in.tokens.push_back(static_cast<int64_t>(k));
  }
  return in;
}

/// KV block ids no other row of the test holds (the dispatch core's are per model; a
/// runner refuses a block a row of it still holds).
std::vector<uint32_t> fresh(size_t n) {
  static uint32_t next = 1000;
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(next++);
  return ids;
}

/// A step that takes 100 ms, and whether an end or an unbind came while one ran.
struct slow_backend final : recording_backend {
  std::atomic<bool> running{false}, entered{false};
  std::atomic<int> overlaps{0};

  caf::expected<models::host_tensor> run(const step_input& in, const std::vector<int32_t>& keep,
                                         const std::vector<std::vector<uint32_t>>& tables,
                                         const models::host_tensor* hidden,
                                         const std::vector<models::device_draw>* draws) override {
    running = true;
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto out = recording_backend::run(in, keep, tables, hidden, draws);
    running = false;
    return out;
  }
  void end_batch(uint64_t batch) override {
    if (running) ++overlaps;
    recording_backend::end_batch(batch);
  }
  void unbind_adapter(const std::string&) override {
    if (running) ++overlaps;
  }
};

step_input prefill(uint64_t batch, std::vector<uint64_t> keys) {
  std::vector<std::vector<int64_t>> prompts(keys.size(), std::vector<int64_t>{1});
  auto in = prefill_step(batch, prompts, std::vector<row_sampling>(keys.size()));
  for (size_t r = 0; r < keys.size(); ++r) {
    in.plan.rows[r].key = keys[r];
    in.plan.rows[r].blocks = fresh(1);
  }
  return in;
}

}  // namespace

TEST_CASE("which rows go on is read from the plan's keys", "[engine][runner]") {
  sched::step_plan plan;
  plan.batch = 4;
  plan.rows = {{7, 1, 1, 1}, {9, 1, 1, 1}};
  auto keep = kept_rows({5, 7, 8, 9}, plan);
  REQUIRE(keep);
  CHECK(*keep == std::vector<int32_t>{1, 3});
  // Every row on, in order: nothing to say.
  auto all = kept_rows({7, 9}, plan);
  REQUIRE(all);
  CHECK(all->empty());
  // Reordered rows are named.
  auto swapped = kept_rows({9, 7}, plan);
  REQUIRE(swapped);
  CHECK(*swapped == std::vector<int32_t>{1, 0});
  // A row the batch does not hold, or one named twice, is refused.
  auto unknown = kept_rows({5, 7}, plan);
  REQUIRE_FALSE(unknown);
  CHECK(is(unknown.error(), ec::invalid_request));
  CHECK_THAT(render(unknown.error()), Catch::Contains("holds no row 9"));
  plan.rows = {{7, 1, 1, 1}, {7, 1, 1, 1}};
  auto twice = kept_rows({7, 9}, plan);
  REQUIRE_FALSE(twice);
  CHECK_THAT(render(twice.error()), Catch::Contains("twice"));
}

TEST_CASE("a runner keeps rows and samplers as its batch's plans move them", "[engine][runner]") {
  auto b = std::make_shared<recording_backend>();
  runner r{b, true, true};
  // Prefill of three rows: each samples its own value.
  auto first = r.step(prefill(1, {100, 101, 102}), nullptr);
  REQUIRE(first);
  CHECK(first->tokens == std::vector<int64_t>{10, 11, 12});
  CHECK(b->calls.back().keep.empty());
  // Greedy rows can be drawn on a device: the sampling rank offers one draw per row.
  CHECK(b->calls.back().draws == 3);
  // Row 101 finished: the next step names 100 and 102, and the backend keeps rows 0 and 2.
  b->answer = {20, 22};
  auto second = r.step(decode(1, {100, 102}), nullptr);
  REQUIRE(second);
  CHECK(b->calls.back().keep == std::vector<int32_t>{0, 2});
  CHECK(b->calls.back().draws == 2);  // the rows that went on, their samplers aligned first
  CHECK(second->tokens == std::vector<int64_t>{20, 22});
  // Two rows join from batch 2 (their prefill under its own id): their samplers and keys
  // go after batch 1's, and batch 2 is gone.
  b->answer = {30, 31};
  auto join = prefill(2, {200, 201});
  join.plan.into = 1;
  auto joined = r.step(join, nullptr);
  REQUIRE(joined);
  CHECK(joined->tokens == std::vector<int64_t>{30, 31});
  CHECK(b->joined == std::vector<std::pair<uint64_t, uint64_t>>{{2, 1}});
  // Batch 1 now holds 100, 102, 200, 201; row 102 leaves.
  b->answer = {40, 41, 42};
  auto third = r.step(decode(1, {100, 200, 201}), nullptr);
  REQUIRE(third);
  CHECK(b->calls.back().keep == std::vector<int32_t>{0, 2, 3});
  CHECK(third->tokens == std::vector<int64_t>{40, 41, 42});
  // The last step ends the batch everywhere: the backend's caches too.
  auto last = decode(1, {100, 200, 201});
  last.last = true;
  REQUIRE(r.step(last, nullptr));
  CHECK(b->ended.back() == 1);
  CHECK(r.batches() == 0);
}

TEST_CASE("a row preempted and prefilled again joins under its old key", "[engine][runner]") {
  auto b = std::make_shared<recording_backend>();
  runner r{b, true, true};
  REQUIRE(r.step(prefill(1, {5, 6}), nullptr));
  // Row 6 was preempted at the boundary and comes back in a join before the step that
  // drops it: its old position is no longer its.
  auto again = prefill(2, {6});
  again.plan.into = 1;
  REQUIRE(r.step(again, nullptr));
  b->answer = {60, 61};
  auto next = r.step(decode(1, {5, 6}), nullptr);
  REQUIRE(next);
  CHECK(b->calls.back().keep == std::vector<int32_t>{0, 2});
  // Each row samples with its own sampler: two rows, two tokens, in the plan's order.
  CHECK(next->tokens == std::vector<int64_t>{60, 61});
}

TEST_CASE("a join's chunks run between the running batch's decode steps", "[engine][runner]") {
  auto b = std::make_shared<recording_backend>();
  runner r{b, true, true};
  REQUIRE(r.step(prefill(1, {10, 11}), nullptr));
  // Two prompts of 8 tokens join in chunks of 4 under the join's own id 2: the first chunk
  // answers nothing and leaves batch 1 as it was.
  auto chunk = prefill(2, {20, 21});
  chunk.prompts = {std::vector<int64_t>(8, 1), std::vector<int64_t>(8, 2)};
  for (auto& row : chunk.plan.rows) row = {row.key, 8, 0, 4, fresh(1)};
  chunk.plan.chunk = 4;
  chunk.plan.left = 4;
  CHECK(chunk.plan.mode() == sched::step_mode::chunk);
  auto part = r.step(chunk, nullptr);
  REQUIRE(part);
  CHECK(part->tokens.empty());
  CHECK(b->joined.empty());
  // Batch 1 decodes between the chunks; row 11 finished.
  b->answer = {30};
  auto between = r.step(decode(1, {10}), nullptr);
  REQUIRE(between);
  CHECK(between->tokens == std::vector<int64_t>{30});
  CHECK(b->calls.back().keep == std::vector<int32_t>{0});
  // The last chunk samples the joiners and joins them after row 10.
  for (auto& row : chunk.plan.rows) row = {row.key, 8, 4, 4};
  chunk.plan.left = 0;
  chunk.plan.into = 1;
  b->answer = {40, 41};
  auto last = r.step(chunk, nullptr);
  REQUIRE(last);
  CHECK(last->tokens == std::vector<int64_t>{40, 41});
  // The samplers follow the rows: row 21 leaves, rows 10 and 20 go on.
  b->answer = {50, 51};
  auto next = r.step(decode(1, {10, 20}), nullptr);
  REQUIRE(next);
  CHECK(b->calls.back().keep == std::vector<int32_t>{0, 1});
  CHECK(next->tokens == std::vector<int64_t>{50, 51});
  CHECK(r.batches() == 1);
}

TEST_CASE("a batch with a row that needs its whole logits offers no draws", "[engine][runner]") {
  auto b = std::make_shared<recording_backend>();
  runner r{b, true, true};
  auto in = prefill(1, {1, 2});
  in.sampling[1].logprobs = 2;  // log-probabilities come from the whole row, on the host
  auto first = r.step(in, nullptr);
  REQUIRE(first);
  CHECK(b->calls.back().draws == 0);
  CHECK(first->tokens == std::vector<int64_t>{10, 11});
  REQUIRE(r.step(decode(1, {1, 2}), nullptr));
  CHECK(b->calls.back().draws == 0);
}

TEST_CASE("ranks that do not sample join and keep rows as the sampling rank does",
          "[engine][runner]") {
  auto b = std::make_shared<recording_backend>();
  runner quiet{b, true, false};
  auto first = quiet.step(prefill(1, {5, 6}), nullptr);
  REQUIRE(first);
  CHECK(first->tokens.empty());
  auto join = prefill(2, {7});
  join.plan.into = 1;
  REQUIRE(quiet.step(join, nullptr));
  REQUIRE(quiet.step(decode(1, {5, 7}), nullptr));
  CHECK(b->calls.back().keep == std::vector<int32_t>{0, 2});
  for (auto& c : b->calls) CHECK(c.draws == -1);  // no samplers, no draws
  // A stage before the last answers its hidden states, not tokens.
  runner middle{std::make_shared<recording_backend>(), false, true};
  auto hidden = middle.step(prefill(3, {1, 2}), nullptr);
  REQUIRE(hidden);
  CHECK(hidden->tokens.empty());
  CHECK(hidden->hidden.shape == std::vector<int64_t>{2, 64});
}

TEST_CASE("a runner refuses steps that do not describe its batch, and a failure ends it",
          "[engine][runner]") {
  auto b = std::make_shared<recording_backend>();
  runner r{b, true, true};
  REQUIRE(r.step(prefill(1, {5, 6}), nullptr));
  // A decode step naming a row the batch never had.
  auto stray = r.step(decode(1, {5, 7}), nullptr);
  REQUIRE_FALSE(stray);
  CHECK(is(stray.error(), ec::invalid_request));
  // The batch is gone after a failed step: its next step is refused, never run on stale
  // rows.
  CHECK(r.batches() == 0);
  CHECK(b->ended.back() == 1);
  auto ended = r.step(decode(1, {5, 6}), nullptr);
  REQUIRE_FALSE(ended);
  CHECK_THAT(render(ended.error()), Catch::Contains("has ended here"));
  // A decode step of a batch never prefilled here.
  auto stranger = r.step(decode(50, {1}), nullptr);
  REQUIRE_FALSE(stranger);
  CHECK_THAT(render(stranger.error()), Catch::Contains("holds no rows here to decode"));
  // Rows and inputs that disagree, a step of no rows, and a mixed step.
  auto short_inputs = prefill(2, {1, 2});
  short_inputs.prompts.pop_back();
  auto refused = r.step(short_inputs, nullptr);
  REQUIRE_FALSE(refused);
  CHECK_THAT(render(refused.error()), Catch::Contains("plans 2 rows and brings 1 prompts"));
  step_input empty;
  empty.plan.batch = 3;
  CHECK_FALSE(r.step(empty, nullptr));
  auto mixed = prefill(4, {1});
  mixed.plan.rows.push_back({2, 1, 1, 1});
  mixed.prompts.push_back({1});
  auto m = r.step(mixed, nullptr);
  REQUIRE_FALSE(m);
  CHECK_THAT(render(m.error()), Catch::Contains("mixes"));
  // Joining a batch this shard does not hold.
  auto orphan = prefill(5, {1});
  orphan.plan.into = 99;
  CHECK_FALSE(r.step(orphan, nullptr));
  // A backend's error comes back as it is, and ends the batch.
  b->fail = true;
  auto failed = r.step(prefill(6, {1}), nullptr);
  REQUIRE_FALSE(failed);
  CHECK(is(failed.error(), ec::device_error));
  CHECK(r.batches() == 0);
  // A batch the manager ended (cancelled) makes nothing again: a prefill of it that a
  // stage before this one sent on before the cancel came is refused.
  b->fail = false;
  REQUIRE(r.step(prefill(7, {1}), nullptr));
  r.end_batch(7);
  auto late = r.step(prefill(7, {1}), nullptr);
  REQUIRE_FALSE(late);
  CHECK_THAT(render(late.error()), Catch::Contains("has ended here"));
  CHECK(r.batches() == 0);
}

TEST_CASE("a runner keeps each row's KV block table as the plans name its blocks",
          "[engine][runner][kv]") {
  auto b = std::make_shared<recording_backend>();
  runner r{b, true, true};
  auto first = prefill(1, {5, 6});
  const auto a = first.plan.rows[0].blocks.at(0), c = first.plan.rows[1].blocks.at(0);
  REQUIRE(r.step(first, nullptr));
  CHECK(b->calls.back().tables == std::vector<std::vector<uint32_t>>{{a}, {c}});
  // Their 17th positions cross into second blocks, which the plan names.
  auto step = decode(1, {5, 6}, 15);
  const auto more = fresh(2);
  step.plan.rows[0].blocks = {more[0]};
  step.plan.rows[1].blocks = {more[1]};
  REQUIRE(r.step(step, nullptr));
  CHECK(b->calls.back().tables == std::vector<std::vector<uint32_t>>{{a, more[0]}, {c, more[1]}});
  // Row 5 finished: its table goes with it, and row 6 keeps its own.
  REQUIRE(r.step(decode(1, {6}, 16), nullptr));
  CHECK(b->calls.back().tables == std::vector<std::vector<uint32_t>>{{c, more[1]}});
  // Row 5's blocks are free here and another batch may take them.
  auto other = prefill(2, {7});
  other.plan.rows[0].blocks = {a};
  REQUIRE(r.step(other, nullptr));
  // A block a row of the batch holds, named for it again, is refused (and the batch ends).
  auto again = decode(2, {7}, 15);
  again.plan.rows[0].blocks = {a};
  auto twice = r.step(again, nullptr);
  REQUIRE_FALSE(twice);
  CHECK(is(twice.error(), ec::invalid_request));
  CHECK_THAT(render(twice.error()), Catch::Contains("which a row of the batch holds"));
  // A step that leaves a row's positions without blocks is refused, and ends its batch.
  auto bare = r.step(decode(1, {6}, 32), nullptr);
  REQUIRE_FALSE(bare);
  CHECK_THAT(render(bare.error()), Catch::Contains("2 KV blocks for 33 positions"));
  CHECK(r.batches() == 0);
  // A block another batch holds is named only after that batch's caches are gone
  // everywhere: here that batch's end was lost (its node was cut off), and it ends now.
  auto lost = prefill(4, {9});
  REQUIRE(r.step(lost, nullptr));
  auto next = prefill(5, {10});
  next.plan.rows[0].blocks = lost.plan.rows[0].blocks;
  REQUIRE(r.step(next, nullptr));
  CHECK(b->ended.back() == 4);
  CHECK(r.batches() == 1);
  auto late = r.step(decode(4, {9}), nullptr);
  REQUIRE_FALSE(late);
  CHECK_THAT(render(late.error()), Catch::Contains("has ended here"));
}

TEST_CASE("the reference loop steps a model's runners stage after stage", "[engine][runner]") {
  auto first = std::make_shared<recording_backend>();
  auto last = std::make_shared<recording_backend>();
  std::vector<std::vector<std::shared_ptr<runner>>> stages{
      {std::make_shared<runner>(first, false, false)},
      {std::make_shared<runner>(last, true, true)}};
  auto out = generate(stages, {{1, 2, 3}, std::vector<int64_t>(32, 4)}, 3, row_sampling{});
  REQUIRE(out);
  CHECK(*out == std::vector<std::vector<int64_t>>{{10, 10, 10}, {11, 11, 11}});
  // Both stages ran the same three plans, the second one fed the first one's hidden states,
  // and their tables grew as the rows did (the 32-token row's 33rd position is in its third
  // block): a prefill, then decode steps whose last ended the batch.
  REQUIRE(last->calls.size() == 3);
  CHECK(first->calls.size() == 3);
  CHECK(last->calls[0].prefill);
  CHECK(last->calls[1].tables == std::vector<std::vector<uint32_t>>{{0}, {1, 2, 3}});
  CHECK(last->calls[2].tables == last->calls[1].tables);
  CHECK(stages[0][0]->batches() == 0);
  CHECK(stages[1][0]->batches() == 0);
  // A failing stage fails the loop, and no runner keeps the batch.
  auto broken = std::make_shared<recording_backend>();
  broken->fail = true;
  stages = {{std::make_shared<runner>(first, false, false)},
            {std::make_shared<runner>(broken, true, true)}};
  auto failed = generate(stages, {{1}}, 2, row_sampling{});
  REQUIRE_FALSE(failed);
  CHECK(is(failed.error(), ec::device_error));
  CHECK(stages[0][0]->batches() == 0);
  auto none = generate(stages, {}, 2, row_sampling{});
  REQUIRE_FALSE(none);
  CHECK(is(none.error(), ec::invalid_request));
}

TEST_CASE("a runner's ends and adapter calls wait for a step running on another thread",
          "[engine][runner]") {
  // While a model moves to another compute lane, a cancel's end or an adapter's unbind sent
  // to the new lane may come while its step still runs on the old one.
  auto b = std::make_shared<slow_backend>();
  runner r{b, true, true};
  auto in = prefill(21, {1, 2});
  caf::expected<step_output> out = make_error(ec::invalid_state, "not run");
  std::thread stepping([&] { out = r.step(in, nullptr); });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!b->entered && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  REQUIRE(b->entered);
  r.unbind_adapter("a");
  r.end_batch(21);
  stepping.join();
  CHECK(out);  // the step ran whole, then the batch ended
  CHECK(b->overlaps == 0);
  CHECK(b->ended == std::vector<uint64_t>{21});
  CHECK(r.batches() == 0);
}
