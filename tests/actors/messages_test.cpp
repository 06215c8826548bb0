// The model configuration's one field list: every field crosses a node boundary (CAF's
// binary serialization, as the middleman sends it), and a worker's "same shard" test
// compares exactly the fields that decide a shard's bytes.
#include <catch2/catch.hpp>

#include <functional>

#include <caf/actor_system.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/message.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/settings.hpp>

#include "actors/interfaces.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"

using namespace computron;
using namespace computron::actors;

namespace {

model_config every_field_set() {
  model_config m;
  m.name = "m";
  m.kind = "llama";
  m.spec = "llama-tiny";
  m.shape = {1, 2, 3, 4, 5, 6};
  m.arch = R"({"hidden": 64})";
  m.dtype = "f32";
  m.checkpoint_dtype = "bf16";
  m.tp = 2;
  m.pp = 3;
  m.devices = {5, 4, 3, 2, 1, 0};
  m.seed = 77;
  m.weights_path = "/w";
  m.toy_shard_bytes = 12345;
  m.toy_compute_ms = 2.5;
  m.pinned = true;
  m.priority = -3;
  m.tokenizer = "bytes";
  m.base = "b";
  return m;
}

}  // namespace

TEST_CASE("every model_config field crosses a node boundary", "[actors][messages]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  auto m = every_field_set();
  std::vector<char> buf;
  caf::binary_serializer out{sys, buf};
  REQUIRE_FALSE(out(m));
  model_config back;
  caf::binary_deserializer in{sys, buf};
  REQUIRE_FALSE(in(back));
  CHECK(fields(back) == fields(m));
  CHECK(back.tokenizer == "bytes");
  CHECK(back.checkpoint_dtype == "bf16");
}

TEST_CASE("a node's workers cross a node boundary as typed handles", "[actors][messages]") {
  // The controller asks a node for its workers (workers_atom) and rebinds its guards to
  // them (rebind_atom): the reply is a vector of typed handles, which CAF 0.17 serializes
  // only under a registered name (system_config adds the computron_handles block).
  system_config cfg;
  caf::actor_system sys{cfg};
  auto dummy = sys.spawn([]() -> caf::behavior { return {[](int32_t) {}}; });
  std::vector<shard_worker_actor> ws{caf::actor_cast<shard_worker_actor>(dummy),
                                     shard_worker_actor{}};
  auto msg = caf::make_message(ws);
  std::vector<char> buf;
  caf::binary_serializer out{sys, buf};
  REQUIRE_FALSE(out(msg));
  caf::message back;
  caf::binary_deserializer in{sys, buf};
  REQUIRE_FALSE(in(back));
  REQUIRE(back.match_elements<std::vector<shard_worker_actor>>());
  auto& got = back.get_as<std::vector<shard_worker_actor>>(0);
  REQUIRE(got.size() == 2);
  CHECK(got[0] == ws[0]);
  CHECK_FALSE(got[1]);
  caf::anon_send_exit(dummy, caf::exit_reason::user_shutdown);
}

TEST_CASE("same_weights compares the fields that decide a shard's bytes, and only those",
          "[actors][messages]") {
  const auto m = every_field_set();
  // Serving settings may change under a prepared shard.
  auto serving = m;
  serving.name = "other";
  serving.pinned = false;
  serving.priority = 9;
  serving.tokenizer = "/t";
  CHECK(same_weights(m, serving));
  // Each field that shapes the weights makes it another shard.
  std::vector<std::function<void(model_config&)>> changes = {
      [](model_config& c) { c.kind = "opt"; },
      [](model_config& c) { c.spec = "llama-mini"; },
      [](model_config& c) { c.shape.back() = 7; },
      [](model_config& c) { c.arch = "{}"; },
      [](model_config& c) { c.dtype = "bf16"; },
      [](model_config& c) { c.checkpoint_dtype = "f16"; },
      [](model_config& c) { c.tp = 3; },
      [](model_config& c) { c.pp = 2; },
      [](model_config& c) { c.devices[0] = 9; },
      [](model_config& c) { c.seed = 78; },
      [](model_config& c) { c.weights_path = "/v"; },
      [](model_config& c) { c.toy_shard_bytes = 1; },
      [](model_config& c) { c.toy_compute_ms = 3; },
      [](model_config& c) { c.base = "other-base"; },
  };
  size_t weights_fields = 0;
  for (auto& f : model_config_fields) weights_fields += f.shapes_weights ? 1 : 0;
  CHECK(changes.size() == weights_fields);
  for (size_t i = 0; i < changes.size(); ++i) {
    auto c = m;
    changes[i](c);
    INFO("change " << i);
    CHECK_FALSE(same_weights(m, c));
  }
}

TEST_CASE(
    "every process's scheduler waits for work on its condition variable, not in 50 us "
    "sleeps",
    "[actors][messages]") {
  // The prompt default (actors/node.hpp) skips CAF's sleeping polls, whose sleeps a message
  // from a lane's thread waits out; the actor system's workers read these keys at start.
  auto moderate = [](const caf::actor_system_config& c) {
    return caf::get_or(c, "work-stealing.moderate-poll-attempts", size_t{999999});
  };
  auto relaxed = [](const caf::actor_system_config& c) {
    return caf::get_or(c, "work-stealing.relaxed-sleep-duration", caf::timespan{0});
  };
  system_config prompt;
  CHECK(moderate(prompt) == 0);
  CHECK(relaxed(prompt) == caf::timespan{std::chrono::milliseconds(1)});
  // CAF's own, for comparisons (computron bench runtime --caf-polling): nothing set.
  system_config own{idle_polling::caf};
  CHECK(moderate(own) == 999999);
  CHECK(relaxed(own) == caf::timespan{0});
  // A system starts and answers with the prompt settings.
  caf::actor_system sys{prompt};
  auto echo = sys.spawn([]() -> caf::behavior { return {[](int32_t x) { return x + 1; }}; });
  caf::scoped_actor self{sys};
  int32_t got = 0;
  self->request(echo, std::chrono::seconds(10), int32_t{41})
      .receive([&](int32_t x) { got = x; }, [](caf::error&) {});
  CHECK(got == 42);
}
