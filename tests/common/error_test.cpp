#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/sec.hpp>

#include "common/error.hpp"

using namespace computron;

TEST_CASE("computron errors render with their code and context", "[error]") {
  auto e = make_error(ec::out_of_device_memory, "4096 bytes requested on cuda:0");
  CHECK(render(e) == "out_of_device_memory: 4096 bytes requested on cuda:0");
  CHECK(render(make_error(ec::unknown_model)) == "unknown_model");
  CHECK(is(e, ec::out_of_device_memory));
  CHECK_FALSE(is(e, ec::device_error));
  CHECK_FALSE(is(caf::error{}, ec::device_error));
  CHECK(render(caf::error{}) == "no error");
}

TEST_CASE("CAF's own errors render through CAF", "[error]") {
  caf::error e = caf::sec::request_timeout;
  CHECK_FALSE(is(e, ec::deadline_exceeded));
  CHECK_THAT(render(e), Catch::Contains("request_timeout"));
}

TEST_CASE("context added to CAF's errors keeps their code and reads as ours do", "[error]") {
  caf::error e = caf::sec::request_timeout;
  auto once = with_context(e, "model a step 0");
  CHECK(once == caf::sec::request_timeout);
  CHECK(render(once) == "request_timeout: model a step 0");
  auto twice = with_context(once, "batch 3");
  CHECK(twice == caf::sec::request_timeout);
  CHECK(render(twice) == "request_timeout: batch 3: model a step 0");
}

TEST_CASE("an actor system renders registered computron errors", "[error]") {
  caf::actor_system_config cfg;
  register_errors(cfg);
  caf::actor_system sys{cfg};
  auto e = make_error(ec::overloaded, "queue of opt-13b is full (64)");
  CHECK(sys.render(e) == "overloaded: queue of opt-13b is full (64)");
}

TEST_CASE("every error code has a distinct name", "[error]") {
  std::set<std::string> names;
  for (int i = 0; i <= static_cast<int>(ec::cancelled); ++i)
    names.insert(to_string(static_cast<ec>(i)));
  CHECK(names.size() == static_cast<size_t>(ec::cancelled) + 1);
  CHECK(names.count("unknown_error_code") == 0);
}

TEST_CASE("context added to an error keeps its code", "[error]") {
  auto e = with_context(make_error(ec::io_error, "cannot read vocab.json"), "model m");
  CHECK(is(e, ec::io_error));
  CHECK(render(e) == "io_error: model m: cannot read vocab.json");
  CHECK(render(with_context(make_error(ec::unavailable), "model m")) == "unavailable: model m");
  CHECK_FALSE(with_context(caf::error{}, "nothing"));
}
