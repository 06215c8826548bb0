#include "actors/policies.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.hpp"

namespace computron::actors {

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
    std::stable_sort(ix.begin(), ix.end(),
                     [&](size_t a, size_t b) { return c[a].idle_s > c[b].idle_s; });
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
    std::stable_sort(ix.begin(), ix.end(),
                     [&](size_t a, size_t b) { return q[a].head_age_s > q[b].head_age_s; });
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
      return q[a].head_age_s > q[b].head_age_s;
    });
    return ix;
  }

 private:
  double max_wait_s_;
};

}  // namespace

std::unique_ptr<eviction_policy> make_lru_policy() {
  return std::make_unique<lru>();
}

std::unique_ptr<eviction_policy> make_cost_aware_policy() {
  return std::make_unique<cost_aware>();
}

caf::expected<std::unique_ptr<eviction_policy>> make_eviction_policy(std::string_view name) {
  if (name == "lru") return make_lru_policy();
  if (name == "cost" || name == "cost-aware") return make_cost_aware_policy();
  return make_error(ec::invalid_configuration,
                    "eviction policy must be lru or cost, got '" + std::string{name} + "'");
}

std::unique_ptr<dispatch_policy> make_fcfs_policy() {
  return std::make_unique<fcfs>();
}

std::unique_ptr<dispatch_policy> make_resident_first_policy(double max_wait_s) {
  return std::make_unique<resident_first>(max_wait_s);
}

caf::expected<std::unique_ptr<dispatch_policy>> make_dispatch_policy(std::string_view name,
                                                                     double max_wait_s) {
  if (name == "fcfs") return make_fcfs_policy();
  if (name == "resident-first") return make_resident_first_policy(max_wait_s);
  return make_error(
      ec::invalid_configuration,
      "dispatch policy must be fcfs or resident-first, got '" + std::string{name} + "'");
}

void demand_meter::note(uint32_t n, double now_s) {
  score_ = score_ * std::exp(-(now_s - last_s_) / tau_s_) + n;
  last_s_ = now_s;
}

double demand_meter::rate(double now_s) const {
  return score_ * std::exp(-(now_s - last_s_) / tau_s_) / tau_s_;
}

}  // namespace computron::actors
