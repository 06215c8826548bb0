// Replies awaited without CAF request timeouts (actors/reply_waits.hpp): one tick at the
// earliest deadline, expiry exactly once, late replies dropped. Plain state and given
// times: no clock is read and nothing sleeps.
#include <catch2/catch.hpp>

#include "actors/reply_waits.hpp"

using namespace computron::actors;
using namespace std::chrono_literals;

namespace {

struct counted {
  std::shared_ptr<reply_wait> w = std::make_shared<reply_wait>();
  std::shared_ptr<int> expired = std::make_shared<int>(0);
  explicit counted(wait_clock::time_point deadline) {
    w->deadline = deadline;
    w->expire = [e = expired] { ++*e; };
  }
};

}  // namespace

TEST_CASE("a wait asks for one tick at the earliest deadline", "[actors][reply_waits]") {
  reply_waits ws;
  const auto t0 = wait_clock::time_point{} + 1h;
  counted a{t0 + 120s}, b{t0 + 150s}, c{t0 + 60s};
  // The first wait: a tick at its deadline, rounded up to whole microseconds.
  auto in = ws.watch(a.w, t0 + 1ns);
  REQUIRE(in);
  CHECK(*in == std::chrono::microseconds{120'000'000});
  // A later deadline: the tick already asked for comes first.
  CHECK_FALSE(ws.watch(b.w, t0 + 1s));
  // An earlier one: a tick of its own.
  in = ws.watch(c.w, t0 + 2s);
  REQUIRE(in);
  CHECK(*in == std::chrono::microseconds{58'000'000});
  // A tick before any deadline (another timer's) expires nothing and asks for nothing.
  CHECK_FALSE(ws.tick(t0 + 30s));
  CHECK(*a.expired + *b.expired + *c.expired == 0);
  // c's tick: c expires once; a is next.
  in = ws.tick(t0 + 60s);
  CHECK(*c.expired == 1);
  CHECK(c.w->given_up);
  REQUIRE(in);
  CHECK(*in == std::chrono::microseconds{60'000'000});
  // Its reply, late, is dropped; a's reply in time is taken once.
  CHECK_FALSE(c.w->answer());
  CHECK(a.w->answer());
  CHECK_FALSE(a.w->answer());
  // a's tick comes: a answered, so nothing expires and b's deadline is next.
  in = ws.tick(t0 + 120s);
  CHECK(*a.expired == 0);
  REQUIRE(in);
  CHECK(*in == std::chrono::microseconds{30'000'000});
  // Past every deadline: b expires, and no tick is wanted any more.
  CHECK_FALSE(ws.tick(t0 + 200s));
  CHECK(*b.expired == 1);
  CHECK(ws.size() == 0);
  // Ticks once more: nothing runs twice.
  CHECK_FALSE(ws.tick(t0 + 300s));
  CHECK(*b.expired + *c.expired == 2);
}

TEST_CASE("a tick a hair before its deadline still leads to the deadline's tick",
          "[actors][reply_waits]") {
  reply_waits ws;
  const auto t0 = wait_clock::time_point{} + 1h;
  counted a{t0 + 10ms};
  REQUIRE(ws.watch(a.w, t0));
  // The timer fired 500 us early: nothing is due yet, so another tick is asked for
  // (without one, the wait would never expire).
  auto in = ws.tick(t0 + 10ms - 500us);
  CHECK(*a.expired == 0);
  REQUIRE(in);
  CHECK(*in == 500us);
  CHECK_FALSE(ws.tick(t0 + 10ms));
  CHECK(*a.expired == 1);
}

TEST_CASE("answered waits do not pile up between ticks", "[actors][reply_waits]") {
  reply_waits ws;
  const auto t0 = wait_clock::time_point{} + 1h;
  // A decode loop: thousands of steps answered long before their two-minute deadline.
  std::vector<counted> kept;
  for (int i = 0; i < 5000; ++i) {
    counted s{t0 + 120s + std::chrono::milliseconds(i)};
    ws.watch(s.w, t0 + std::chrono::milliseconds(i));
    CHECK(s.w->answer());
    if (i == 4999) kept.push_back(s);
  }
  CHECK(ws.size() <= 65);
  CHECK_FALSE(ws.tick(t0 + 1h));
  CHECK(*kept[0].expired == 0);
  CHECK(ws.size() == 0);
}

TEST_CASE("an expiry that starts another wait gets that wait its tick", "[actors][reply_waits]") {
  // A failed step's batch may start another (a retry, the next batch of the model).
  reply_waits ws;
  const auto t0 = wait_clock::time_point{} + 1h;
  counted next{t0 + 15s};
  std::optional<std::chrono::microseconds> asked;
  auto first = std::make_shared<reply_wait>();
  first->deadline = t0 + 10s;
  first->expire = [&] { asked = ws.watch(next.w, t0 + 10s); };
  REQUIRE(ws.watch(first, t0));
  // The expiry asked for the new wait's tick itself; the tick asks for none more.
  CHECK_FALSE(ws.tick(t0 + 10s));
  REQUIRE(asked);
  CHECK(*asked == std::chrono::microseconds{5'000'000});
  CHECK(first->expire == nullptr);  // what it held is let go
  CHECK_FALSE(ws.tick(t0 + 15s));
  CHECK(*next.expired == 1);
}
