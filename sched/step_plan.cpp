#include "sched/step_plan.hpp"

#include <algorithm>

#include "common/prefill_window.hpp"
#include "sched/kv_blocks.hpp"

namespace computron::sched {

const char* to_string(step_mode m) {
  switch (m) {
    case step_mode::prefill:
      return "prefill";
    case step_mode::chunk:
      return "chunk";
    case step_mode::decode:
      return "decode";
    case step_mode::mixed:
      return "mixed";
  }
  return "?";
}

int64_t step_plan::tokens() const {
  int64_t n = 0;
  for (auto& r : rows) n += r.scheduled;
  return n;
}

int64_t step_plan::blocks_after(const planned_row& r) const {
  return kv_blocks_for(r.computed + r.scheduled + (into != 0 ? 1 : 0));
}

step_mode step_plan::mode() const {
  bool decode = false, whole = false, part = false;
  for (auto& r : rows) {
    if (r.decoding())
      decode = true;
    else if (r.computed == 0 && r.scheduled >= r.prompt_tokens)
      whole = true;
    else
      part = true;
  }
  if (decode && (whole || part)) return step_mode::mixed;
  if (part) return step_mode::chunk;
  if (whole) return step_mode::prefill;
  return step_mode::decode;
}

step_plan prefill_plan(batch_id batch, const std::vector<queued_entry>& rows) {
  return join_step_plan(batch, 0, rows, 0, 0);
}

step_plan join_step_plan(batch_id batch, batch_id into, const std::vector<queued_entry>& rows,
                         int32_t chunk, int32_t left) {
  step_plan p;
  p.batch = batch;
  p.chunk = chunk;
  p.left = left;
  if (chunk == 0 || left == 0) p.into = into;
  for (auto& e : rows) {
    const auto n = std::max<int64_t>(1, e.prompt_tokens);
    auto w = prefill_window(n, chunk, left);
    p.rows.push_back({e.key, n, w.begin, w.tokens()});
  }
  return p;
}

planned_row decode_row(const queued_entry& row, int64_t steps_run) {
  const auto n = std::max<int64_t>(1, row.prompt_tokens);
  return {row.key, n, n + std::max<int64_t>(0, steps_run - 1), 1};
}

}  // namespace computron::sched
