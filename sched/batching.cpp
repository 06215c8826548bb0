#include "sched/batching.hpp"

#include <algorithm>
#include <cmath>

namespace computron::sched {

time_point deadline_of(time_point arrival, int64_t deadline_ms, duration default_deadline) {
  return arrival +
         (deadline_ms > 0
              ? std::chrono::duration_cast<duration>(std::chrono::milliseconds(deadline_ms))
              : default_deadline);
}

std::unique_ptr<batcher> batcher::make(batching_options opts, refusal* why) {
  if (opts.max_batch_size == 0 || opts.max_queue == 0) {
    if (why) *why = {ec::invalid_configuration, "max_batch_size and max_queue must be at least 1"};
    return nullptr;
  }
  if (opts.batch_window.count() < 0 || opts.max_wait.count() < 0 ||
      opts.default_deadline.count() <= 0) {
    if (why) *why = {ec::invalid_configuration, "batching times must be positive"};
    return nullptr;
  }
  auto policy = make_dispatch_policy(opts.dispatch,
                                     std::chrono::duration<double>(opts.max_wait).count(), why);
  if (!policy) return nullptr;
  return std::unique_ptr<batcher>(new batcher(std::move(opts), std::move(policy)));
}

batcher::batcher(batching_options opts, std::unique_ptr<dispatch_policy> policy)
    : opts_(std::move(opts)), policy_(std::move(policy)) {}

uint32_t batcher::add_model(std::string name, int32_t max_in_flight, int32_t priority) {
  model_queue q;
  q.name = std::move(name);
  q.max_in_flight = std::max(1, max_in_flight);
  q.priority = priority;
  queues_.push_back(std::move(q));
  return static_cast<uint32_t>(queues_.size() - 1);
}

std::optional<refusal> batcher::admit(uint32_t model, uint64_t key, time_point now,
                                      int64_t deadline_ms, time_point* deadline, int64_t steps,
                                      bool drop_late, int64_t prompt_tokens, bool whole_prefill) {
  auto& q = queues_[model];
  if (q.live >= opts_.max_queue)
    return refusal{ec::overloaded, "the queue of " + q.name + " is full (" +
                                       std::to_string(opts_.max_queue) + " requests)"};
  auto d = deadline_of(now, deadline_ms, opts_.default_deadline);
  auto seq = q.next_seq++;
  q.queue.push_back(
      {key, now, d, std::max<int64_t>(1, steps), drop_late, seq, prompt_tokens, whole_prefill});
  q.dead.push_back(false);
  ++q.live;
  q.deadlines.emplace(d, seq);
  if (deadline) *deadline = d;
  return std::nullopt;
}

void batcher::push_front(uint32_t model, const std::vector<queued_entry>& rows) {
  if (rows.empty()) return;
  auto& q = queues_[model];
  q.tidy();
  for (auto i = rows.rbegin(); i != rows.rend(); ++i) {
    auto e = *i;
    e.seq = --q.front_seq;
    q.queue.push_front(e);
    q.dead.push_front(false);
    ++q.live;
  }
  // The heap may hold stale entries of requests that left from the front under the numbers
  // just reused: rebuilt from the live ones (a rare event: no room for a batch).
  decltype(q.deadlines) fresh;
  for (size_t i = 0; i < q.queue.size(); ++i)
    if (!q.dead[i]) fresh.emplace(q.queue[i].deadline, q.front_seq + i);
  q.deadlines = std::move(fresh);
}

void batcher::set_blocked(uint32_t model, bool blocked) {
  queues_[model].blocked = blocked;
}

void batcher::model_queue::tidy() {
  while (!queue.empty() && dead.front()) {
    queue.pop_front();
    dead.pop_front();
    ++front_seq;
  }
  while (!deadlines.empty() && is_dead(deadlines.top().second)) deadlines.pop();
  // Entries that left from the front stay in the heap until they reach its top; with
  // deadlines out of arrival order that could be many. Rebuilt once they outnumber the
  // live ones, so the heap stays O(live) at amortized O(1) per entry.
  if (deadlines.size() > 2 * live + 64) {
    decltype(deadlines) fresh;
    for (size_t i = 0; i < queue.size(); ++i)
      if (!dead[i]) fresh.emplace(queue[i].deadline, front_seq + i);
    deadlines = std::move(fresh);
  }
}

void batcher::bury(model_queue& q, uint64_t seq) {
  q.dead[seq - q.front_seq] = true;
  --q.live;
}

dispatch_decisions batcher::dispatch(time_point now) {
  dispatch_decisions out;
  auto want_tick = [&](time_point at) {
    if (!out.next_tick || at < *out.next_tick) out.next_tick = at;
  };
  views_.clear();
  view_models_.clear();
  for (uint32_t i = 0; i < queues_.size(); ++i) {
    auto& q = queues_[i];
    q.tidy();
    while (!q.deadlines.empty() && q.deadlines.top().first <= now) {
      auto seq = q.deadlines.top().second;
      q.deadlines.pop();
      if (q.is_dead(seq)) continue;
      out.expired.emplace_back(i, q.queue[seq - q.front_seq]);
      bury(q, seq);
    }
    q.tidy();
    if (q.live == 0) continue;
    auto earliest = q.deadlines.top().first;
    want_tick(earliest);
    if (q.in_flight >= q.max_in_flight || q.blocked) continue;
    queue_view v;
    v.head_age_s = seconds_between(q.queue.front().arrival, now);
    v.queued = q.live;
    v.resident = q.resident;
    v.slack_s = seconds_between(now, earliest);
    v.priority = q.priority;
    views_.push_back(std::move(v));
    view_models_.push_back(i);
  }
  if (views_.empty()) return out;
  const double window = std::chrono::duration<double>(opts_.batch_window).count();
  for (auto vi : policy_->order(views_)) {
    auto model = view_models_[vi];
    auto& q = queues_[model];
    bool full = q.live >= opts_.max_batch_size;
    if (!full && views_[vi].head_age_s < window) {
      want_tick(q.queue.front().arrival + opts_.batch_window);
      continue;
    }
    batch_plan b;
    b.model = model;
    take_front(model, opts_.max_batch_size, now, b.rows, out.dropped);
    if (b.rows.empty()) continue;  // every one of them was dropped
    ++q.in_flight;
    out.batches.push_back(std::move(b));
  }
  return out;
}

void batcher::take_front(uint32_t model, size_t n, time_point now, std::vector<queued_entry>& rows,
                         std::vector<std::pair<uint32_t, queued_entry>>& dropped) {
  auto& q = queues_[model];
  while (rows.size() < n && q.live > 0) {
    q.tidy();
    auto e = q.queue.front();
    q.queue.pop_front();
    q.dead.pop_front();
    ++q.front_seq;
    --q.live;
    if (e.drop_late) {
      auto est = estimate_s(model, e.steps);
      if (est && now + from_seconds(*est) > e.deadline) {
        dropped.emplace_back(model, e);
        continue;
      }
    }
    rows.push_back(e);
  }
  q.tidy();
}

dispatch_decisions batcher::join(uint32_t model, size_t n, time_point now) {
  dispatch_decisions out;
  auto& q = queues_[model];
  q.tidy();
  while (!q.deadlines.empty() && q.deadlines.top().first <= now) {
    auto seq = q.deadlines.top().second;
    q.deadlines.pop();
    if (q.is_dead(seq)) continue;
    out.expired.emplace_back(model, q.queue[seq - q.front_seq]);
    bury(q, seq);
  }
  q.tidy();
  batch_plan b;
  b.model = model;
  take_front(model, n, now, b.rows, out.dropped);
  if (!b.rows.empty()) out.batches.push_back(std::move(b));
  return out;
}

void batcher::batch_ended(uint32_t model) {
  auto& q = queues_[model];
  if (q.in_flight > 0) --q.in_flight;
}

namespace {

/// A moving average that starts at its first sample.
void average_into(double& avg, double sample) {
  if (!(sample >= 0) || !std::isfinite(sample)) return;
  avg = avg <= 0 ? sample : avg + 0.25 * (sample - avg);
}

}  // namespace

void batcher::note_steps(uint32_t model, double seconds, int64_t steps) {
  if (steps < 1) return;
  average_into(queues_[model].step_s, seconds / static_cast<double>(steps));
}

void batcher::note_load(uint32_t model, double seconds) {
  average_into(queues_[model].load_s, seconds);
}

std::optional<double> batcher::estimate_s(uint32_t model, int64_t steps) const {
  auto& q = queues_[model];
  if (q.step_s <= 0) return std::nullopt;
  // A batch of the model in flight is loading it already (or runs on it): a later batch
  // does not pay a whole load again.
  bool load = !q.resident && q.in_flight == 0;
  return (load ? q.load_s : 0.0) + q.step_s * static_cast<double>(std::max<int64_t>(1, steps));
}

double batcher::step_seconds(uint32_t model) const {
  return queues_[model].step_s;
}

void batcher::set_resident(uint32_t model, bool resident) {
  queues_[model].resident = resident;
}

uint32_t device_gate::placement_key(int32_t tp, int32_t pp, const std::vector<int32_t>& devices) {
  std::string text = std::to_string(tp) + "x" + std::to_string(pp) + ":";
  for (auto d : devices) text += std::to_string(d) + ",";
  for (auto& [t, k] : keys_)
    if (t == text) return k;
  auto k = static_cast<uint32_t>(keys_.size() + 1);  // 0 marks an idle device
  keys_.emplace_back(std::move(text), k);
  return k;
}

bool device_gate::try_start(std::vector<bool>& pass, uint32_t key,
                            const std::vector<int32_t>& devices, int32_t pp) {
  bool free = true;
  for (auto d : devices) {
    auto& u = use_[static_cast<size_t>(d)];
    free = free && !pass[static_cast<size_t>(d)] &&
           (u.batches == 0 || (u.key == key && u.batches < pp));
  }
  if (!free) {
    for (auto d : devices) pass[static_cast<size_t>(d)] = true;
    return false;
  }
  for (auto d : devices) {
    auto& u = use_[static_cast<size_t>(d)];
    u.key = key;
    ++u.batches;
  }
  return true;
}

void device_gate::finish(const std::vector<int32_t>& devices) {
  for (auto d : devices) {
    auto& u = use_[static_cast<size_t>(d)];
    if (--u.batches <= 0) u = {};
  }
}

time_point overlap_start(time_point leased, double load_left_s, double step_s, int32_t pp) {
  double first_stage_s = step_s / static_cast<double>(std::max(1, pp));
  return leased + from_seconds(std::max(0.0, load_left_s - first_stage_s));
}

}  // namespace computron::sched
