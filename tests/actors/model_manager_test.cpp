// The model manager under CAF's test coordinator: its clock moves only when the test
// says, so batch windows, queue times and deadlines are exact, with no sleeps.
#include <catch2/catch.hpp>

#include "actors/frontend.hpp"
#include "actors/model_manager.hpp"
#include "actors/registry.hpp"
#include "actors/swap_scheduler.hpp"
#include "common/error.hpp"
#include "tests/actors/manager_fixture.hpp"
#include "tests/support/deterministic.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;
using computron::testing::deterministic_fixture;
using computron::testing::fake_worker;
using computron::testing::fake_worker_script;
using computron::testing::manager_fixture;

TEST_CASE("a batch waits exactly its window on the actor clock, then goes with company",
          "[actors][manager]") {
  manager_fixture f;
  auto a = f.send();
  f.sched.run();
  f.sched.advance_time(3ms);
  auto b = f.send();
  f.sched.run();
  CHECK_FALSE(f.replied());  // the head's window (5 ms) is still open
  f.sched.advance_time(2ms);
  f.sched.run();
  CHECK_FALSE(f.replied());  // the tick fires 100 us after the window closes
  f.sched.advance_time(100us);
  f.sched.run();
  REQUIRE(f.replied());
  std::vector<infer_reply> got;
  for (auto* h : {&a, &b})
    std::move(*h).receive([&](infer_reply& r) { got.push_back(r); },
                          [](caf::error& e) { FAIL(render(e)); });
  REQUIRE(got.size() == 2);
  CHECK(got[0].batch_size == 2);
  CHECK(got[0].tokens == std::vector<int64_t>{7});
  // Virtual time: the first waited 5.1 ms in the queue, the second 2.1 ms.
  CHECK(got[0].queue_ms == Approx(5.1));
  CHECK(got[1].queue_ms == Approx(2.1));
  CHECK(got[0].swapped);  // the first batch loaded the model
}

TEST_CASE("a full batch goes at once and a request past its deadline fails in the queue",
          "[actors][manager]") {
  manager_fixture f;
  std::vector<decltype(f.send())> full;
  for (int i = 0; i < 4; ++i) full.push_back(f.send());
  f.sched.run();
  REQUIRE(f.replied());  // four fill a batch: no window
  for (auto& h : full)
    std::move(h).receive([&](infer_reply& r) { CHECK(r.queue_ms == 0); },
                         [](caf::error& e) { FAIL(render(e)); });
  auto late = f.send(2);  // a 2 ms deadline inside a 5 ms window
  f.sched.run();
  f.sched.advance_time(2ms);
  f.sched.run();
  f.sched.advance_time(100us);
  f.sched.run();
  REQUIRE(f.replied());
  std::move(late).receive([](infer_reply&) { FAIL("a late request was served"); },
                          [](caf::error& e) {
                            CHECK(is(e, ec::deadline_exceeded));
                            CHECK_THAT(render(e), Catch::Contains("in the queue of m"));
                          });
}

TEST_CASE("rows leave the batch as they finish: max_tokens per row, EOS, no wasted steps",
          "[actors][manager]") {
  manager_fixture f;
  auto make = [](int64_t max_tokens, int64_t eos) {
    infer_request r;
    r.model = "m";
    r.tokens = {1, 2, 3};
    r.max_tokens = max_tokens;
    if (eos >= 0) r.stop_ids = {eos};
    return r;
  };
  auto a = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, make(2, -1));
  auto b = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, make(5, -1));
  auto c = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, make(6, 9));
  f.sched.run();
  f.sched.advance_time(6ms);
  f.sched.run();
  std::vector<infer_reply> got;
  for (auto* h : {&a, &b, &c})
    std::move(*h).receive([&](infer_reply& r) { got.push_back(r); },
                          [](caf::error& e) { FAIL(render(e)); });
  REQUIRE(got.size() == 3);
  CHECK(got[0].tokens == std::vector<int64_t>{7, 8});
  CHECK(got[0].finish_reason == "length");
  CHECK(got[1].tokens == std::vector<int64_t>{7, 8, 9, 10, 11});
  CHECK(got[1].finish_reason == "length");
  // EOS (9) ends the row and is not returned.
  CHECK(got[2].tokens == std::vector<int64_t>{7, 8});
  CHECK(got[2].finish_reason == "stop");
  // a leaves after step 1 (two tokens), c on EOS at step 2, b runs alone to five.
  CHECK(f.script.step_rows == std::vector<size_t>{3, 3, 2, 1, 1});
  REQUIRE(f.script.keeps.size() == 5);
  CHECK(f.script.keeps[1].empty());
  CHECK(f.script.keeps[2] == std::vector<int32_t>{1, 2});
  CHECK(f.script.keeps[3] == std::vector<int32_t>{0});
  CHECK(f.script.keeps[4].empty());
}

namespace {

infer_request long_and_short(int64_t max_tokens, const std::string& model = "m") {
  infer_request r;
  r.model = model;
  r.tokens = {1, 2, 3};
  r.max_tokens = max_tokens;
  return r;
}

}  // namespace

TEST_CASE("continuous batching: a short request joins a running long one and leaves first",
          "[actors][manager][continuous]") {
  for (bool continuous : {true, false}) {
    INFO("continuous " << continuous);
    manager_fixture f{true, continuous};
    auto a = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, long_and_short(6));
    f.sched.run();
    f.sched.advance_time(6ms);
    // a's batch runs its prefill and first decode step; then b arrives.
    f.run_steps(2);
    auto b = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, long_and_short(2));
    f.settle();
    infer_reply ra, rb;
    std::move(a).receive([&](infer_reply& r) { ra = r; }, [](caf::error& e) { FAIL(render(e)); });
    std::move(b).receive([&](infer_reply& r) { rb = r; }, [](caf::error& e) { FAIL(render(e)); });
    CHECK(ra.tokens == std::vector<int64_t>{7, 8, 9, 10, 11, 12});
    CHECK(rb.tokens == std::vector<int64_t>{7, 8});
    auto joins = std::count_if(f.script.joins.begin(), f.script.joins.end(),
                               [](uint64_t j) { return j != 0; });
    if (continuous) {
      // b's prefill ran as its own step joining a's batch at a step boundary; the next
      // step ran both rows, then b left (its two tokens) and a went on alone.
      REQUIRE(joins == 1);
      auto k = static_cast<size_t>(std::find_if(f.script.joins.begin(), f.script.joins.end(),
                                                [](uint64_t j) { return j != 0; }) -
                                   f.script.joins.begin());
      REQUIRE(f.script.step_rows.size() == 7);  // a's six steps and b's prefill
      REQUIRE(k + 2 < f.script.step_rows.size());
      CHECK(f.script.step_rows[k] == 1);
      CHECK(f.script.sampling_rows[k] == 1);  // b's settings travel with its prefill
      CHECK(f.script.step_rows[k + 1] == 2);
      CHECK(f.script.keeps[k + 1].empty());  // a and b, as joined
      CHECK(f.script.keeps[k + 2] == std::vector<int32_t>{0});
      CHECK(rb.batch_size == 2);
    } else {
      // b waits for a's whole batch, then runs alone.
      CHECK(joins == 0);
      CHECK(f.script.step_rows == std::vector<size_t>{1, 1, 1, 1, 1, 1, 1, 1});
      CHECK(rb.batch_size == 1);
    }
  }
}

TEST_CASE(
    "continuous batching: a batch stops taking joins while another model waits for "
    "its device",
    "[actors][manager][continuous]") {
  manager_fixture f;
  model_config n;
  n.name = "n";
  n.kind = "toy";
  n.devices = {0};
  REQUIRE(f.ask<model_info>(f.registry, register_atom_v, n));
  // a's batch (m) and c's (n) form together; c's waits for device 0 while a's runs.
  auto a = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, long_and_short(6));
  auto c = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, long_and_short(1, "n"));
  f.sched.run();
  f.sched.advance_time(6ms);
  f.run_steps(2);
  // m's next request must not join m's running batch ahead of c's.
  auto b = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, long_and_short(2));
  f.settle();
  for (auto* h : {&a, &c, &b})
    std::move(*h).receive([](infer_reply&) {}, [](caf::error& e) { FAIL(render(e)); });
  CHECK(
      std::all_of(f.script.joins.begin(), f.script.joins.end(), [](uint64_t j) { return j == 0; }));
}

TEST_CASE("any of several stop ids ends a row, log-probabilities travel with the tokens",
          "[actors][manager]") {
  manager_fixture f;
  infer_request a;
  a.model = "m";
  a.tokens = {1, 2, 3};
  a.max_tokens = 6;
  a.stop_ids = {42, 9, 43};  // 7, 8, then 9 is sampled
  a.sampling.logprobs = 1;
  infer_request b = a;
  b.stop_ids = {};
  b.max_tokens = 2;
  b.sampling.logprobs = -1;
  auto ha = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, a);
  auto hb = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, b);
  f.sched.run();
  f.sched.advance_time(6ms);
  f.sched.run();
  std::vector<infer_reply> got;
  for (auto* h : {&ha, &hb})
    std::move(*h).receive([&](infer_reply& r) { got.push_back(r); },
                          [](caf::error& e) { FAIL(render(e)); });
  REQUIRE(got.size() == 2);
  CHECK(got[0].tokens == std::vector<int64_t>{7, 8});
  CHECK(got[0].finish_reason == "stop");
  CHECK(got[0].stop_id == 9);
  // One per token, then the stop id's (9), which ended the row.
  REQUIRE(got[0].logprobs.size() == 3);
  CHECK(got[0].logprobs[0].logprob == Approx(-0.07));
  CHECK(got[0].logprobs[1].top_ids == std::vector<int64_t>{8});
  CHECK(got[0].logprobs[2].top_ids == std::vector<int64_t>{9});
  CHECK(got[1].tokens == std::vector<int64_t>{7, 8});
  CHECK(got[1].logprobs.empty());
  // The settings travel with the prefill only; the decode steps carry none.
  REQUIRE(f.script.sampling_rows.size() >= 2);
  CHECK(f.script.sampling_rows[0] == 2);
  CHECK(f.script.sampling_rows[1] == 0);
  CHECK(got[1].stop_id == -1);
  // A stop id outside the vocabulary is refused.
  infer_request bad = a;
  bad.stop_ids = {1 << 30};
  auto hc = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, bad);
  f.sched.run();
  std::move(hc).receive(
      [](infer_reply&) { FAIL("accepted"); },
      [](caf::error& e) { CHECK_THAT(render(e), Catch::Contains("stop token")); });
}

TEST_CASE("streamed tokens come one by one, and a cancel ends the row after its step",
          "[actors][manager]") {
  manager_fixture f;
  std::vector<int64_t> seen;
  std::vector<uint32_t> rows;
  auto rep = computron::testing::cancelled_on_second_token(f, f.manager, 41, 3, &seen, &rows);
  REQUIRE(rep);
  CHECK(rep->finish_reason == "cancelled");
  // The cancel, sent on the second token, reaches the manager before the third step's
  // result: two tokens, then the row ends.
  CHECK(rep->tokens == std::vector<int64_t>{7, 8});
  CHECK(seen == std::vector<int64_t>{7, 8});
  CHECK(rows == std::vector<uint32_t>{3, 3});
  CHECK(f.script.step_rows.size() == 3u);

  // A cancel in the queue fails the request at once as cancelled.
  infer_request r;
  r.model = "m";
  r.tokens = {1, 2, 3};
  r.max_tokens = 50;
  r.id = 42;
  auto q = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, r);
  f.sched.run();
  f.self->send(f.manager, cancel_atom_v, uint64_t{42}, false);
  f.sched.run();
  std::move(q).receive([](infer_reply&) { FAIL("a cancelled request was served"); },
                       [](caf::error& e) { CHECK(is(e, ec::cancelled)); });
}

TEST_CASE("a failed registration stays listed with its reason until registered again",
          "[actors][manager][control]") {
  manager_fixture f;
  f.script.failing_prepare.insert("broken");
  model_config b;
  b.name = "broken";
  b.kind = "toy";
  b.devices = {0};
  auto first = f.ask<model_info>(f.registry, register_atom_v, b);
  REQUIRE_FALSE(first);
  CHECK(is(first.error(), ec::io_error));  // the worker's code, not re-wrapped
  auto listed = f.ask<std::vector<model_info>>(f.manager, list_atom_v);
  REQUIRE(listed);
  REQUIRE(listed->size() == 2);
  CHECK(listed->at(0).config.name == "broken");
  CHECK(listed->at(0).state == model_lifecycle::failed);
  CHECK_THAT(listed->at(0).reason, Catch::Contains("injected: cannot read the weights"));
  auto info = f.ask<model_info>(f.manager, info_atom_v, std::string{"broken"});
  REQUIRE(info);
  CHECK(info->state == model_lifecycle::failed);
  // Requests and loads of it say why, with a code that maps to 503, not 404.
  infer_request r;
  r.model = "broken";
  r.tokens = {1};
  auto served = f.ask<infer_reply>(f.manager, infer_atom_v, r);
  REQUIRE_FALSE(served);
  CHECK(is(served.error(), ec::unavailable));
  CHECK_THAT(render(served.error()), Catch::Contains("failed to register: io_error"));
  CHECK(is(f.ask<model_info>(f.manager, load_atom_v, std::string{"broken"}).error(),
           ec::unavailable));
  // Fixed, it registers and is served; the failure is gone from the list.
  f.script.failing_prepare.clear();
  auto second = f.ask<model_info>(f.registry, register_atom_v, b);
  REQUIRE(second);
  CHECK(second->state == model_lifecycle::offloaded);
  CHECK(second->reason.empty());
  r.max_tokens = 1;
  auto fut = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, r);
  f.sched.run();
  f.sched.advance_time(6ms);
  f.sched.run();
  REQUIRE(f.replied());
  std::move(fut).receive([](infer_reply& x) { CHECK(x.tokens.size() == 1); },
                         [](caf::error& e) { FAIL(render(e)); });
  // A failed registration that is unregistered is gone.
  f.script.failing_prepare.insert("other");
  b.name = "other";
  REQUIRE_FALSE(f.ask<model_info>(f.registry, register_atom_v, b));
  auto gone = f.ask<model_info>(f.registry, unregister_atom_v, std::string{"other"});
  REQUIRE(gone);
  CHECK(gone->state == model_lifecycle::unregistered);
  CHECK(is(f.ask<model_info>(f.manager, info_atom_v, std::string{"other"}).error(),
           ec::unknown_model));
  // A config the manager refuses is listed too.
  model_config bad;
  bad.name = "bad";
  bad.kind = "toy";
  bad.devices = {7};
  REQUIRE_FALSE(f.ask<model_info>(f.registry, register_atom_v, bad));
  auto bad_info = f.ask<model_info>(f.manager, info_atom_v, std::string{"bad"});
  REQUIRE(bad_info);
  CHECK(bad_info->state == model_lifecycle::failed);
  CHECK_FALSE(bad_info->reason.empty());
}

TEST_CASE("a model's description needs no swap scheduler, its info does", "[actors][manager]") {
  // The text routes find a model's tokenizer through describe: a scheduler that is busy,
  // distant or gone must not hold that up. Here it is gone.
  manager_fixture f;
  auto fe = spawn_frontend(f.sys, caf::actor_cast<serving_actor>(f.manager), {}).value();
  caf::anon_send_exit(f.scheduler, caf::exit_reason::user_shutdown);
  f.sched.run();
  auto info = f.ask<model_info>(f.manager, info_atom_v, std::string{"m"});
  CHECK_FALSE(info);
  for (auto via : {caf::actor_cast<serving_actor>(f.manager), fe}) {
    auto d = f.ask<model_info>(via, describe_atom_v, std::string{"m"});
    REQUIRE(d);
    CHECK(d->config.name == "m");
    CHECK(d->state == model_lifecycle::unknown);
    CHECK(is(f.ask<model_info>(via, describe_atom_v, std::string{"nope"}).error(),
             ec::unknown_model));
  }
  // A name the manager lists (here a failed registration) is described as listed.
  model_config b;
  b.name = "broken";
  b.kind = "toy";
  b.devices = {0};
  f.script.failing_prepare.insert("broken");
  f.ask<model_info>(f.registry, register_atom_v, b);
  auto broken = f.ask<model_info>(f.manager, describe_atom_v, std::string{"broken"});
  REQUIRE(broken);
  CHECK(broken->state == model_lifecycle::failed);
  caf::anon_send_exit(fe, caf::exit_reason::user_shutdown);
}

TEST_CASE("unregister evicts, frees every worker's shard and frees the name",
          "[actors][manager][control]") {
  manager_fixture f;
  auto loaded = f.ask<model_info>(f.manager, load_atom_v, std::string{"m"});
  REQUIRE(loaded);
  CHECK(loaded->state == model_lifecycle::resident);
  auto gone = f.ask<model_info>(f.registry, unregister_atom_v, std::string{"m"});
  REQUIRE(gone);
  CHECK(gone->state == model_lifecycle::unregistered);
  CHECK(f.script.evictions["m"] == 1);
  CHECK(f.script.unregistered["m"] == 1);
  CHECK(is(f.ask<model_info>(f.manager, info_atom_v, std::string{"m"}).error(), ec::unknown_model));
  auto listed = f.ask<std::vector<model_info>>(f.manager, list_atom_v);
  REQUIRE(listed);
  CHECK(listed->empty());
  // The scheduler forgot it too: it lists no residency and takes the name back, even
  // with another placement.
  auto status = f.ask<std::vector<residency_report>>(f.scheduler, status_atom_v);
  REQUIRE(status);
  CHECK(status->empty());
  model_config again;
  again.name = "m";
  again.kind = "toy";
  again.devices = {0};
  again.toy_shard_bytes = 2 << 20;
  auto back = f.ask<model_info>(f.registry, register_atom_v, again);
  REQUIRE(back);
  auto out = f.send();
  f.sched.run();
  f.sched.advance_time(6ms);
  f.sched.run();
  REQUIRE(f.replied());
  std::move(out).receive([](infer_reply& x) { CHECK(x.tokens.size() == 1); },
                         [](caf::error& e) { FAIL(render(e)); });
  CHECK(is(f.ask<model_info>(f.registry, unregister_atom_v, std::string{"nope"}).error(),
           ec::unknown_model));
}

TEST_CASE("unregister is refused while requests of the model are in flight",
          "[actors][manager][control]") {
  manager_fixture f{false};
  f.script.hanging.insert("m");
  auto pending = f.send();
  f.sched.run();
  f.sched.advance_time(6ms);
  f.sched.run();
  CHECK_FALSE(f.replied());  // its load hangs
  auto refused = f.ask<model_info>(f.registry, unregister_atom_v, std::string{"m"});
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::invalid_state));
  CHECK_THAT(render(refused.error()), Catch::Contains("batches running"));
  CHECK(f.script.unregistered["m"] == 0);
  // Released, the request is served; afterwards the model can go.
  caf::anon_send(f.script.holder, caf::ok_atom_v);
  f.sched.run();
  REQUIRE(f.replied());
  std::move(pending).receive([](infer_reply&) {}, [](caf::error& e) { FAIL(render(e)); });
  CHECK(f.ask<model_info>(f.registry, unregister_atom_v, std::string{"m"}));
}

namespace {

/// Asks the frontend for completions and notes any answer. Tests make it exit before
/// the answers, as the HTTP server makes the actor serving a request exit when its
/// client goes away.
caf::behavior requester(caf::event_based_actor* self, frontend_actor fe,
                        std::vector<infer_request> rs, int* answers) {
  for (auto& r : rs)
    self->request(fe, caf::timespan{24h}, infer_atom_v, r)
        .then([=](infer_reply&) { ++*answers; }, [=](caf::error&) { ++*answers; });
  return {[](caf::ok_atom) {}};
}

}  // namespace

TEST_CASE("the frontend cancels the requests of a requester that ends before its answers",
          "[actors][frontend]") {
  manager_fixture f;
  auto fe = spawn_frontend(f.sys, caf::actor_cast<serving_actor>(f.manager), {}).value();
  auto outstanding = [&] {
    auto s = f.ask<caf::settings>(fe, report_atom_v);
    REQUIRE(s);
    return caf::get_or(*s, "frontend.outstanding", int64_t{-1});
  };
  infer_request r;
  r.model = "m";
  r.tokens = {1, 2, 3};
  r.max_tokens = 1;
  int answers = 0;
  // Two requests wait in the manager's queue (its 5 ms window has not passed).
  auto gone = f.sys.spawn(requester, fe, std::vector<infer_request>{r, r}, &answers);
  f.sched.run();
  CHECK(outstanding() == 2);
  caf::anon_send_exit(gone, caf::exit_reason::user_shutdown);
  f.sched.run();
  // Both left the queue at once: admission counts them no more, and no step ran.
  CHECK(outstanding() == 0);
  f.sched.advance_time(10ms);
  f.sched.run();
  CHECK(f.script.step_rows.empty());
  CHECK(answers == 0);

  // A requester that stays is served; once answered, its end cancels nothing.
  auto stays = f.sys.spawn(requester, fe, std::vector<infer_request>{r}, &answers);
  f.sched.run();
  f.sched.advance_time(6ms);
  f.sched.run();
  CHECK(answers == 1);
  CHECK(f.script.step_rows == std::vector<size_t>{1});
  caf::anon_send_exit(stays, caf::exit_reason::user_shutdown);
  f.sched.run();
  CHECK(outstanding() == 0);

  // The frontend passes a cancel by id on to its backend: a queued request fails.
  auto queued = f.self->request(fe, caf::timespan{24h}, infer_atom_v, r);
  f.sched.run();
  CHECK(outstanding() == 1);
  f.self->send(fe, cancel_atom_v, uint64_t{4}, false);  // ids 1..3 went above
  f.sched.run();
  std::move(queued).receive([](infer_reply&) { FAIL("a cancelled request was served"); },
                            [](caf::error& e) { CHECK(is(e, ec::cancelled)); });
  CHECK(outstanding() == 0);
  caf::anon_send_exit(fe, caf::exit_reason::user_shutdown);
}

TEST_CASE("a model larger than its device is refused at registration, before any host copy",
          "[actors][manager]") {
  manager_fixture f;  // one device of 100 MiB
  model_config big;
  big.name = "big";
  big.kind = "toy";
  big.devices = {0};
  big.toy_shard_bytes = 150ull << 20;
  auto refused = f.ask<model_info>(f.registry, register_atom_v, big);
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::out_of_device_memory));
  CHECK_THAT(render(refused.error()),
             Catch::Contains("model big needs 150.0 MiB on device 0, which holds 100.0 MiB"));
  CHECK(f.script.prepares["big"] == 0);  // no host memory was filled for it
  // Listed as failed with the sizes; its requests say why, and retrying cannot help.
  auto info = f.ask<model_info>(f.manager, info_atom_v, std::string{"big"});
  REQUIRE(info);
  CHECK(info->state == model_lifecycle::failed);
  CHECK_THAT(info->reason, Catch::Contains("needs 150.0 MiB on device 0"));
  infer_request r;
  r.model = "big";
  r.tokens = {1};
  auto served = f.ask<infer_reply>(f.manager, infer_atom_v, r);
  REQUIRE_FALSE(served);
  CHECK(is(served.error(), ec::out_of_device_memory));
  CHECK_THAT(render(served.error()), Catch::Contains("which holds 100.0 MiB"));
  // One that fits registers as before.
  big.toy_shard_bytes = 50ull << 20;
  REQUIRE(f.ask<model_info>(f.registry, register_atom_v, big));
  CHECK(f.script.prepares["big"] == 1);
}

TEST_CASE("the workers' KV block tables follow the plans through a join and the rows' ends",
          "[actors][manager][continuous][kv]") {
  manager_fixture f;
  // a's 15-token prompt fills one block, and its second decode step needs another.
  auto a_req = long_and_short(6);
  a_req.tokens.assign(15, 1);
  auto a = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, a_req);
  f.sched.run();
  f.sched.advance_time(6ms);
  f.run_steps(2);
  // b (31 tokens) joins: two blocks at its prefill, a third for its 33rd position.
  auto b_req = long_and_short(3);
  b_req.tokens.assign(31, 2);
  auto b = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, b_req);
  f.settle();
  infer_reply ra, rb;
  std::move(a).receive([&](infer_reply& r) { ra = r; }, [](caf::error& e) { FAIL(render(e)); });
  std::move(b).receive([&](infer_reply& r) { rb = r; }, [](caf::error& e) { FAIL(render(e)); });
  // Each stand-in worker checked every step as a runner does: no row short of blocks, no
  // block named twice. Nothing is held after the batch.
  CHECK(ra.tokens == std::vector<int64_t>{7, 8, 9, 10, 11, 12});
  CHECK(rb.tokens == std::vector<int64_t>{7, 8, 9});
  CHECK(rb.batch_size == 2);
  REQUIRE_FALSE(f.script.rows.empty());
  for (auto& [shard, rows] : f.script.rows) {
    CHECK(rows.batches() == 0);
    CHECK(rows.blocks_held() == 0);
  }
}
