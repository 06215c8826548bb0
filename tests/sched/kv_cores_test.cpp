// KV blocks in the one budget with the weights (issue 30): the ledger's accounting, the
// residency core's answers to KV asks (room, evictions of lease-free models, partial
// grants, waiting for other batches' KV) and the dispatch core's asks, joins and
// preemptions at step boundaries, fed scripted events.
#include <catch2/catch.hpp>

#include <algorithm>

#include "sched/dispatch.hpp"
#include "sched/kv_blocks.hpp"
#include "sched/residency.hpp"

using namespace computron;
using namespace computron::sched;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t mb = 1 << 20;

/// One device of 100 MB; models a and b of 40 MB whose KV blocks are 1 MB each (the
/// block bytes are the ledger's only view of KV), and c of 40 MB without KV in blocks.
struct kv_fixture {
  std::unique_ptr<residency> core;
  time_point t{};
  model_id a = 0, b = 0, c = 0;

  kv_fixture() {
    refusal why;
    core = residency::make({{100 * mb, 10}}, {}, &why);
    REQUIRE(core);
    a = *core->ledger().add("a", {{0}, {40 * mb}, false, 0, {1 * mb}}, &why);
    b = *core->ledger().add("b", {{0}, {40 * mb}, false, 0, {1 * mb}}, &why);
    c = *core->ledger().add("c", {{0}, {40 * mb}, false, 0, {}}, &why);
  }
  /// Loads and leases `m` (waiter 100 + m).
  void lease(model_id m) {
    auto e = core->acquire(m, 100 + m, t);
    core->load_done(m, t);
  }
  uint64_t kv_bytes() const { return core->ledger().device(0).kv_bytes; }
};

const kv_grant* grant_of(const residency_effects& e, waiter_id w) {
  for (auto& g : e.kv_grants)
    if (g.waiter == w) return &g;
  return nullptr;
}

}  // namespace

TEST_CASE("kv: blocks count against the device's budget beside the weights", "[cores][kv]") {
  kv_fixture f;
  f.lease(f.a);
  auto& l = f.core->ledger();
  CHECK(l.kv_room(f.a) == 60);
  CHECK(l.kv_ceiling(f.a) == 60);
  auto e = f.core->kv_reserve(f.a, 1, 30, 10, false, f.t);
  auto* g = grant_of(e, 1);
  REQUIRE(g);
  CHECK(g->blocks == 30);
  CHECK(g->ceiling == 60);
  CHECK(f.kv_bytes() == 30 * mb);
  CHECK(l.model(f.a).kv_blocks == 30);
  // b (40 MB) does not fit beside a's weights and KV: its load waits (a is leased).
  e = f.core->acquire(f.b, 2, f.t);
  CHECK(e.loads.empty());
  // The KV coming back makes the room.
  e = f.core->kv_return(f.a, 30, f.t);
  CHECK(f.kv_bytes() == 0);
  CHECK(e.loads == std::vector<model_id>{f.b});
  // A model without block sizes counts nothing, and any ask fits.
  f.lease(f.c);
  CHECK(l.kv_room(f.c) == UINT64_MAX);
}

TEST_CASE("kv: an ask takes what fits, evicts lease-free models for its need, or gets less",
          "[cores][kv]") {
  kv_fixture f;
  f.lease(f.b);
  f.core->release(f.b, f.t);  // b resident and lease-free: a victim for KV room
  f.lease(f.a);
  auto& l = f.core->ledger();
  REQUIRE(l.kv_room(f.a) == 20);
  SECTION("what fits, at least the need, without evicting") {
    auto e = f.core->kv_reserve(f.a, 1, 30, 15, false, f.t);
    REQUIRE(grant_of(e, 1));
    CHECK(grant_of(e, 1)->blocks == 20);
    CHECK(e.evictions.empty());
  }
  SECTION("more than fits: the lease-free model is evicted and the ask waits for it") {
    auto e = f.core->kv_reserve(f.a, 1, 50, 30, false, f.t);
    CHECK(e.kv_grants.empty());
    CHECK(e.evictions == std::vector<model_id>{f.b});
    // A later ask that fits is answered at once: queued behind a waiting one, a growing
    // batch could wait for ever.
    e = f.core->kv_reserve(f.a, 2, 1, 1, false, f.t);
    REQUIRE(grant_of(e, 2));
    CHECK(grant_of(e, 2)->blocks == 1);
    e = f.core->evict_done(f.b, f.t);
    REQUIRE(grant_of(e, 1));
    CHECK(grant_of(e, 1)->blocks == 50);
    CHECK(f.kv_bytes() == 51 * mb);
  }
  SECTION("an eviction that fails: the ask gets what fits instead of the same victim again") {
    auto e = f.core->kv_reserve(f.a, 1, 50, 30, false, f.t);
    CHECK(e.evictions == std::vector<model_id>{f.b});
    e = f.core->evict_failed(f.b, {ec::device_error, "injected"}, f.t);
    CHECK(e.evictions.empty());
    REQUIRE(grant_of(e, 1));
    CHECK(grant_of(e, 1)->blocks == 20);
  }
  SECTION("a need no eviction can cover gets what fits: the batch preempts") {
    f.core->pin(f.b, true, f.t);
    auto e = f.core->kv_reserve(f.a, 1, 50, 30, false, f.t);
    CHECK(e.evictions.empty());
    REQUIRE(grant_of(e, 1));
    CHECK(grant_of(e, 1)->blocks == 20);
    CHECK(grant_of(e, 1)->ceiling == 20);  // b is pinned: 100 - 40 - 40
  }
}

TEST_CASE("kv: a first step's ask waits while other batches hold KV on its devices",
          "[cores][kv]") {
  kv_fixture f;
  f.lease(f.a);
  f.lease(f.b);
  auto e = f.core->kv_reserve(f.a, 1, 20, 20, false, f.t);
  REQUIRE(grant_of(e, 1));
  // b's first step needs 10 blocks; none are free and a (leased) cannot be evicted.
  e = f.core->kv_reserve(f.b, 2, 10, 10, true, f.t);
  CHECK(e.kv_grants.empty());
  e = f.core->kv_return(f.a, 20, f.t);
  REQUIRE(grant_of(e, 2));
  CHECK(grant_of(e, 2)->blocks == 10);
  // Without other KV to wait for, the ask gets what fits (none) at once.
  e = f.core->kv_reserve(f.b, 3, 30, 30, true, f.t);
  REQUIRE(grant_of(e, 3));
  CHECK(grant_of(e, 3)->blocks == 10);  // 100 - 80 weights - 10 held: 10 fit, less than its need
}

namespace {

/// A dispatcher over one device with model k (KV in blocks) and a batch size of 4.
struct kv_dispatch_fixture {
  std::unique_ptr<dispatcher> d;
  time_point t{};
  uint32_t k = 0;

  kv_dispatch_fixture() {
    batching_options o;
    o.batch_window = 0ms;
    o.max_batch_size = 4;
    o.default_deadline = 10s;
    refusal why;
    d = dispatcher::make(o, 1, &why);
    REQUIRE(d);
    k = d->add_model("k", 1, 1, {0}, 0, true);
  }
  lease_info resident() const { return {t, false, 0, 0, std::nullopt}; }
};

}  // namespace

TEST_CASE("kv: a batch's first step waits for its rows' blocks, rows that do not fit go back",
          "[cores][kv]") {
  kv_dispatch_fixture f;
  // Prompts of 20 and 40 tokens, 8 steps each.
  auto e = f.d->admit(f.k, 1, f.t, 0, 8, false, 20);
  auto id = e.formed.at(0).id;
  e = f.d->leased(id, f.resident(), f.t);
  CHECK(e.started.empty());
  REQUIRE(e.kv_asks.size() == 1);
  CHECK(e.kv_asks[0].start);
  CHECK(e.kv_asks[0].need == static_cast<uint64_t>(kv_blocks_for(21)));
  CHECK(e.kv_asks[0].want == static_cast<uint64_t>(kv_blocks_for(20 + 7)));
  SECTION("enough: it starts") {
    e = f.d->kv_granted(id, f.k, 2, 100, f.t);
    REQUIRE(e.started.size() == 1);
    CHECK(f.d->kv_held(id) == 2);
    // Its end gives the blocks back, before the lease.
    e = f.d->batch_done(id, f.t, true, 0.01, 8);
    REQUIRE(e.kv_returns.size() == 1);
    CHECK(e.kv_returns[0].blocks == 2);
    CHECK(e.releases.size() == 1);
  }
  SECTION("none: the row goes back to the queue and the model waits for room") {
    e = f.d->kv_granted(id, f.k, 0, 100, f.t);
    CHECK(e.started.empty());
    REQUIRE(e.preempted.size() == 1);
    CHECK(e.preempted[0].rows.at(0).key == 1);
    CHECK(e.releases.size() == 1);
    CHECK(e.formed.empty());  // blocked: not the same batch again at once
    CHECK(f.d->queues().queued(f.k) == 1);
    // It tries again after kv_retry, whatever else happens (a load may end unheard).
    REQUIRE_FALSE(e.ticks.empty());
    e = f.d->tick(e.ticks.front());
    REQUIRE(e.formed.size() == 1);
    CHECK(e.formed[0].rows.at(0).key == 1);
  }
  SECTION("a row that can never fit fails") {
    e = f.d->kv_granted(id, f.k, 0, 1, f.t);
    REQUIRE(e.failures.size() == 1);
    CHECK(e.failures[0].why == row_end::no_kv_room);
    CHECK(e.preempted.empty());
  }
}

TEST_CASE(
    "kv: rows grow into new blocks at step boundaries, joiners join only where they fit, "
    "short of room, the youngest rows are preempted with their progress",
    "[cores][kv]") {
  kv_dispatch_fixture f;
  // A 15-token prompt, 40 steps: the prefill caches 15 tokens, the next step the 16th
  // (one block), the one after the 17th (two blocks).
  auto id = f.d->admit(f.k, 1, f.t, 0, 40, false, 15).formed.at(0).id;
  auto e = f.d->leased(id, f.resident(), f.t);
  REQUIRE(e.kv_asks.size() == 1);
  e = f.d->kv_granted(id, f.k, 2, 100, f.t);
  REQUIRE(e.started.size() == 1);
  // Two more arrive while it runs; they wait for a step boundary.
  CHECK(f.d->admit(f.k, 2, f.t, 0, 40, false, 15).formed.empty());
  CHECK(f.d->admit(f.k, 3, f.t, 0, 40, false, 15).formed.empty());
  // Boundary 1: row 1 needs 1 block, each joiner 1: 3 > 2 held, so an ask; its need is
  // only row 1's (held already), so the step does not wait for more than what fits.
  e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.kv_asks.size() == 1);
  CHECK(e.kv_asks[0].need == 0);
  CHECK(e.steps.empty());
  e = f.d->kv_granted(id, f.k, 0, 100, f.t);
  REQUIRE(e.joins.size() == 1);
  REQUIRE(e.joins[0].rows.size() == 1);  // key 2 fits beside row 1; key 3 stays queued
  CHECK(e.joins[0].rows[0].key == 2);
  CHECK(std::find(e.steps.begin(), e.steps.end(), id) != e.steps.end());
  CHECK(f.d->queues().queued(f.k) == 1);
  // Boundary 2: row 1 now needs 2 blocks (17 tokens) and so does row 2 (its prefill and
  // the step it shared: 17 tokens too): short by two. Nothing more is granted: row 2, the
  // youngest, is preempted and queued first again with the two tokens it generated as
  // part of its prompt.
  e = f.d->step_boundary(id, {1, 2}, f.t);
  REQUIRE(e.kv_asks.size() == 1);
  CHECK(e.kv_asks[0].need == 2);
  e = f.d->kv_granted(id, f.k, 0, 100, f.t);
  REQUIRE(e.preempted.size() == 1);
  REQUIRE(e.preempted[0].rows.size() == 1);
  auto& p = e.preempted[0].rows[0];
  CHECK(p.key == 2);
  CHECK(p.prompt_tokens == 17);
  CHECK(p.steps == 38);
  CHECK(std::find(e.steps.begin(), e.steps.end(), id) != e.steps.end());
  // The next step's plan: row 1 alone, row 2 among the rows that left.
  REQUIRE(e.plans.size() == 1);
  CHECK(e.plans[0].finished == std::vector<uint64_t>{2});
  REQUIRE(e.plans[0].rows.size() == 1);
  CHECK(e.plans[0].rows[0].key == 1);
  CHECK(f.d->queues().queued(f.k) == 2);
  // Row 1 fits its two blocks (18 tokens); the queued ones ask to join, and only they
  // wait on the answer.
  e = f.d->step_boundary(id, {1}, f.t);
  REQUIRE(e.kv_asks.size() == 1);
  CHECK(e.kv_asks[0].need == 0);
}

TEST_CASE("kv: a row that could never fit fails at its step boundary", "[cores][kv]") {
  kv_dispatch_fixture f;
  auto id = f.d->admit(f.k, 1, f.t, 0, 40, false, 15).formed.at(0).id;
  f.d->leased(id, f.resident(), f.t);
  REQUIRE(f.d->kv_granted(id, f.k, 1, 100, f.t).started.size() == 1);
  auto e = f.d->step_boundary(id, {1}, f.t);  // 16 tokens: one block
  CHECK(e.kv_asks.empty());
  e = f.d->step_boundary(id, {1}, f.t);  // 17 tokens: two blocks
  REQUIRE(e.kv_asks.size() == 1);
  e = f.d->kv_granted(id, f.k, 0, 1, f.t);  // the model can never hold more than one
  REQUIRE(e.failures.size() == 1);
  CHECK(e.failures[0].why == row_end::no_kv_room);
  CHECK(e.failures[0].batch == id);
  CHECK(e.steps.empty());  // no row left: the driver ends the batch
}

TEST_CASE("kv: a fixed reserve holds all KV apart from the weights, and no weights go for it",
          "[cores][kv]") {
  refusal why;
  ledger_options o;
  o.kv_reserve_bytes = 10 * mb;
  auto core = residency::make({{100 * mb, 10}}, o, &why);
  REQUIRE(core);
  auto a = *core->ledger().add("a", {{0}, {40 * mb}, false, 0, {1 * mb}}, &why);
  auto b = *core->ledger().add("b", {{0}, {40 * mb}, false, 0, {1 * mb}}, &why);
  time_point t{};
  core->acquire(b, 1, t);
  core->load_done(b, t);
  core->release(b, t);
  core->acquire(a, 2, t);
  core->load_done(a, t);
  auto& l = core->ledger();
  CHECK(l.device(0).slot.usable_bytes == 90 * mb);
  CHECK(l.kv_room(a) == 10);
  CHECK(l.kv_ceiling(a) == 10);
  auto e = core->kv_reserve(a, 3, 30, 20, false, t);
  CHECK(e.evictions.empty());  // b is lease-free, but its room is not the reserve's
  REQUIRE(grant_of(e, 3));
  CHECK(grant_of(e, 3)->blocks == 10);
  // The weights' budget is untouched by the KV held.
  CHECK(l.device(0).used_bytes == 80 * mb);
  // A reserve as large as a device is refused.
  o.kv_reserve_bytes = 100 * mb;
  CHECK_FALSE(residency::make({{100 * mb, 10}}, o, &why));
  CHECK(why.reason.find("KV reserve") != std::string::npos);
}

TEST_CASE("kv: what a model's pools report holding counts until they give it back", "[cores][kv]") {
  // Cause 2 of issue 44: a pool frees pages only as whole chunks empty, so after a batch
  // gave blocks back the pool could still hold them while the ledger handed the room to a
  // load (503 out_of_device_memory). Its report keeps the ledger from counting less.
  kv_fixture f;
  f.lease(f.a);
  auto e = f.core->kv_reserve(f.a, 1, 20, 20, false, f.t);
  REQUIRE(grant_of(e, 1));
  CHECK(f.kv_bytes() == 20 * mb);
  // The pool took 24 MB of pages for those blocks (chunks fill whole pages).
  CHECK(f.core->kv_pool(f.a, {0}, {24 * mb}, f.t).empty());
  CHECK(f.kv_bytes() == 24 * mb);
  CHECK(f.core->ledger().kv_charge(f.a, 0) == 24 * mb);
  // The batch gives 15 blocks back; the pool still holds its chunks: 24 MB stay counted,
  // so b (40 MB) cannot load beside a (40 MB) in the 36 MB the blocks alone would leave.
  f.core->kv_return(f.a, 15, f.t);
  CHECK(f.core->ledger().model(f.a).kv_blocks == 5);
  CHECK(f.kv_bytes() == 24 * mb);
  CHECK(f.core->ledger().kv_room(f.a) == 36);
  // The pool reports less, then nothing: the ledger follows, and a report below the blocks
  // still held never counts less than the blocks.
  f.core->kv_pool(f.a, {0}, {8 * mb}, f.t);
  CHECK(f.kv_bytes() == 8 * mb);
  f.core->kv_pool(f.a, {0}, {0}, f.t);
  CHECK(f.kv_bytes() == 5 * mb);
  // Devices the model has no shard on are ignored; the rest of the device is untouched.
  f.core->kv_pool(f.a, {3}, {99 * mb}, f.t);
  CHECK(f.kv_bytes() == 5 * mb);
  // A report that frees room runs a pass: b waits for room, a's pool gives it back.
  f.core->kv_pool(f.a, {0}, {30 * mb}, f.t);
  auto lb = f.core->acquire(f.b, 2, f.t);
  CHECK(lb.loads.empty());  // 40 + 30 + 40 > 100, and a is leased
  f.core->kv_return(f.a, 5, f.t);
  auto freed = f.core->kv_pool(f.a, {0}, {0}, f.t);
  CHECK(f.kv_bytes() == 0);
  CHECK(freed.loads == std::vector<model_id>{f.b});
}

TEST_CASE(
    "kv: a pool's pages count past its model's last lease and eviction, until its workers "
    "report them gone",
    "[cores][kv]") {
  // The soak found this (issue 44): a batch's lease ended here, the ledger dropped its
  // pools' figure, and a load was placed in pages a worker had not freed yet (its cancel
  // waited behind another model's step on the lane). A KV step there then found the device
  // full. The workers now answer the cancel with what their pool holds after it.
  kv_fixture f;
  f.lease(f.a);
  f.core->kv_reserve(f.a, 1, 4, 4, false, f.t);
  f.core->kv_pool(f.a, {0}, {6 * mb}, f.t);
  f.core->kv_return(f.a, 4, f.t);
  CHECK(f.kv_bytes() == 6 * mb);
  f.core->release(f.a, f.t);
  CHECK(f.kv_bytes() == 6 * mb);
  f.core->unload(f.a, 9, f.t);
  f.core->evict_done(f.a, f.t);
  CHECK(f.core->ledger().device(0).used_bytes == 0);
  CHECK(f.kv_bytes() == 6 * mb);
  CHECK(f.core->ledger().model(f.a).kv_blocks == 0);
  // The worker's answer to the cancel: its pool is empty.
  f.core->kv_pool(f.a, {0}, {0}, f.t);
  CHECK(f.kv_bytes() == 0);
}

TEST_CASE(
    "kv: an ended batch's blocks, returned once its caches are gone, count past its lease and "
    "its model's eviction",
    "[cores][kv]") {
  // The manager holds an ended batch's return until its workers dropped its caches; the
  // lease goes at once, and the model may be evicted meanwhile. Cleared at the eviction,
  // a return arriving after a reload would take the new batch's blocks.
  kv_fixture f;
  f.lease(f.a);
  f.core->kv_reserve(f.a, 1, 4, 4, false, f.t);
  f.core->release(f.a, f.t);
  f.core->unload(f.a, 9, f.t);
  f.core->evict_done(f.a, f.t);
  CHECK(f.core->ledger().device(0).used_bytes == 0);
  CHECK(f.core->ledger().model(f.a).kv_blocks == 4);
  CHECK(f.kv_bytes() == 4 * mb);
  // Loaded again, a new batch takes 2 blocks; then the old return comes.
  f.lease(f.a);
  f.core->kv_reserve(f.a, 2, 2, 2, false, f.t);
  f.core->kv_return(f.a, 4, f.t);
  CHECK(f.core->ledger().model(f.a).kv_blocks == 2);
  CHECK(f.kv_bytes() == 2 * mb);
}

TEST_CASE(
    "kv: a lost device drops its model's pool figure there, and the devices still here keep "
    "theirs until their workers report",
    "[cores][kv]") {
  // A model across two devices loses one: its batches fail, and the cancels that drop
  // their caches on the device still here wait on its lane. Until they are answered, the
  // pool's pages there are the ledger's to count, not to hand to a load.
  refusal why;
  auto core = residency::make({{100 * mb, 10}, {100 * mb, 10}}, {}, &why);
  REQUIRE(core);
  auto m = *core->ledger().add("m", {{0, 1}, {40 * mb, 40 * mb}, false, 0, {1 * mb, 1 * mb}}, &why);
  time_point t{};
  core->acquire(m, 1, t);
  core->load_done(m, t);
  core->kv_reserve(m, 2, 4, 4, false, t);
  core->kv_pool(m, {0, 1}, {6 * mb, 6 * mb}, t);
  auto& l = core->ledger();
  CHECK(l.device(0).kv_bytes == 6 * mb);
  core->lose({1}, t);
  CHECK(l.model(m).kv_blocks == 0);
  CHECK(l.device(0).used_bytes == 0);
  CHECK(l.device(0).kv_bytes == 6 * mb);
  CHECK(l.device(1).kv_bytes == 0);
  // The worker still here answers the cancel: its pool is empty.
  core->kv_pool(m, {0}, {0}, t);
  CHECK(l.device(0).kv_bytes == 0);
}
