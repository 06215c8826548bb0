#include "sched/policies.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace computron::sched {

namespace {

std::vector<size_t> indices(size_t n) {
  std::vector<size_t> ix(n);
  std::iota(ix.begin(), ix.end(), size_t{0});
  return ix;
}

class lru final : public eviction_policy {
 public:
  const char* name() const override { return "lru"; }
  std::vector<size_t> order(const std::vector<victim_candidate>& c) const override {
    auto ix = indices(c.size());
    std::stable_sort(ix.begin(), ix.end(), [&](size_t a, size_t b) {
      if (c[a].priority != c[b].priority) return c[a].priority < c[b].priority;
      return c[a].idle_s > c[b].idle_s;
    });
    return ix;
  }
};

class cost_aware final : public eviction_policy {
 public:
  const char* name() const override { return "cost"; }
  std::vector<size_t> order(const std::vector<victim_candidate>& c) const override {
    auto ix = indices(c.size());
    auto cost = [&](size_t i) { return c[i].reload_s * c[i].demand_per_s; };
    std::stable_sort(ix.begin(), ix.end(), [&](size_t a, size_t b) {
      if (c[a].priority != c[b].priority) return c[a].priority < c[b].priority;
      auto ca = cost(a);
      auto cb = cost(b);
      // Costs within 1% count as equal, so noise in the demand estimate falls back to LRU.
      if (std::fabs(ca - cb) > 0.01 * std::max(ca, cb)) return ca < cb;
      return c[a].idle_s > c[b].idle_s;
    });
    return ix;
  }
};

class fcfs final : public dispatch_policy {
 public:
  const char* name() const override { return "fcfs"; }
  std::vector<size_t> order(const std::vector<queue_view>& q) const override {
    auto ix = indices(q.size());
    std::stable_sort(ix.begin(), ix.end(), [&](size_t a, size_t b) {
      if (q[a].priority != q[b].priority) return q[a].priority > q[b].priority;
      return q[a].head_age_s > q[b].head_age_s;
    });
    return ix;
  }
};

class resident_first final : public dispatch_policy {
 public:
  explicit resident_first(double max_wait_s) : max_wait_s_(max_wait_s) {}
  const char* name() const override { return "resident-first"; }
  std::vector<size_t> order(const std::vector<queue_view>& q) const override {
    auto ix = indices(q.size());
    auto rank = [&](size_t i) {
      if (q[i].head_age_s >= max_wait_s_) return 0;  // overdue: first, oldest first
      return q[i].resident ? 1 : 2;
    };
    std::stable_sort(ix.begin(), ix.end(), [&](size_t a, size_t b) {
      if (rank(a) != rank(b)) return rank(a) < rank(b);
      if (q[a].priority != q[b].priority) return q[a].priority > q[b].priority;
      return q[a].head_age_s > q[b].head_age_s;
    });
    return ix;
  }

 private:
  double max_wait_s_;
};

class edf final : public dispatch_policy {
 public:
  const char* name() const override { return "edf"; }
  std::vector<size_t> order(const std::vector<queue_view>& q) const override {
    auto ix = indices(q.size());
    std::stable_sort(ix.begin(), ix.end(), [&](size_t a, size_t b) {
      if (q[a].priority != q[b].priority) return q[a].priority > q[b].priority;
      if (q[a].slack_s != q[b].slack_s) return q[a].slack_s < q[b].slack_s;
      return q[a].head_age_s > q[b].head_age_s;
    });
    return ix;
  }
};

}  // namespace

std::unique_ptr<eviction_policy> make_lru_policy() {
  return std::make_unique<lru>();
}

std::unique_ptr<eviction_policy> make_cost_aware_policy() {
  return std::make_unique<cost_aware>();
}

std::unique_ptr<eviction_policy> make_eviction_policy(std::string_view name, refusal* why) {
  if (name == "lru") return make_lru_policy();
  if (name == "cost" || name == "cost-aware") return make_cost_aware_policy();
  if (why)
    *why = {ec::invalid_configuration,
            "eviction policy must be lru or cost, got '" + std::string{name} + "'"};
  return nullptr;
}

std::unique_ptr<dispatch_policy> make_fcfs_policy() {
  return std::make_unique<fcfs>();
}

std::unique_ptr<dispatch_policy> make_resident_first_policy(double max_wait_s) {
  return std::make_unique<resident_first>(max_wait_s);
}

std::unique_ptr<dispatch_policy> make_edf_policy() {
  return std::make_unique<edf>();
}

std::unique_ptr<dispatch_policy> make_dispatch_policy(std::string_view name, double max_wait_s,
                                                      refusal* why) {
  if (name == "fcfs") return make_fcfs_policy();
  if (name == "resident-first") return make_resident_first_policy(max_wait_s);
  if (name == "edf") return make_edf_policy();
  if (why)
    *why = {ec::invalid_configuration,
            "dispatch policy must be fcfs, resident-first or edf, got '" + std::string{name} + "'"};
  return nullptr;
}

void demand_meter::note(uint32_t n, time_point now) {
  score_ = score_ * std::exp(-seconds_between(last_, now) / tau_s_) + n;
  last_ = now;
}

double demand_meter::rate(time_point now) const {
  return score_ * std::exp(-seconds_between(last_, now) / tau_s_) / tau_s_;
}

}  // namespace computron::sched
