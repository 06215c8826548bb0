#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/timespan.hpp>

/// Fan-out and join, written by hand: CAF 0.17 has no fan_out_request (CAF_0.17.md §4).
namespace computron::actors {

/// Collects `n` results in order; calls `done(results)` when all arrived or `fail(error,
/// index)` on the first error, exactly once either way. Lives in the requesting actor
/// (its handlers run one at a time), so it needs no lock.
template <class Result, class OnDone, class OnFail>
class join {
 public:
  join(size_t n, OnDone done, OnFail fail)
      : results_(n), pending_(n), done_(std::move(done)), fail_(std::move(fail)) {}

  void ok(size_t i, Result r) {
    if (finished_) return;
    results_[i] = std::move(r);
    if (--pending_ == 0) {
      finished_ = true;
      done_(std::move(results_));
    }
  }

  void failed(caf::error e, size_t i) {
    if (finished_) return;
    finished_ = true;
    fail_(std::move(e), i);
  }

 private:
  std::vector<Result> results_;
  size_t pending_;
  bool finished_ = false;
  OnDone done_;
  OnFail fail_;
};

template <class Result, class OnDone, class OnFail>
std::shared_ptr<join<Result, OnDone, OnFail>> make_join(size_t n, OnDone done, OnFail fail) {
  return std::make_shared<join<Result, OnDone, OnFail>>(n, std::move(done), std::move(fail));
}

/// Sends the same request to every handle in `to` and joins the replies (see join). An
/// empty list is done at once.
template <class Result, class Self, class Handle, class OnDone, class OnFail, class... Ts>
void fan_out_all(Self* self, const std::vector<Handle>& to, caf::timespan timeout, OnDone done,
                 OnFail fail, const Ts&... xs) {
  if (to.empty()) {
    done(std::vector<Result>{});
    return;
  }
  auto j = make_join<Result>(to.size(), std::move(done), std::move(fail));
  for (size_t i = 0; i < to.size(); ++i)
    self->request(to[i], timeout, xs...)
        .then([=](Result& r) { j->ok(i, std::move(r)); },
              [=](caf::error& e) { j->failed(std::move(e), i); });
}

}  // namespace computron::actors
