// The dispatch core's KV arithmetic: the blocks a row and a batch need for their next step
// (and want, with lookahead), the spare a step's pools may take beyond that, and what the
// batches hold. dispatch.cpp decides with them.
#include <algorithm>

#include "sched/dispatch.hpp"
#include "sched/kv_blocks.hpp"

namespace computron::sched {

uint64_t dispatcher::kv_need(const queued_entry& e, int64_t steps_run) {
  // The next step caches position prompt + steps_run - 1 ... : prompt + steps_run tokens
  // (the prefill, steps_run 0, caches the prompt); never more than the request's last.
  auto prompt = std::max<int64_t>(1, e.prompt_tokens);
  auto last = prompt + std::max<int64_t>(0, e.steps - 1);
  return static_cast<uint64_t>(kv_blocks_for(std::min(prompt + steps_run, last)));
}

uint64_t dispatcher::kv_want(const queued_entry& e, int64_t steps_run) {
  auto prompt = std::max<int64_t>(1, e.prompt_tokens);
  auto last = prompt + std::max<int64_t>(0, e.steps - 1);
  return static_cast<uint64_t>(
      kv_blocks_for(std::min(prompt + steps_run + kv_lookahead_tokens, last)));
}

const queued_entry* dispatcher::row_of(const batch_state& b, uint64_t key) const {
  for (auto& e : b.rows)
    if (e.key == key) return &e;
  return nullptr;
}

uint64_t dispatcher::kv_need_of(const batch_state& b,
                                const std::vector<queued_entry>& joiners) const {
  uint64_t need = 0;
  for (auto k : b.going)
    if (auto* e = row_of(b, k)) {
      auto s = b.steps_run.find(k);
      need += kv_need(*e, s == b.steps_run.end() ? 0 : s->second);
    }
  // A joiner's prefill caches its prompt and the step after it one token more; a chunked
  // prefill holds that from its first chunk on.
  for (auto& e : joiners) need += kv_need(e, 1);
  if (b.chunking)
    for (auto& e : b.chunking->rows) need += kv_need(e, 1);
  return need;
}

int64_t dispatcher::kv_spare(const batch_state& b, const std::vector<queued_entry>& joiners) const {
  if (!models_[b.model].kv) return -1;
  // Only this batch's own boundary changes what it holds, and its steps run one after the
  // other, so the spare cannot go stale while a step is on its way (the model's figure
  // could: another batch gives blocks back, and the ledger hands them out, before this
  // step's pool grows into them). The blocks of rows that left count as taken: a join's
  // step at this boundary runs before they are freed.
  const auto taken = kv_need_of(b, joiners) + b.leaving;
  return b.kv_held > taken ? static_cast<int64_t>(b.kv_held - taken) : 0;
}

size_t dispatcher::kv_ids_held(uint32_t model) const {
  return model < models_.size() ? models_[model].block_ids.held() : 0;
}

std::vector<uint32_t> dispatcher::kv_table(batch_id id, uint64_t key) const {
  auto i = batches_.find(id);
  if (i == batches_.end()) return {};
  auto t = i->second.tables.find(key);
  return t == i->second.tables.end() ? std::vector<uint32_t>{} : t->second;
}

uint64_t dispatcher::kv_held(batch_id id) const {
  auto i = batches_.find(id);
  return i == batches_.end() ? 0 : i->second.kv_held;
}

}  // namespace computron::sched
