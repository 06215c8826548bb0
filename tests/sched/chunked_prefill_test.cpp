// Chunked prefill of joiners (issue 30): the dispatch core's plans at step boundaries, one
// chunk per boundary while rows run, the rest at once when none does, whole prefills
// where chunks cannot serve, and the joiners' KV blocks held from the first chunk on.
#include <catch2/catch.hpp>

#include "common/prefill_window.hpp"
#include "sched/dispatch.hpp"
#include "sched/kv_blocks.hpp"

using namespace computron;
using namespace computron::sched;
using namespace std::chrono_literals;

namespace {

/// One device; model "x" (no KV in the ledger) and "k" (KV in the ledger), batches of 4,
/// chunks of 8 tokens.
struct chunk_fixture {
  std::unique_ptr<dispatcher> d;
  time_point t{};
  uint32_t x = 0, k = 0;

  explicit chunk_fixture(uint32_t chunk = 8) {
    batching_options o;
    o.batch_window = 0ms;
    o.max_batch_size = 4;
    o.default_deadline = 10s;
    o.prefill_chunk = chunk;
    refusal why;
    d = dispatcher::make(o, 1, &why);
    REQUIRE(d);
    x = d->add_model("x", 1, 1, {0}, 0);
    k = d->add_model("k", 1, 1, {0}, 0, true);
  }
  /// A batch of x running request 1 (a prompt of 4, 100 steps).
  batch_id running_x() {
    auto e = d->admit(x, 1, t, 0, 100, false, 4);
    auto id = e.formed.at(0).id;
    REQUIRE(d->leased(id, {t, false, 0, 0, std::nullopt}, t).started.size() == 1);
    return id;
  }
};

/// Tokens row `n` long computes in `p` (the one window rule).
int64_t computed(int64_t n, const join_plan& p) {
  return prefill_window(n, p.chunk, p.left).tokens();
}

}  // namespace

TEST_CASE("chunked prefill: a long joiner comes in chunks, one per boundary, then joins",
          "[cores][continuous][chunked]") {
  chunk_fixture f;
  auto id = f.running_x();
  CHECK(f.d->admit(f.x, 2, f.t, 0, 10, false, 20).formed.empty());
  CHECK(f.d->admit(f.x, 3, f.t, 0, 10, false, 5).formed.empty());
  auto e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.joins.size() == 1);
  auto first = e.joins[0];
  CHECK(first.into == id);
  CHECK(first.partial());
  REQUIRE(first.rows.size() == 2);
  // 20 tokens in chunks of 8: 4, then 8 and 8; the 5-token prompt is in the last chunk.
  CHECK(first.chunk == 4);
  CHECK(first.left == 16);
  CHECK(computed(20, first) == 4);
  CHECK(computed(5, first) == 0);
  CHECK(e.steps == std::vector<batch_id>{id});  // the running row steps after the chunk
  // A request that arrives meanwhile joins no earlier than the chunked join ends (the
  // boundaries below join nothing else; the one after the join takes it).
  f.d->admit(f.x, 4, f.t, 0, 10, false, 3);
  e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].id == first.id);
  CHECK(e.joins[0].chunk == 8);
  CHECK(e.joins[0].left == 8);
  CHECK(computed(20, e.joins[0]) == 8);
  CHECK(computed(5, e.joins[0]) == 0);
  e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.joins.size() == 1);
  CHECK_FALSE(e.joins[0].partial());
  CHECK(e.joins[0].id == first.id);
  CHECK(e.joins[0].chunk == 8);
  CHECK(e.joins[0].left == 0);
  CHECK(computed(20, e.joins[0]) == 8);
  CHECK(computed(5, e.joins[0]) == 5);
  // Joined: the next boundary runs three rows and takes the one queued (no chunks: short).
  e = f.d->step_boundary(id, {1, 2, 3}, f.t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].rows.size() == 1);
  CHECK(e.joins[0].rows[0].key == 4);
  CHECK(e.joins[0].chunk == 0);
}

TEST_CASE("chunked prefill: with no row running the rest comes at once",
          "[cores][continuous][chunked]") {
  chunk_fixture f;
  auto id = f.running_x();
  CHECK(f.d->admit(f.x, 2, f.t, 0, 10, false, 30).formed.empty());
  auto e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].chunk == 6);
  CHECK(e.joins[0].left == 24);
  // The running row finished: nothing stalls now, the remaining 24 tokens go in one step.
  e = f.d->step_boundary(id, {}, f.t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].chunk == 24);
  CHECK(e.joins[0].left == 0);
  CHECK(e.steps == std::vector<batch_id>{id});
}

TEST_CASE("chunked prefill: whole prefills where chunks would not help or cannot serve",
          "[cores][continuous][chunked]") {
  SECTION("prompts within a chunk") {
    chunk_fixture f;
    auto id = f.running_x();
    f.d->admit(f.x, 2, f.t, 0, 10, false, 8);
    auto e = f.d->step_boundary(id, {1}, f.t);
    REQUIRE(e.joins.size() == 1);
    CHECK(e.joins[0].chunk == 0);
  }
  SECTION("a row that asks for its prompt's log-probabilities") {
    chunk_fixture f;
    auto id = f.running_x();
    f.d->admit(f.x, 2, f.t, 0, 10, false, 30, true);
    auto e = f.d->step_boundary(id, {1}, f.t);
    REQUIRE(e.joins.size() == 1);
    CHECK(e.joins[0].chunk == 0);
  }
  SECTION("chunking off") {
    chunk_fixture f{0};
    auto id = f.running_x();
    f.d->admit(f.x, 2, f.t, 0, 10, false, 300);
    auto e = f.d->step_boundary(id, {1}, f.t);
    REQUIRE(e.joins.size() == 1);
    CHECK(e.joins[0].chunk == 0);
  }
  SECTION("no row running") {
    chunk_fixture f;
    auto id = f.running_x();
    f.d->admit(f.x, 2, f.t, 0, 10, false, 30);
    auto e = f.d->step_boundary(id, {}, f.t);
    REQUIRE(e.joins.size() == 1);
    CHECK(e.joins[0].chunk == 0);
  }
}

TEST_CASE("chunked prefill: the joiners' KV blocks are held from the first chunk to the join",
          "[cores][continuous][chunked][kv]") {
  chunk_fixture f;
  auto e = f.d->admit(f.k, 1, f.t, 0, 100, false, 4);
  auto id = e.formed.at(0).id;
  e = f.d->leased(id, {f.t, false, 0, 0, std::nullopt}, f.t);
  REQUIRE(e.kv_asks.size() == 1);
  e = f.d->kv_granted(id, f.k, e.kv_asks[0].want, 1000, f.t);
  REQUIRE(e.started.size() == 1);
  const auto before = f.d->kv_held(id);
  // A joiner of 40 tokens: its prompt and first token (3 blocks) are asked for at once.
  f.d->admit(f.k, 2, f.t, 0, 10, false, 40);
  e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.kv_asks.size() == 1);
  CHECK(e.kv_asks[0].want + before >= static_cast<uint64_t>(kv_blocks_for(41)) + 1);
  e = f.d->kv_granted(id, f.k, e.kv_asks[0].want, 1000, f.t);
  REQUIRE(e.joins.size() == 1);
  CHECK(e.joins[0].partial());
  const auto held = f.d->kv_held(id);
  CHECK(held >= before + static_cast<uint64_t>(kv_blocks_for(41)));
  // The chunks that follow ask nothing and give nothing back: the blocks wait for them.
  for (int i = 0; i < 4; ++i) {
    e = f.d->step_boundary(id, {1}, f.t);
    CHECK(e.kv_returns.empty());
    CHECK(e.kv_asks.empty());
    REQUIRE(e.joins.size() == 1);
    CHECK(f.d->kv_held(id) == held);
    if (!e.joins[0].partial()) break;
  }
  CHECK(e.joins[0].left == 0);
  CHECK(e.joins[0].rows.at(0).key == 2);
}

TEST_CASE("chunked prefill: the chunk windows of a prompt tile it, and prompts end together",
          "[chunked]") {
  // Chunks of 4 leaving 8, 4 and 0 of prompts of 10 and 3 tokens.
  CHECK(prefill_window(10, 4, 8).begin == 0);
  CHECK(prefill_window(10, 4, 8).end == 2);
  CHECK(prefill_window(10, 4, 4).begin == 2);
  CHECK(prefill_window(10, 4, 4).end == 6);
  CHECK(prefill_window(10, 4, 0).begin == 6);
  CHECK(prefill_window(10, 4, 0).end == 10);
  CHECK(prefill_window(3, 4, 8).tokens() == 0);
  CHECK(prefill_window(3, 4, 4).tokens() == 0);
  CHECK(prefill_window(3, 4, 0).begin == 0);
  CHECK(prefill_window(3, 4, 0).end == 3);
  // Without chunks the whole prompt, whatever is said to be left.
  CHECK(prefill_window(10, 0, 0).tokens() == 10);
  // Any chunk size: consecutive windows meet, and cover the prompt once.
  for (int64_t n : {1, 7, 16, 33})
    for (int64_t c : {1, 4, 16}) {
      int64_t at = 0;
      for (int64_t left = (n - 1) / c * c + c; left >= 0; left -= c) {
        auto w = prefill_window(n, c, left);
        CHECK(w.begin == at);
        at = w.end;
      }
      CHECK(at == n);
    }
}
