#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

/// Replies awaited on a hot path without a CAF request timeout. CAF 0.17 hands every
/// request timeout to its timer thread, and every reply cancels it there: two wake-ups of
/// that thread per request, about a tenth of a decode step's host time on a small machine
/// (bench/RESULTS.md, issue 46's host share). Here the owner keeps the deadlines and sends
/// itself one tick at the earliest of them; each step then costs the timer thread nothing
/// while its deadline is minutes away.
namespace computron::actors {

using wait_clock = std::chrono::steady_clock;

/// One awaited reply: bounded by `deadline`. `expire` runs once if the reply did not come
/// by then; a reply after that is dropped (answer() says false).
struct reply_wait {
  wait_clock::time_point deadline{};
  bool answered = false;
  bool given_up = false;
  std::function<void()> expire;
  /// The reply came before its deadline: true once, false if the wait was given up.
  bool answer() {
    if (given_up || answered) return false;
    answered = true;
    expire = nullptr;  // what it holds (a join, a batch, a promise) need not wait for a tick
    return true;
  }
};

/// Gives up on the waits in `ws` whose deadline passed (their `expire` runs, after the
/// list is settled: an expiry may start more waits) and drops those answered.
inline void expire_waits(std::vector<std::shared_ptr<reply_wait>>& ws, wait_clock::time_point t) {
  std::vector<std::shared_ptr<reply_wait>> due;
  for (auto i = ws.begin(); i != ws.end();) {
    if ((*i)->answered) {
      i = ws.erase(i);
    } else if ((*i)->deadline <= t) {
      (*i)->given_up = true;
      due.push_back(*i);
      i = ws.erase(i);
    } else {
      ++i;
    }
  }
  for (auto& w : due) {
    auto f = std::move(w->expire);
    w->expire = nullptr;
    if (f) f();
  }
}

/// An actor's awaited replies and its one tick. Plain state: the owner passes the time and
/// sends itself a tick after the delay watch() or tick() returns, when they return one.
class reply_waits {
 public:
  /// Awaits `w`. A tick is due after the delay returned (none: one already comes in time).
  std::optional<std::chrono::microseconds> watch(std::shared_ptr<reply_wait> w,
                                                 wait_clock::time_point now) {
    // Answered waits leave at ticks; a long run of replies between two ticks (deadlines
    // are minutes away) must not collect them.
    if (waits_.size() >= 64)
      waits_.erase(std::remove_if(waits_.begin(), waits_.end(),
                                  [](auto& x) { return x->answered || x->given_up; }),
                   waits_.end());
    waits_.push_back(std::move(w));
    return next(now);
  }

  /// A tick came: the waits past their deadline expire. Returns the next tick's delay.
  std::optional<std::chrono::microseconds> tick(wait_clock::time_point now) {
    // The tick for `tick_at_` has come (or one after it): the next is due anew. A tick a
    // hair early counts as it (delays are rounded up; the slack only adds a tick).
    if (tick_at_ <= now + std::chrono::milliseconds(1)) tick_at_ = wait_clock::time_point::max();
    expire_waits(waits_, now);
    return next(now);
  }

  size_t size() const { return waits_.size(); }

 private:
  /// A tick at the earliest deadline of the waits, unless one comes no later.
  std::optional<std::chrono::microseconds> next(wait_clock::time_point now) {
    auto first = wait_clock::time_point::max();
    for (auto& w : waits_)
      if (!w->answered && !w->given_up) first = std::min(first, w->deadline);
    if (first == wait_clock::time_point::max() || first >= tick_at_) return std::nullopt;
    tick_at_ = first;
    // Rounded up: a tick that came a hair early would find nothing due and wait for none.
    return std::max(std::chrono::microseconds{0},
                    std::chrono::ceil<std::chrono::microseconds>(first - now));
  }

  std::vector<std::shared_ptr<reply_wait>> waits_;
  wait_clock::time_point tick_at_ = wait_clock::time_point::max();
};

}  // namespace computron::actors
