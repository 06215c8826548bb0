#include "sched/step_rows.hpp"

#include <algorithm>

namespace computron::sched {

row_budget recompute_budget(const row_budget& before, int64_t generated) {
  generated = std::max<int64_t>(0, generated);
  row_budget after;
  after.prompt_tokens = std::max<int64_t>(1, before.prompt_tokens) + generated;
  after.max_tokens = std::max<int64_t>(1, before.max_tokens - generated);
  after.min_tokens = std::max<int64_t>(0, before.min_tokens - generated);
  return after;
}

queued_entry recompute_row(queued_entry row, int64_t generated) {
  auto b = recompute_budget({row.prompt_tokens, row.steps, 0}, generated);
  row.prompt_tokens = b.prompt_tokens;
  row.steps = b.max_tokens;
  return row;
}

boundary_leavers leavers_at(const dispatch_effects& e, batch_id id) {
  boundary_leavers out;
  for (auto& p : e.preempted)
    if (p.batch == id)
      for (auto& row : p.rows) out.preempted.emplace(row.key, row);
  for (auto& f : e.failures)
    if (f.batch == id) out.failed.emplace(f.row.key, f);
  return out;
}

boundary_next next_at_boundary(const dispatch_effects& e, batch_id id, bool rows_left) {
  const bool go = std::find(e.steps.begin(), e.steps.end(), id) != e.steps.end();
  // The ask's answer continues it (kv_granted); the driver must know before it carries the
  // ask out, as the simulator's residency core answers at once.
  if (!go &&
      std::any_of(e.kv_asks.begin(), e.kv_asks.end(), [&](auto& a) { return a.batch == id; }))
    return boundary_next::wait;
  if (!rows_left && e.joins.empty()) return boundary_next::end;
  return go ? boundary_next::step : boundary_next::stuck;
}

refusal boundary_stuck() {
  return {ec::invalid_state, "a step boundary neither stepped nor waited"};
}

const char* to_string(boundary_next n) {
  switch (n) {
    case boundary_next::step:
      return "step";
    case boundary_next::wait:
      return "wait";
    case boundary_next::end:
      return "end";
    case boundary_next::stuck:
      return "stuck";
  }
  return "?";
}

// The dispatch core's side of a step that found its device full (dispatch.hpp): its rows
// go back to the queue by the rule above.
std::vector<uint64_t> dispatcher::requeue_rows(batch_id id) {
  std::vector<uint64_t> keys;
  auto i = batches_.find(id);
  if (i == batches_.end() || !i->second.started) return keys;
  auto& b = i->second;
  std::vector<queued_entry> back;
  for (auto k : b.going)
    if (auto* e = row_of(b, k)) {
      back.push_back(recompute_row(*e, b.steps_run[k]));
      keys.push_back(k);
    }
  // Rows that joined at the last boundary (their prefill counted ahead, not yet going):
  // as they came, their first token perhaps not computed.
  for (auto& e : b.rows)
    if (b.steps_run.count(e.key) > 0 &&
        std::find(b.going.begin(), b.going.end(), e.key) == b.going.end()) {
      back.push_back(e);
      keys.push_back(e.key);
    }
  if (b.chunking)
    for (auto& e : b.chunking->rows) {
      back.push_back(e);
      keys.push_back(e.key);
    }
  b.going.clear();
  b.rows.clear();
  b.steps_run.clear();
  b.chunking.reset();
  batcher_->push_front(b.model, back);
  return keys;
}

}  // namespace computron::sched
