#include "sched/dispatch.hpp"

#include <algorithm>

#include "sched/kv_blocks.hpp"
#include "sched/step_rows.hpp"

namespace computron::sched {

std::unique_ptr<dispatcher> dispatcher::make(batching_options opts, size_t devices, refusal* why,
                                             gpulet_config gpulets) {
  if (auto bad = check_gpulet_config(gpulets, devices)) {
    if (why) *why = std::move(*bad);
    return nullptr;
  }
  auto b = batcher::make(std::move(opts), why);
  if (!b) return nullptr;
  return std::unique_ptr<dispatcher>(new dispatcher(std::move(b), devices, std::move(gpulets)));
}

uint32_t dispatcher::add_model(const std::string& name, int32_t tp, int32_t pp,
                               const std::vector<int32_t>& devices, int32_t priority, bool kv) {
  auto index = batcher_->add_model(name, pp, priority);
  if (models_.size() <= index) models_.resize(static_cast<size_t>(index) + 1);
  auto& m = models_[index];
  m = {};
  m.tp = tp;
  m.pp = pp;
  m.devices = devices;
  m.kv = kv;
  place_lanes(index);
  return index;
}

void dispatcher::arm(time_point at, time_point now, dispatch_effects& out) {
  at = std::max(at, now);
  if (auto i = ticks_.lower_bound(now); i != ticks_.end() && *i <= at) return;
  ticks_.insert(at);
  out.ticks.push_back(at + tick_slack);
}

void dispatcher::dispatch_pass(time_point now, dispatch_effects& out) {
  auto d = batcher_->dispatch(now);
  for (auto& [m, e] : d.expired) out.failures.push_back({m, e, row_end::expired, 0});
  for (auto& [m, e] : d.dropped) out.failures.push_back({m, e, row_end::dropped, 0});
  for (auto& plan : d.batches) {
    auto id = next_batch_++;
    batch_state b;
    b.model = plan.model;
    b.rows = plan.rows;
    batches_[id] = std::move(b);
    out.formed.push_back({id, plan.model, std::move(plan.rows)});
  }
  if (d.next_tick) arm(*d.next_tick, now, out);
  out.dispatched = true;
}

void dispatcher::run_pass(time_point now, dispatch_effects& out) {
  auto pass = gate_.begin_pass();
  std::deque<batch_id> still;
  bool freed = false;
  while (!runnable_.empty()) {
    auto id = runnable_.front();
    runnable_.pop_front();
    auto& b = batches_.at(id);
    auto& m = models_[b.model];
    if (b.lease.loading) {
      // Started too early, its first stage would hold the devices' compute lanes (and a
      // gate slot) while it waits for bytes, and every other batch there would wait
      // behind it. It starts when the rest of the load takes about its first stage.
      auto at = overlap_start(b.lease.leased_at, b.lease.load_left_s,
                              batcher_->step_seconds(b.model), m.pp);
      if (at > now) {
        arm(at, now, out);
        still.push_back(id);
        continue;
      }
    }
    // A re-plan moves its model: it starts on its new lanes once the plan is in force
    // (its running batches ended), or the model would never drain under steady load.
    if (moving(b.model) || !gate_.try_start(pass, m.gate_key, m.units, m.pp)) {
      still.push_back(id);
      continue;
    }
    // Requests whose deadline passed while the model loaded end here, and those whose
    // clients withdrew them.
    auto start = std::max(now, b.lease.leased_at);
    std::vector<queued_entry> live;
    for (auto& e : b.rows) {
      if (std::find(b.cancelled.begin(), b.cancelled.end(), e.key) != b.cancelled.end())
        out.failures.push_back({b.model, e, row_end::cancelled, id});
      else if (e.deadline <= start)
        out.failures.push_back({b.model, e, row_end::expired_waiting, id});
      else
        live.push_back(e);
    }
    if (live.empty()) {
      kv_trim(id, b, 0, out);
      gate_.finish(m.units);
      out.releases.push_back({id, b.model});
      batcher_->batch_ended(b.model);
      batches_.erase(id);
      freed = true;
      continue;
    }
    b.rows = live;
    b.started = true;
    b.units = m.units;
    b.going.clear();
    // Every started row is counted from its prefill on: one that leaves at the first
    // boundary (it finished at its prefill) leaves as any other does, its blocks with it.
    for (auto& e : live) {
      b.going.push_back(e.key);
      b.steps_run[e.key] = 0;
    }
    auto plan = prefill_plan(id, live);
    name_blocks(b, plan);
    plan.kv_spare = kv_spare(b, {});
    out.started.push_back({id, b.model, std::move(live), start, std::move(plan)});
  }
  runnable_ = std::move(still);
  // A model whose whole batch expired can take its next batch now.
  if (freed) dispatch_pass(now, out);
}

dispatch_effects dispatcher::admit(uint32_t model, uint64_t key, time_point now,
                                   int64_t deadline_ms, int64_t steps, bool drop_late,
                                   int64_t prompt_tokens, bool whole_prefill) {
  dispatch_effects out;
  out.refused = batcher_->admit(model, key, now, deadline_ms, &out.deadline, steps, drop_late,
                                prompt_tokens, whole_prefill);
  if (!out.refused) {
    if (replans()) note_arrival(model, prompt_tokens, steps, now, out);
    dispatch_pass(now, out);
  }
  return out;
}

dispatch_effects dispatcher::leased(batch_id id, const lease_info& l, time_point now) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end()) return out;
  auto& b = i->second;
  b.lease = l;
  if (l.resident) {
    std::vector<bool> in(batcher_->model_count(), false);
    for (auto m : *l.resident)
      if (m < in.size()) in[m] = true;
    for (uint32_t m = 0; m < in.size(); ++m) batcher_->set_resident(m, in[m]);
  }
  batcher_->note_load(b.model, l.load_estimate_s);
  batcher_->set_resident(b.model, true);
  if (models_[b.model].kv) {
    // Its first step waits for its rows' KV blocks (the prefill caches every prompt).
    uint64_t want = 0;
    for (auto& e : b.rows) want += kv_want(e, 0);
    b.waiting = kv_wait::start;
    out.kv_asks.push_back({id, b.model, want, kv_need(b.rows.front(), 1), true});
    return out;
  }
  runnable_.push_back(id);
  run_pass(now, out);
  return out;
}

dispatch_effects dispatcher::lease_failed(batch_id id, time_point now) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end()) return out;
  batcher_->batch_ended(i->second.model);
  batcher_->set_resident(i->second.model, false);
  batches_.erase(i);
  dispatch_pass(now, out);
  return out;
}

void dispatcher::abandon(batch_id id) {
  auto i = batches_.find(id);
  if (i == batches_.end()) return;
  batcher_->batch_ended(i->second.model);
  batches_.erase(i);
}

void dispatcher::cancel(batch_id id, uint64_t key) {
  // Only a batch not started yet fails the row here; a running one drops it after its
  // step (the manager's), and a long-lived one must not collect the keys.
  if (auto i = batches_.find(id); i != batches_.end() && !i->second.started)
    i->second.cancelled.push_back(key);
}

dispatch_effects dispatcher::batch_done(batch_id id, time_point now, bool ok, double compute_s,
                                        int64_t steps) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end()) return out;
  auto model = i->second.model;
  kv_trim(id, i->second, 0, out);
  // Its workers dropped its caches with its last step (or the driver ended it on them).
  auto& ids = models_[model].block_ids;
  ids.give_back(i->second.freed);
  for (auto& [key, table] : i->second.tables) ids.give_back(table);
  auto units = std::move(i->second.units);
  batches_.erase(i);
  unblock();
  gate_.finish(units);
  out.releases.push_back({id, model});
  batcher_->batch_ended(model);
  if (ok && steps > 0) batcher_->note_steps(model, compute_s, steps);
  if (pending_plan_) apply_plan(out);
  run_pass(now, out);
  dispatch_pass(now, out);
  return out;
}

bool dispatcher::others_wait(uint32_t model) const {
  if (moving(model)) return true;
  auto& mine = models_[model].units;
  for (auto& [id, b] : batches_) {
    if (b.started || b.model == model) continue;
    for (auto d : models_[b.model].units)
      if (std::find(mine.begin(), mine.end(), d) != mine.end()) return true;
  }
  return false;
}

dispatch_effects dispatcher::step_boundary(batch_id id, const std::vector<uint64_t>& rows_on,
                                           time_point now) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end() || !i->second.started) return out;
  auto& b = i->second;
  const auto model = b.model;
  // The step after the previous boundary ran everywhere: the rows that left then are gone
  // from every worker, and their blocks may be named again.
  models_[model].block_ids.give_back(b.freed);
  b.freed.clear();
  // Rows past their deadline end here; they leave as finished rows do.
  std::vector<uint64_t> going;
  for (auto k : rows_on) {
    auto* e = row_of(b, k);
    if (e && e->deadline != time_point{} &&
        now >= answer_limit(e->deadline, e->drop_late, batcher_->options().late_grace))
      out.failures.push_back({model, *e, row_end::expired_running, id});
    else
      going.push_back(k);
  }
  // Rows that left give their blocks back to the batch (once the workers ran the next step,
  // whose plan no longer names them); those going on cached a token.
  std::unordered_map<uint64_t, int64_t> steps_run;
  for (auto k : going) steps_run[k] = b.steps_run[k] + 1;
  b.leaving = 0;
  b.left_rows.clear();
  for (auto& [k, n] : b.steps_run)
    if (steps_run.count(k) == 0) {
      b.left_rows.push_back(k);
      free_row(b, k);
      if (auto* e = row_of(b, k)) b.leaving += kv_need(*e, n);
    }
  b.steps_run = std::move(steps_run);
  b.going = going;
  // Only the rows going on matter from here (a long-lived batch must not collect them).
  std::vector<queued_entry> rows;
  for (auto k : going)
    if (auto* e = row_of(b, k)) rows.push_back(*e);
  b.rows = std::move(rows);
  const size_t room = batcher_->options().max_batch_size;
  std::vector<queued_entry> joiners;
  // While a chunked prefill is under way no other join starts.
  if (batcher_->options().continuous && !b.chunking && going.size() < room &&
      batcher_->queued(model) > 0 && !others_wait(model)) {
    auto d = batcher_->join(model, room - going.size(), now);
    for (auto& [m, e] : d.expired) out.failures.push_back({m, e, row_end::expired, 0});
    for (auto& [m, e] : d.dropped) out.failures.push_back({m, e, row_end::dropped, 0});
    for (auto& plan : d.batches) joiners = std::move(plan.rows);
    out.dispatched = true;
  }
  if (models_[model].kv) {
    // A join's prefill (or chunk) runs before the step that frees the blocks of rows that
    // left (its plan no longer names them).
    const bool prefill_first = !joiners.empty() || b.chunking;
    auto need = kv_need_of(b, joiners) + (prefill_first ? b.leaving : 0);
    if (need > b.kv_held) {
      uint64_t want = 0;
      for (auto k : going)
        if (auto* e = row_of(b, k)) want += kv_want(*e, b.steps_run[k]);
      for (auto& e : joiners) want += kv_want(e, 0) + 1;
      if (b.chunking)
        for (auto& e : b.chunking->rows) want += kv_want(e, 1);
      if (prefill_first) want += b.leaving;
      b.joiners = std::move(joiners);
      b.waiting = kv_wait::step;
      // At least what the running rows and a chunked join need (with the blocks of rows
      // that left, which a chunk's step runs before the next step frees them).
      const auto least = kv_need_of(b, {}) + (b.chunking ? b.leaving : 0);
      out.kv_asks.push_back(
          {id, model, want - std::min(want, b.kv_held), least - std::min(least, b.kv_held), false});
      return out;
    }
  }
  b.joiners = std::move(joiners);
  kv_continue(id, b, UINT64_MAX, now, out);
  return out;
}

void dispatcher::kv_trim(batch_id id, batch_state& b, uint64_t keep, dispatch_effects& out) {
  if (b.kv_held <= keep) return;
  out.kv_returns.push_back({b.model, b.kv_held - keep, id});
  b.kv_held = keep;
  // Room came back: a model that found none may try again.
  unblock();
}

void dispatcher::unblock() {
  for (auto m : blocked_) batcher_->set_blocked(m, false);
  blocked_.clear();
}

void dispatcher::kv_continue(batch_id id, batch_state& b, uint64_t ceiling, time_point now,
                             dispatch_effects& out) {
  const auto model = b.model;
  auto joiners = std::move(b.joiners);
  b.joiners.clear();
  if (models_[model].kv) {
    // Preempt the youngest rows (the last to join) until the rest fit what is held.
    std::vector<queued_entry> preempted;
    while (!b.going.empty() && kv_need_of(b, {}) > b.kv_held) {
      auto key = b.going.back();
      b.going.pop_back();
      auto* e = row_of(b, key);
      if (!e) continue;
      auto row = *e;
      auto done = b.steps_run[key];
      b.steps_run.erase(key);
      b.leaving += kv_need(row, done);
      b.left_rows.push_back(key);
      free_row(b, key);
      // Recomputed later: what it generated becomes part of its prompt (the manager
      // rewrites its request by the same rule).
      row = recompute_row(std::move(row), done);
      if (kv_need(row, row.steps) > ceiling)
        out.failures.push_back({model, row, row_end::no_kv_room, id});
      else
        preempted.push_back(row);
    }
    // Joiners that do not fit beside them stay queued, in order, behind the preempted
    // rows (older, and partly done: vLLM requeues those first).
    std::vector<queued_entry> fit, back;
    auto used = kv_need_of(b, {}) + b.leaving;
    for (auto& e : joiners) {
      if (back.empty() && used + kv_need(e, 1) <= b.kv_held) {
        used += kv_need(e, 1);
        fit.push_back(e);
      } else {
        back.push_back(e);
      }
    }
    batcher_->push_front(model, back);
    if (!preempted.empty()) {
      batcher_->push_front(model, preempted);
      out.preempted.push_back({id, model, std::move(preempted)});
    }
    joiners = std::move(fit);
    // A batch that shrank gives back what it holds beyond twice its want (it keeps some
    // room to grow into without asking again).
    uint64_t want = 0;
    for (auto k : b.going)
      if (auto* e = row_of(b, k)) want += kv_want(*e, b.steps_run[k]);
    for (auto& e : joiners) want += kv_want(e, 1);
    if (b.chunking)
      for (auto& e : b.chunking->rows) want += kv_want(e, 1);
    // Rows that left keep their blocks on the workers until the next step (after a join's
    // prefill): those are not given back yet.
    if (b.kv_held > 2 * want + b.leaving) kv_trim(id, b, want + b.leaving, out);
  }
  // The join's steps and the next one share the spare: each grows a pool only once the
  // free blocks before it are taken, so together they stay within what the batch holds.
  const auto spare = kv_spare(b, joiners);
  plan_joins(id, b, std::move(joiners), spare, out);
  if (!b.going.empty() || !out.joins.empty()) {
    out.steps.push_back(id);
    step_plan next;
    next.batch = id;
    for (auto k : b.going)
      if (auto* e = row_of(b, k)) next.rows.push_back(decode_row(*e, b.steps_run[k]));
    next.finished = b.left_rows;
    std::sort(next.finished.begin(), next.finished.end());
    name_blocks(b, next);
    next.kv_spare = spare;
    out.plans.push_back(std::move(next));
  }
}

void dispatcher::plan_joins(batch_id id, batch_state& b, std::vector<queued_entry> joiners,
                            int64_t spare, dispatch_effects& out) {
  const auto model = b.model;
  const auto chunk = static_cast<int64_t>(batcher_->options().prefill_chunk);
  // A prefill is a step of its own before the batch's next: the joiners have run one step
  // (and generated a token) when the next boundary counts the step they share.
  auto join = [&](batch_id jid, std::vector<queued_entry> rows, int64_t c) {
    for (auto& e : rows) {
      b.rows.push_back(e);
      b.steps_run[e.key] = 1;
    }
    auto step = join_step_plan(jid, id, rows, static_cast<int32_t>(c), 0);
    name_blocks(b, step);
    step.kv_spare = spare;
    out.joins.push_back({id, jid, model, std::move(rows), static_cast<int32_t>(c), 0, step});
  };
  // A chunk that leaves `left` tokens of every prompt: its rows join nothing yet.
  auto chunk_of = [&](batch_id jid, const std::vector<queued_entry>& rows, int64_t n,
                      int64_t left) {
    const auto c = static_cast<int32_t>(n), l = static_cast<int32_t>(left);
    auto step = join_step_plan(jid, id, rows, c, l);
    name_blocks(b, step);
    step.kv_spare = spare;
    out.joins.push_back({id, jid, model, rows, c, l, std::move(step)});
  };
  if (b.chunking) {
    // The next chunk; with no row running nothing stalls, so the rest goes at once.
    auto& c = *b.chunking;
    const auto n = b.going.empty() ? c.left : std::min(chunk, c.left);
    c.left -= n;
    if (c.left > 0) {
      chunk_of(c.id, c.rows, n, c.left);
      return;
    }
    auto done = std::move(c);
    b.chunking.reset();
    join(done.id, std::move(done.rows), n);
    return;
  }
  if (joiners.empty()) return;
  int64_t longest = 0;
  bool whole = false;
  for (auto& e : joiners) {
    longest = std::max(longest, std::max<int64_t>(1, e.prompt_tokens));
    whole = whole || e.whole_prefill;
  }
  if (chunk > 0 && longest > chunk && !whole && !b.going.empty()) {
    // Chunks of `chunk` tokens, the prompts ending together in the last; the first takes
    // what the others leave of the longest.
    auto left = (longest - 1) / chunk * chunk;
    b.chunking = batch_state::chunked_join{next_batch_++, std::move(joiners), left};
    chunk_of(b.chunking->id, b.chunking->rows, longest - left, left);
    return;
  }
  join(next_batch_++, std::move(joiners), 0);
}

dispatch_effects dispatcher::kv_granted(batch_id id, uint32_t model, uint64_t blocks,
                                        uint64_t ceiling, time_point now) {
  dispatch_effects out;
  auto i = batches_.find(id);
  if (i == batches_.end()) {
    // Its batch is gone (it failed meanwhile): the blocks go straight back.
    if (blocks > 0) out.kv_returns.push_back({model, blocks, id});
    return out;
  }
  auto& b = i->second;
  b.kv_held += blocks;
  auto waiting = b.waiting;
  b.waiting = kv_wait::none;
  if (waiting == kv_wait::step) {
    kv_continue(id, b, ceiling, now, out);
    return out;
  }
  if (waiting != kv_wait::start) return out;
  // The rows that fit, in queue order; the rest go back to the front of the queue, or
  // fail when they could never fit.
  std::vector<queued_entry> keep, back;
  uint64_t used = 0;
  for (auto& e : b.rows) {
    auto need = kv_need(e, 1);
    // One that could never reach its last token fails now, not after computing most of it.
    if (std::find(b.cancelled.begin(), b.cancelled.end(), e.key) != b.cancelled.end())
      out.failures.push_back({b.model, e, row_end::cancelled, id});
    else if (kv_need(e, e.steps) > ceiling)
      out.failures.push_back({b.model, e, row_end::no_kv_room, id});
    else if (back.empty() && used + need <= b.kv_held) {
      used += need;
      keep.push_back(e);
    } else {
      back.push_back(e);
    }
  }
  batcher_->push_front(b.model, back);
  if (!back.empty()) out.preempted.push_back({id, b.model, back});
  if (keep.empty()) {
    // Nothing fits now: the lease goes back and the model forms no batch until room
    // comes back (a batch ends), or it would form this one again at once.
    kv_trim(id, b, 0, out);
    out.releases.push_back({id, b.model});
    batcher_->batch_ended(b.model);
    if (!back.empty()) {
      batcher_->set_blocked(b.model, true);
      blocked_.push_back(b.model);
      // Room also comes back where this core hears nothing (a load ends, another
      // scheduler's batch): try again a little later whatever happens.
      arm(now + kv_retry, now, out);
    }
    batches_.erase(i);
    dispatch_pass(now, out);
    return out;
  }
  b.rows = std::move(keep);
  runnable_.push_back(id);
  run_pass(now, out);
  return out;
}

void dispatcher::name_blocks(batch_state& b, step_plan& p) {
  auto& ids = models_[b.model].block_ids;
  for (auto& r : p.rows) {
    auto& table = b.tables[r.key];
    const auto need = static_cast<size_t>(p.blocks_after(r));
    if (table.size() >= need) continue;
    r.blocks = ids.take(need - table.size());
    table.insert(table.end(), r.blocks.begin(), r.blocks.end());
  }
}

void dispatcher::free_row(batch_state& b, uint64_t key) {
  auto t = b.tables.find(key);
  if (t == b.tables.end()) return;
  b.freed.insert(b.freed.end(), t->second.begin(), t->second.end());
  b.tables.erase(t);
}

dispatch_effects dispatcher::tick(time_point now) {
  dispatch_effects out;
  ticks_.erase(ticks_.begin(), ticks_.upper_bound(now));
  unblock();
  if (replan_at_ && *replan_at_ <= now) replan(now, out);
  // A re-plan armed behind an earlier tick (arm keeps only the earliest) is armed again.
  if (replan_at_) arm(*replan_at_, now, out);
  run_pass(now, out);
  dispatch_pass(now, out);
  return out;
}

}  // namespace computron::sched
