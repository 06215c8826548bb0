#pragma once

#include <cstdint>
#include <vector>

#include "sched/batching.hpp"
#include "sched/kv_block_ids.hpp"

/// One forward step of a batch as the dispatch core decided it (vLLM's SchedulerOutput,
/// SGLang's ForwardMode): per row the tokens its caches hold and those the step computes,
/// the rows that left since the batch's previous step, the KV the scheduler holds for it,
/// and a mode derived from the counts. The core builds it once (dispatcher: a started
/// batch's first step, a join's prefill or chunk, a batch's next step at a boundary), and
/// its drivers count and send the step from it instead of each deriving the counts again.
namespace computron::sched {

/// A batch the dispatch core formed; its drivers keep its requests under the same number.
using batch_id = uint64_t;

/// What kind of step a plan is, from its rows' counts alone.
enum class step_mode : uint8_t {
  /// Every row computes its whole prompt (the caches are empty).
  prefill,
  /// Rows compute part of their prompts (a chunked prefill's chunk; common/prefill_window).
  chunk,
  /// Every row holds its prompt and computes one token.
  decode,
  /// Decoding rows and prompt rows in one step (not planned yet: a join's prefill is a
  /// step of its own before the batch's next).
  mixed,
};

/// The mode's name, for logs and traces.
const char* to_string(step_mode m);

/// One row of a step.
struct planned_row {
  /// The driver's key of the request (queued_entry::key).
  uint64_t key = 0;
  /// Tokens of its prompt (with what it generated before a preemption; an empty one counts
  /// as one token, as the KV rules count it).
  int64_t prompt_tokens = 0;
  /// Tokens the workers' caches hold for it before the step.
  int64_t computed = 0;
  /// Tokens the step computes for it: its prompt's window at a prefill or chunk, one at a
  /// decode step.
  int64_t scheduled = 0;
  /// The KV blocks it gains in the step (sched/kv_block_ids.hpp), in position order: its
  /// table is what its earlier steps named plus these. The dispatch core names them when it
  /// plans the step (step_plan::blocks_after says how many a row holds then).
  std::vector<uint32_t> blocks{};

  /// It holds its whole prompt: it generates.
  bool decoding() const { return computed >= prompt_tokens; }
};

/// One forward step of a batch.
struct step_plan {
  /// The batch id the workers run the step under: the batch's own, or a join's (its rows
  /// are cached under it until they join `into`).
  batch_id batch = 0;
  /// A join's last step: its rows join this batch after it (their caches, row keys and
  /// samplers go after its own on every shard); 0: none (an ordinary step, or a chunk that
  /// leaves more for later).
  batch_id into = 0;
  std::vector<planned_row> rows;
  /// Rows of the batch's previous step that are not in this one (finished, failed or
  /// preempted at the boundary): the workers drop their caches. A worker's runner does not
  /// read it: it goes by the rows `rows` names (engine::kept_rows), which the manager
  /// writes as it sends them.
  std::vector<uint64_t> finished;
  /// KV blocks a pool may take beyond the step's own need (a chunk larger than the need, so
  /// that later steps find blocks free): what the batch holds that its rows do not. The
  /// batch's own figure, not its model's: another batch's blocks go back to the ledger
  /// while this step is on its way, and a pool that grew into them would hold pages the
  /// ledger has handed to a load (issue 44). -1: no bound (a model whose KV is not in the
  /// ledger).
  int64_t kv_spare = -1;
  /// A chunked prefill's chunk and the tokens of every prompt left after it
  /// (common/prefill_window.hpp: row i computes its window, and the prompts end together in
  /// the chunk with `left` 0, whose logits are sampled); 0 and 0 otherwise.
  int32_t chunk = 0;
  int32_t left = 0;

  /// Tokens the step computes over all its rows (what a step's cost is a line in).
  int64_t tokens() const;
  /// KV blocks row `r` holds after the step: its positions then, and on a join's last
  /// step one more, for its first decode step in the batch it joins (the drivers extend
  /// that step's plan with the row, decode_row(e, 1), without naming blocks).
  int64_t blocks_after(const planned_row& r) const;
  step_mode mode() const;
};

/// The first step of a batch: every row's whole prompt.
step_plan prefill_plan(batch_id batch, const std::vector<queued_entry>& rows);

/// A join's step (dispatch.hpp's join_plan): every row's window of its prompt
/// (common/prefill_window.hpp: the whole prompt when `chunk` is 0). The rows join `into`
/// after the chunk that leaves nothing.
step_plan join_step_plan(batch_id batch, batch_id into, const std::vector<queued_entry>& rows,
                         int32_t chunk, int32_t left);

/// A row's entry in a decode step after it ran `steps_run` steps: its caches hold its
/// prompt and every generated token but the last, which the step computes.
planned_row decode_row(const queued_entry& row, int64_t steps_run);

}  // namespace computron::sched
