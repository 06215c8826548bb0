// The registry under CAF's test coordinator: it owns the lifecycle (registration,
// unregistration, a node's loss and return) and the manager serves what it hands over.
#include <catch2/catch.hpp>

#include "tests/actors/manager_fixture.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;
using computron::testing::manager_fixture;

namespace {

infer_reply served(manager_fixture& f) {
  auto out = f.send();
  f.settle();
  REQUIRE(f.replied());
  infer_reply got;
  std::move(out).receive([&](infer_reply& x) { got = std::move(x); },
                         [](caf::error& e) { FAIL(render(e)); });
  return got;
}

}  // namespace

TEST_CASE("a node's loss and return reach the scheduler through the registry",
          "[actors][registry]") {
  manager_fixture f;
  f.self->send(f.registry, lost_atom_v, std::vector<int32_t>{0});
  f.sched.run();
  auto lost = f.ask<model_info>(f.manager, info_atom_v, std::string{"m"});
  REQUIRE(lost);
  CHECK(lost->state == model_lifecycle::unavailable);
  auto refused = f.send();
  f.settle();
  REQUIRE(f.replied());
  std::move(refused).receive([](infer_reply&) { FAIL("served on a lost device"); },
                             [](caf::error& e) { CHECK(is(e, ec::unavailable)); });
  f.self->send(f.registry, found_atom_v, std::vector<int32_t>{0});
  f.sched.run();
  auto back = f.ask<model_info>(f.manager, info_atom_v, std::string{"m"});
  REQUIRE(back);
  CHECK(back->state == model_lifecycle::offloaded);
  CHECK(served(f).tokens.size() == 1);
}

TEST_CASE("an unregistration that fails leaves the model served", "[actors][registry]") {
  manager_fixture f;
  REQUIRE(f.ask<model_info>(f.manager, load_atom_v, std::string{"m"}));
  f.script.failing_evict.insert("m");
  auto refused = f.ask<model_info>(f.registry, unregister_atom_v, std::string{"m"});
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::device_error));
  CHECK_THAT(render(refused.error()), Catch::Contains("unregistering m"));
  CHECK(f.script.unregistered["m"] == 0);
  // The manager admits its requests again, and the registry still has it.
  auto info = f.ask<model_info>(f.manager, info_atom_v, std::string{"m"});
  REQUIRE(info);
  CHECK(info->state == model_lifecycle::resident);
  CHECK(served(f).tokens.size() == 1);
  model_config again;
  again.name = "m";
  again.kind = "toy";
  again.devices = {0};
  auto twice = f.ask<model_info>(f.registry, register_atom_v, again);
  REQUIRE_FALSE(twice);
  CHECK_THAT(render(twice.error()), Catch::Contains("already registered"));
  // Once the device lets go, the unregistration goes through.
  f.script.failing_evict.clear();
  auto gone = f.ask<model_info>(f.registry, unregister_atom_v, std::string{"m"});
  REQUIRE(gone);
  CHECK(gone->state == model_lifecycle::unregistered);
  CHECK(f.script.unregistered["m"] == 1);
}

TEST_CASE("the manager serves only what it was handed, once", "[actors][registry]") {
  manager_fixture f;
  model_config m;
  m.name = "m";
  m.kind = "toy";
  m.devices = {0};
  auto twice = f.ask<model_info>(f.manager, adopt_atom_v, m, uint64_t{1 << 20}, false);
  REQUIRE_FALSE(twice);
  CHECK(is(twice.error(), ec::invalid_state));
  model_config unknown = m;
  unknown.name = "u";
  unknown.kind = "nope";
  auto no_engine = f.ask<model_info>(f.manager, adopt_atom_v, unknown, uint64_t{1 << 20}, false);
  REQUIRE_FALSE(no_engine);
  CHECK_THAT(render(no_engine.error()), Catch::Contains("nope"));
  // What it is told of a name it cannot serve is what it lists and refuses with.
  model_info failed;
  failed.config.name = "f";
  failed.state = model_lifecycle::failed;
  failed.reason = "its folder has no config.json";
  f.self->send(f.manager, listed_atom_v, failed);
  f.sched.run();
  auto listed = f.ask<std::vector<model_info>>(f.manager, list_atom_v);
  REQUIRE(listed);
  REQUIRE(listed->size() == 2);
  CHECK(listed->at(0).config.name == "f");
  CHECK(listed->at(0).state == model_lifecycle::failed);
  infer_request r;
  r.model = "f";
  r.tokens = {1};
  r.max_tokens = 1;
  auto out = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, r);
  f.sched.run();
  std::move(out).receive([](infer_reply&) { FAIL("served a failed model"); },
                         [](caf::error& e) {
                           CHECK(is(e, ec::unavailable));
                           CHECK_THAT(render(e), Catch::Contains("no config.json"));
                         });
  // Retiring refuses new requests; resuming admits them again.
  REQUIRE(f.ask<model_info>(f.manager, retire_atom_v, std::string{"m"}, true));
  auto closed = f.send();
  f.sched.run();
  std::move(closed).receive(
      [](infer_reply&) { FAIL("served a retired model"); },
      [](caf::error& e) { CHECK_THAT(render(e), Catch::Contains("being unregistered")); });
  REQUIRE(f.ask<model_info>(f.manager, retire_atom_v, std::string{"m"}, false));
  CHECK(served(f).tokens.size() == 1);
}

TEST_CASE("a LoRA adapter registers beside its base, loads after it and goes with it",
          "[actors][registry][adapters]") {
  manager_fixture f;
  model_config a;
  a.name = "m-lora";
  a.base = "m";
  a.toy_shard_bytes = 4096;
  // Its base must be registered, whole, and it runs on the base's devices.
  auto orphan = a;
  orphan.base = "nope";
  auto refused = f.ask<model_info>(f.registry, register_atom_v, orphan);
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::unknown_model));
  CHECK_THAT(render(refused.error()), Catch::Contains("names base model nope"));
  auto elsewhere = a;
  elsewhere.devices = {1};
  refused = f.ask<model_info>(f.registry, register_atom_v, elsewhere);
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), ec::invalid_configuration));
  auto got = f.ask<model_info>(f.registry, register_atom_v, a);
  REQUIRE(got);
  // It took the base's kind and devices.
  CHECK(got->config.kind == "toy");
  CHECK(got->config.devices == std::vector<int32_t>{0});
  CHECK(got->config.base == "m");
  auto nested = a;
  nested.name = "m-lora-2";
  nested.base = "m-lora";
  refused = f.ask<model_info>(f.registry, register_atom_v, nested);
  REQUIRE_FALSE(refused);
  CHECK_THAT(render(refused.error()), Catch::Contains("an adapter itself"));
  // Loading the adapter loads its base first.
  auto loaded = f.ask<model_info>(f.manager, load_atom_v, std::string{"m-lora"});
  REQUIRE(loaded);
  CHECK(f.script.loads["m"] + f.script.begins["m"] >= 1);
  CHECK(f.script.loads["m-lora"] + f.script.begins["m-lora"] >= 1);
  auto base = f.ask<model_info>(f.manager, info_atom_v, std::string{"m"});
  REQUIRE(base);
  CHECK(base->state == model_lifecycle::resident);
  auto adapter = f.ask<model_info>(f.manager, info_atom_v, std::string{"m-lora"});
  REQUIRE(adapter);
  CHECK(adapter->state == model_lifecycle::resident);
  // A request names it, and runs in its base's batch.
  infer_request r;
  r.model = "m-lora";
  r.tokens = {1, 2, 3};
  auto yes = f.self->request(f.manager, caf::timespan{24h}, infer_atom_v, r);
  f.settle();
  std::move(yes).receive([](infer_reply& x) { CHECK(x.model == "m-lora"); },
                         [](caf::error& e) { FAIL(render(e)); });
  CHECK(served(f).tokens.size() == 1);
  // Evicting the base takes the adapter along.
  REQUIRE(f.ask<model_info>(f.manager, unload_atom_v, std::string{"m"}));
  CHECK(f.script.evictions["m-lora"] == 1);
  CHECK(f.script.evictions["m"] == 1);
  adapter = f.ask<model_info>(f.manager, info_atom_v, std::string{"m-lora"});
  REQUIRE(adapter);
  CHECK(adapter->state == model_lifecycle::offloaded);
  // The base cannot be unregistered under its adapter; the adapter, then the base, can.
  auto kept = f.ask<model_info>(f.registry, unregister_atom_v, std::string{"m"});
  REQUIRE_FALSE(kept);
  CHECK(is(kept.error(), ec::invalid_state));
  CHECK_THAT(render(kept.error()), Catch::Contains("base of adapters m-lora"));
  REQUIRE(f.ask<model_info>(f.registry, unregister_atom_v, std::string{"m-lora"}));
  REQUIRE(f.ask<model_info>(f.registry, unregister_atom_v, std::string{"m"}));
}
