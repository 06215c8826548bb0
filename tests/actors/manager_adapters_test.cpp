// Requests that name LoRA adapters, under CAF's test coordinator: they wait in their base's
// queue, run in the base's batches with their adapter per row, and their batch holds the
// adapters' leases from their first step to its end. The forward with adapters is
// opt_engine_test's and lora_forward_test's; the ledger's rules adapter_residency_test's.
#include <catch2/catch.hpp>

#include "tests/actors/manager_fixture.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;
using computron::testing::manager_fixture;

namespace {

void register_adapter(manager_fixture& f, const std::string& name) {
  model_config a;
  a.name = name;
  a.base = "m";
  a.toy_shard_bytes = 4096;
  REQUIRE(f.ask<model_info>(f.registry, register_atom_v, a));
}

infer_request request(const std::string& model, int64_t max_tokens = 1) {
  infer_request r;
  r.model = model;
  r.tokens = {1, 2, 3};
  r.max_tokens = max_tokens;
  return r;
}

uint32_t leases(manager_fixture& f, const std::string& model) {
  auto rs = f.ask<std::vector<residency_report>>(f.scheduler, status_atom_v);
  REQUIRE(rs);
  for (auto& r : *rs)
    if (r.model == model) return r.leases;
  FAIL("no residency report of " << model);
  return 0;
}

template <class Handle>
infer_reply ok(Handle& h) {
  infer_reply got;
  std::move(h).receive([&](infer_reply& r) { got = std::move(r); },
                       [](caf::error& e) { FAIL(render(e)); });
  return got;
}

template <class Handle>
caf::error failed(Handle& h) {
  caf::error got;
  std::move(h).receive([](infer_reply& r) { FAIL("served " << r.model); },
                       [&](caf::error& e) { got = std::move(e); });
  return got;
}

}  // namespace

TEST_CASE("requests naming LoRA adapters run in their base's batch, each row with its adapter",
          "[actors][manager][adapters]") {
  manager_fixture f;
  register_adapter(f, "a1");
  register_adapter(f, "a2");
  auto base = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("m"));
  auto one = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("a1"));
  // SGLang's form: the base, a colon, the adapter.
  auto two = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("m:a2"));
  f.settle();
  // Each answers under its adapter's name, from one batch of the base.
  CHECK(ok(base).model == "m");
  auto r1 = ok(one);
  CHECK(r1.model == "a1");
  CHECK(r1.batch_size == 3);
  CHECK(ok(two).model == "a2");
  REQUIRE(f.script.adapters.size() == 1);
  CHECK(f.script.adapters[0] == std::vector<std::string>{"", "a1", "a2"});
  // The adapters were loaded beside their base, and every lease went back with the batch.
  CHECK(f.script.begins["a1"] + f.script.loads["a1"] >= 1);
  CHECK(f.script.begins["a2"] + f.script.loads["a2"] >= 1);
  for (auto m : {"m", "a1", "a2"}) CHECK(leases(f, m) == 0);
  // Requests per adapter are counted under its name.
  auto a1 = f.ask<model_info>(f.manager, describe_atom_v, std::string{"a1"});
  REQUIRE(a1);
  CHECK(a1->served == 1);
  auto described = f.ask<model_info>(f.manager, describe_atom_v, std::string{"m:a2"});
  REQUIRE(described);
  CHECK(described->config.name == "a2");
  // A batch of the base alone names no adapters.
  auto alone = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("m"));
  f.settle();
  CHECK(ok(alone).model == "m");
  REQUIRE(f.script.adapters.size() == 2);
  CHECK(f.script.adapters[1].empty());
  // An adapter under another base's name, or none at all: unknown, and the rest serves.
  for (auto name : {"other:a1", "m:nope", "nope"}) {
    INFO(name);
    auto bad = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request(name));
    f.settle();
    CHECK(is(failed(bad), ec::unknown_model));
  }
}

TEST_CASE("a row joins a running batch with an adapter the batch did not hold, leased first",
          "[actors][manager][adapters][continuous]") {
  manager_fixture f;
  register_adapter(f, "a1");
  auto running = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("m", 6));
  f.sched.run();
  f.sched.advance_time(6ms);
  f.run_steps(2);
  auto joining = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("a1", 2));
  f.settle();
  CHECK(ok(running).tokens.size() == 6);
  auto j = ok(joining);
  CHECK(j.model == "a1");
  CHECK(j.tokens == std::vector<int64_t>{7, 8});
  // Its prefill joined the batch naming its adapter; no other step named one.
  size_t named = 0;
  for (size_t k = 0; k < f.script.adapters.size(); ++k)
    if (!f.script.adapters[k].empty()) {
      ++named;
      CHECK(f.script.adapters[k] == std::vector<std::string>{"a1"});
      CHECK(f.script.joins[k] != 0);
    }
  CHECK(named == 1);
  CHECK(leases(f, "a1") == 0);
  CHECK(leases(f, "m") == 0);
}

TEST_CASE("a row whose adapter cannot be loaded fails alone, naming it, and its batch runs",
          "[actors][manager][adapters]") {
  manager_fixture f;
  register_adapter(f, "a1");
  f.script.failing_begin.insert("a1");
  f.script.failing_begin_error = ec::device_error;
  f.script.failing.insert("a1");
  auto base = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("m"));
  auto one = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("a1"));
  f.settle();
  auto e = failed(one);
  CHECK(is(e, ec::device_error));
  CHECK_THAT(render(e), Catch::Contains("LoRA adapter a1"));
  auto r = ok(base);
  CHECK(r.tokens.size() == 1);
  REQUIRE(f.script.adapters.size() == 1);
  CHECK(f.script.adapters[0].empty());
  CHECK(leases(f, "m") == 0);
  // Alone in its batch: the batch never runs, and its base's lease goes back too.
  auto again = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("a1"));
  f.settle();
  CHECK(is(failed(again), ec::device_error));
  CHECK(leases(f, "m") == 0);
  f.script.failing_begin.clear();
  f.script.failing.clear();
  auto later = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, request("a1"));
  f.settle();
  CHECK(ok(later).model == "a1");
}

TEST_CASE("an adapter that finds no room in time fails its rows, and its late lease goes back",
          "[actors][manager][adapters]") {
  // Leases once loaded, and a1's load hangs: the batch waits for a1 beside its base's lease
  // for the start's bound (30 s), then runs without a1's row, which fails as unavailable.
  manager_fixture f{false};
  register_adapter(f, "a1");
  f.script.hanging.insert("a1");
  // Deadlines past the wait (the fixture's default is 1 s).
  auto patient = [](std::string model) {
    auto r = request(std::move(model));
    r.deadline_ms = 120000;
    return r;
  };
  auto base = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, patient("m"));
  auto one = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, patient("a1"));
  f.settle();
  CHECK_FALSE(f.replied());
  f.sched.advance_time(31s);
  f.sched.run();
  auto e = failed(one);
  CHECK(is(e, ec::unavailable));
  CHECK_THAT(render(e), Catch::Contains("LoRA adapter a1 found no room"));
  CHECK(ok(base).tokens.size() == 1);
  // The load ends after the manager gave up: the lease it is granted goes straight back,
  // so the adapter and its base may be evicted again.
  f.self->send(f.script.holder, caf::ok_atom_v);
  f.sched.run();
  CHECK(leases(f, "a1") == 0);
  CHECK(leases(f, "m") == 0);
  REQUIRE(f.ask<model_info>(f.manager, unload_atom_v, std::string{"m"}));
}
