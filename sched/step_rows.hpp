#pragma once

#include <cstdint>
#include <map>

#include "sched/clock.hpp"
#include "sched/dispatch.hpp"

/// The row bookkeeping both drivers of the dispatch core do around a step: which rows of a
/// batch leave at a step boundary, what a preempted row is recomputed as, and what the
/// batch does next. The model manager (actors/batch_steps.cpp) and the simulator
/// (sim/simulator.cpp) call these, so that a rule about a batch's rows is written once
/// (they had each written them, and disagreed on a boundary that neither steps nor waits).
namespace computron::sched {

/// What a request still needs from the model: the tokens its prompt holds, the most it may
/// still generate (max_tokens) and the fewest before a stop id may end it (min_tokens).
struct row_budget {
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 1;
  int64_t min_tokens = 0;
};

/// The budget of a row preempted after it generated `generated` tokens, as it is recomputed
/// (vLLM's recompute): they become part of its prompt (an empty prompt counts as one
/// token, as the KV rules count it), and max_tokens and min_tokens shrink by as many (at
/// least one token is left to generate, and never a negative minimum). The dispatch core
/// rewrites its queued row with it and the manager its request, so that a request's
/// max_tokens, which both hold, never disagrees.
row_budget recompute_budget(const row_budget& before, int64_t generated);

/// A queued row rewritten for its recompute (its prompt_tokens and steps).
queued_entry recompute_row(queued_entry row, int64_t generated);

/// The rows of batch `id` that leave at a step boundary (dispatcher::step_boundary or
/// kv_granted): preempted ones go back to the queue, rewritten for their recompute;
/// failed ones (expired_running, no_kv_room) are answered with their failure.
struct boundary_leavers {
  std::map<uint64_t, queued_entry> preempted;
  std::map<uint64_t, row_failure> failed;

  bool leaves(uint64_t key) const { return preempted.count(key) > 0 || failed.count(key) > 0; }
  bool empty() const { return preempted.empty() && failed.empty(); }
};
/// Batch `id`'s leavers among the effects of a step boundary.
boundary_leavers leavers_at(const dispatch_effects& e, batch_id id);

/// What a batch does after a step boundary once its leavers left.
enum class boundary_next : uint8_t {
  /// Its next step runs now (after a join's prefill, when `e.joins` has one).
  step,
  /// It waits for the answer to its KV ask (kv_granted continues it).
  wait,
  /// No row is left and none joins: it ends (batch_done).
  end,
  /// Rows are left, yet the core neither stepped it nor asked KV for it: it cannot go
  /// on, and fails with boundary_stuck's error rather than holding its rows and devices
  /// forever.
  stuck,
};

/// The one decision of both drivers: `rows_left`: the batch still has rows after its
/// leavers left.
boundary_next next_at_boundary(const dispatch_effects& e, batch_id id, bool rows_left);

/// Why a stuck batch fails (invalid_state): its rows are answered with it and the core
/// hears batch_done(ok = false).
refusal boundary_stuck();

/// The decision's name, for logs and tests.
const char* to_string(boundary_next n);

}  // namespace computron::sched
