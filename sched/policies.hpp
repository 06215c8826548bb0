#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sched/clock.hpp"

/// Pluggable decisions: which resident model to evict, and which model's queue to serve
/// next. Plain classes over plain views, so the runtime, the simulator and tests use the
/// same ones.
namespace computron::sched {

/// A resident model that could make room.
struct victim_candidate {
  std::string model;
  /// Bytes it would free on the devices that are short.
  uint64_t freed_bytes = 0;
  /// Seconds since a batch last used it.
  double idle_s = 0;
  /// Seconds to load it back (bytes over the slowest link of its devices).
  double reload_s = 0;
  /// Recent arrivals per second.
  double demand_per_s = 0;
  /// Priority class (config key `priority`): a lower class is always evicted first.
  int32_t priority = 0;
};

/// Chooses eviction order.
class eviction_policy {
 public:
  virtual ~eviction_policy() = default;
  virtual const char* name() const = 0;
  /// Indices into `c`, first victim first. Every policy honours priority classes first.
  virtual std::vector<size_t> order(const std::vector<victim_candidate>& c) const = 0;
};

/// Least recently used first: the original's rule, applied to bytes (victims are taken
/// until enough bytes are free, not until a model count fits).
std::unique_ptr<eviction_policy> make_lru_policy();

/// Cheapest expected reload first: reload seconds x recent demand, so a small or idle
/// model goes before a large one that requests keep coming for; ties go to LRU.
std::unique_ptr<eviction_policy> make_cost_aware_policy();

/// "lru" or "cost"; a refusal (invalid_configuration) names the accepted values.
std::unique_ptr<eviction_policy> make_eviction_policy(std::string_view name, refusal* why);

/// A model's queue as the dispatcher sees it.
struct queue_view {
  std::string model;
  /// Seconds the oldest queued request has waited.
  double head_age_s = 0;
  size_t queued = 0;
  bool resident = false;
  /// Seconds until the earliest deadline among its queued requests.
  double slack_s = 0;
  /// Priority class: a higher class is served first.
  int32_t priority = 0;
};

/// Chooses which model's batch goes next.
class dispatch_policy {
 public:
  virtual ~dispatch_policy() = default;
  virtual const char* name() const = 0;
  /// Indices into `q`, first served first.
  virtual std::vector<size_t> order(const std::vector<queue_view>& q) const = 0;
};

/// Highest priority class first, then the oldest head (the original's order).
std::unique_ptr<dispatch_policy> make_fcfs_policy();

/// Resident models first, so that a swap is paid only when no loaded model has work;
/// a head that waited `max_wait_s` or longer goes first anyway (no starvation). Priority
/// classes order the rest.
std::unique_ptr<dispatch_policy> make_resident_first_policy(double max_wait_s);

/// Earliest deadline first (SLO-aware): the queue whose most urgent request has the least
/// slack goes first; priority classes first.
std::unique_ptr<dispatch_policy> make_edf_policy();

/// "fcfs", "resident-first" or "edf".
std::unique_ptr<dispatch_policy> make_dispatch_policy(std::string_view name, double max_wait_s,
                                                      refusal* why);

/// Arrivals per second with exponential decay (time constant `tau_s`): recent demand
/// without keeping every timestamp.
class demand_meter {
 public:
  explicit demand_meter(double tau_s = 10.0) : tau_s_(tau_s) {}
  /// Notes `n` arrivals at `now`.
  void note(uint32_t n, time_point now);
  /// The decayed rate at `now`.
  double rate(time_point now) const;

 private:
  double tau_s_;
  double score_ = 0;
  time_point last_{};
};

}  // namespace computron::sched
