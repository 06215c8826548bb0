// KV blocks in the ledger, carried out by the model manager and the swap scheduler under
// CAF's test coordinator (issue 30): a batch's rows ask for blocks as they grow, a joiner
// that does not fit waits, and a row preempted for room is recomputed and answers all its
// tokens; every block goes back at the end.
#include <catch2/catch.hpp>

#include "actors/model_manager.hpp"
#include "actors/registry.hpp"
#include "actors/swap_scheduler.hpp"
#include "common/error.hpp"
#include "tests/support/deterministic.hpp"
#include "tests/support/kv_toy.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;
using computron::testing::deterministic_fixture;
using computron::testing::fake_worker;
using computron::testing::fake_worker_script;
using computron::testing::kv_toy;

namespace {

/// One fake worker on a 100 MiB device and a toy model whose KV blocks are 20 MiB (the
/// fake worker reports no weight bytes): five blocks (80 tokens) fit.
struct kv_fixture : deterministic_fixture {
  fake_worker_script script;
  shard_worker_actor worker;
  swap_scheduler_actor scheduler;
  model_manager_actor manager;
  registry_actor registry;

  kv_fixture() {
    script.holder = sys.spawn(computron::testing::load_holder);
    worker = sys.spawn(fake_worker, &script, 0);
    scheduler = spawn_swap_scheduler(sys, {{worker, 100 << 20, 10.0}}, {}).value();
    model_manager_options mo;
    mo.batching.max_batch_size = 4;
    mo.batching.batch_window = 0ms;
    mo.batching.default_deadline = 10s;
    engine_registry engines{{"toy", std::make_shared<kv_toy>(20 << 20)}};
    manager = spawn_model_manager(sys, {worker}, scheduler, engines, mo).value();
    registry = spawn_registry(sys, {worker}, scheduler, manager, engines, {}).value();
    model_config m;
    m.name = "m";
    m.kind = "toy";
    m.devices = {0};
    REQUIRE(ask<model_info>(registry, register_atom_v, m));
  }

  ~kv_fixture() {
    for (auto a : {caf::actor_cast<caf::actor>(registry), caf::actor_cast<caf::actor>(manager),
                   caf::actor_cast<caf::actor>(scheduler), caf::actor_cast<caf::actor>(worker),
                   script.holder})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  auto send(int64_t max_tokens, std::vector<int64_t> prompt = {1, 2, 3}) {
    infer_request r;
    r.model = "m";
    r.tokens = std::move(prompt);
    r.max_tokens = max_tokens;
    return self->request(manager, caf::timespan{24h}, infer_atom_v, r);
  }

  void run_steps(size_t steps) {
    for (int i = 0; i < 100000 && script.step_rows.size() < steps; ++i) sched.run_once();
    REQUIRE(script.step_rows.size() == steps);
  }

  residency_report report() {
    auto rs = ask<std::vector<residency_report>>(scheduler, status_atom_v);
    REQUIRE(rs);
    REQUIRE(rs->size() == 1);
    return rs->front();
  }

  uint64_t kv_blocks() { return report().kv_blocks; }
};

std::vector<int64_t> counting(int64_t from, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(from + i);
  return out;
}

}  // namespace

TEST_CASE("KV in the ledger: a batch's blocks grow with its rows and all go back at its end",
          "[actors][manager][kv]") {
  kv_fixture f;
  auto a = f.send(40);
  f.run_steps(20);
  // 3 prompt tokens and 19 decoded steps cached: two blocks, asked ahead.
  CHECK(f.kv_blocks() >= 2);
  CHECK(f.kv_blocks() <= 4);
  f.sched.run();
  infer_reply ra;
  std::move(a).receive([&](infer_reply& r) { ra = r; }, [](caf::error& e) { FAIL(render(e)); });
  CHECK(ra.tokens == counting(7, 40));
  CHECK(f.kv_blocks() == 0);
}

TEST_CASE(
    "KV in the ledger: short of room, the youngest row is preempted, recomputed later, "
    "and answers all its tokens",
    "[actors][manager][kv]") {
  kv_fixture f;
  auto a = f.send(50);
  f.run_steps(3);
  auto b = f.send(60);
  f.sched.run();
  infer_reply ra, rb;
  std::move(a).receive([&](infer_reply& r) { ra = r; }, [](caf::error& e) { FAIL(render(e)); });
  std::move(b).receive([&](infer_reply& r) { rb = r; }, [](caf::error& e) { FAIL(render(e)); });
  // Five blocks fit. a (52 tokens at its end: four blocks) never gave way; b (62: four
  // blocks) joined, was preempted when the two outgrew the five, and ran again: the fake
  // worker's prefill answers 7, so its answer restarts counting where it was recomputed.
  CHECK(ra.tokens == counting(7, 50));
  REQUIRE(rb.tokens.size() == 60);
  CHECK(rb.tokens.front() == 7);
  auto restart = std::find(rb.tokens.begin() + 1, rb.tokens.end(), 7);
  REQUIRE(restart != rb.tokens.end());
  auto before = restart - rb.tokens.begin();
  CHECK(std::vector<int64_t>(rb.tokens.begin(), restart) == counting(7, before));
  CHECK(std::vector<int64_t>(restart, rb.tokens.end()) == counting(7, 60 - before));
  CHECK(f.kv_blocks() == 0);
}

TEST_CASE(
    "KV in the ledger: a prompt that can never fit fails with out_of_device_memory, "
    "the manager serves on",
    "[actors][manager][kv]") {
  kv_fixture f;
  auto big = f.send(1, std::vector<int64_t>(100, 5));  // 100 tokens: seven blocks, five fit
  f.sched.run();
  bool refused = false;
  std::move(big).receive([](infer_reply&) { FAIL("a prompt that cannot fit was served"); },
                         [&](caf::error& e) {
                           refused = is(e, ec::out_of_device_memory);
                           INFO(render(e));
                           CHECK(render(e).find("KV blocks") != std::string::npos);
                         });
  CHECK(refused);
  auto ok = f.send(3);
  f.sched.run();
  std::move(ok).receive([](infer_reply& r) { CHECK(r.tokens == counting(7, 3)); },
                        [](caf::error& e) { FAIL(render(e)); });
  CHECK(f.kv_blocks() == 0);
}

TEST_CASE(
    "a step that finds its device full sends its rows back to the queue: they run again and "
    "answer every token",
    "[actors][manager][kv]") {
  // Issue 44: room the ledger counted that a device did not have (a KV pool's pages still
  // going) never fails a request; its rows are recomputed as preempted rows are.
  kv_fixture f;
  f.script.room_short_steps = {5};
  auto a = f.send(20);
  f.sched.run();
  infer_reply ra;
  std::move(a).receive([&](infer_reply& r) { ra = r; }, [](caf::error& e) { FAIL(render(e)); });
  // Steps 1-4 gave 7, 8, 9, 10; step 5 failed; the row's recompute (a prefill: 7) goes on.
  REQUIRE(ra.tokens.size() == 20);
  CHECK(std::vector<int64_t>(ra.tokens.begin(), ra.tokens.begin() + 4) == counting(7, 4));
  CHECK(std::vector<int64_t>(ra.tokens.begin() + 4, ra.tokens.end()) == counting(7, 16));
  CHECK(f.kv_blocks() == 0);
}

TEST_CASE("a device that stays full fails the row after a bounded number of requeues",
          "[actors][manager][kv]") {
  kv_fixture f;
  for (size_t s = 1; s <= 100; ++s) f.script.room_short_steps.insert(s);
  auto a = f.send(5);
  f.sched.run();
  caf::error err;
  std::move(a).receive([](infer_reply&) { FAIL("a reply"); }, [&](caf::error& e) { err = e; });
  CHECK(is(err, ec::out_of_device_memory));
  CHECK(render(err).find("no room for 1 more KV blocks") != std::string::npos);
  // Its first try and eight more.
  CHECK(f.script.step_rows.size() == 9);
  CHECK(f.kv_blocks() == 0);
}

TEST_CASE(
    "an ended batch's KV blocks go back once its workers dropped its caches, not before, "
    "its lease at once, so the model unloads meanwhile",
    "[actors][manager][kv]") {
  // Issue 44: given back while its caches are still in a pool, a batch's blocks would let
  // the model's pool outgrow the ledger in another batch's step (the ledger counts the
  // larger of the pool's last report and the blocks granted, not their sum).
  kv_fixture f;
  f.script.hold_cancels = true;
  f.script.room_short_steps = {5};  // the batch fails at step 5: its caches are cancelled
  auto a = f.send(20);
  f.sched.run();
  infer_reply ra;
  std::move(a).receive([&](infer_reply& r) { ra = r; }, [](caf::error& e) { FAIL(render(e)); });
  CHECK(ra.tokens.size() == 20);  // the requeued row ran to its end in a batch of its own
  auto held = f.report();
  CHECK(held.kv_blocks > 0);
  CHECK(held.leases == 0);
  // An unload does not wait for the cancel; the blocks stay counted past the eviction.
  REQUIRE(f.ask<model_info>(f.manager, unload_atom_v, std::string{"m"}));
  auto evicted = f.report();
  CHECK(evicted.state == model_lifecycle::offloaded);
  CHECK(evicted.kv_blocks == held.kv_blocks);
  f.self->send(f.script.holder, caf::ok_atom_v);
  f.sched.run();
  CHECK(f.report().kv_blocks == 0);
}

TEST_CASE("a row its client cancelled ends at a requeue for room, and is not run again",
          "[actors][manager][kv]") {
  kv_fixture f;
  // The cancel, sent on the second token, reaches the manager before the third step's
  // result, and that step finds its device full.
  f.script.room_short_steps = {3};
  std::vector<int64_t> seen;
  std::vector<uint32_t> rows;
  auto rep = computron::testing::cancelled_on_second_token(f, f.manager, 7, 0, &seen, &rows);
  REQUIRE(rep);
  CHECK(rep->finish_reason == "cancelled");
  CHECK(rep->tokens == std::vector<int64_t>{7, 8});
  CHECK(f.script.step_rows.size() == 3u);  // no step after the failed one
  CHECK(f.kv_blocks() == 0);
}

TEST_CASE(
    "a row whose prefill found its device full goes back as it came: its prompt's "
    "log-probabilities come from the recompute",
    "[actors][manager][kv]") {
  kv_fixture f;
  f.script.room_short_steps = {1};
  infer_request r;
  r.model = "m";
  r.tokens = {1, 2, 3};
  r.max_tokens = 4;
  r.sampling.prompt_logprobs = 0;
  auto h = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, r);
  f.sched.run();
  std::move(h).receive(
      [&](infer_reply& rep) {
        CHECK(rep.tokens == counting(7, 4));
        // Tokens 2 and 3 of its prompt, as the fake worker scores them; not the prompt
        // with anything generated, nor nothing.
        REQUIRE(rep.prompt_logprobs.size() == 2);
        CHECK(rep.prompt_logprobs[0].top_ids == std::vector<int64_t>{2});
        CHECK(rep.prompt_logprobs[1].top_ids == std::vector<int64_t>{3});
      },
      [](caf::error& e) { FAIL(render(e)); });
  CHECK(f.script.step_rows.size() == 1u + 4u);  // the failed prefill, then four steps
  CHECK(f.kv_blocks() == 0);
}
