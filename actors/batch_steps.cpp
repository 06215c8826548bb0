// The manager's batches step by step: each step's fan-out to the first stage of every
// tensor-parallel rank and the join of their results, the step boundary (sched/step_rows:
// rows leave, join, or are preempted; the batch steps, waits for KV, ends or is stuck), and
// the end of a batch (its model, devices and caches released). Its rows' answers are
// batch_rows.cpp's. The manager's dispatch and run passes (model_manager.cpp) start
// batches here.
#include <algorithm>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <caf/all.hpp>

#include "actors/join.hpp"
#include "actors/model_manager_state.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "sched/step_rows.hpp"

namespace computron::actors::manager_detail {

namespace {

/// Has every worker of `model` drop the caches of batches `ids`. Each answers what its KV
/// pool then holds, and that goes to the ledger: it counts the pool's pages until then,
/// so no load is placed in pages a pool has not given back yet (a worker that does not
/// answer leaves them counted until the model's next step there reports). Once all have
/// answered (or failed to), `after` is carried out: the ended batch's KV blocks go back
/// only then. Until the caches are gone their blocks are the batch's in the ledger;
/// given back earlier, a pool of the model growing in another batch's step would hold more
/// than the ledger counts, its last report being the bigger figure of the two, not their
/// sum. The worker bounds its lane's wait by the step timeout; this waits longer, for its
/// answer either way.
void drop_caches(manager_pointer self, const std::string& model, const std::vector<uint64_t>& ids,
                 sched::dispatch_effects after) {
  auto& st = self->state;
  const auto& devices = st.models.at(model).cfg.devices;
  auto left = std::make_shared<size_t>(ids.size() * devices.size());
  auto rest = std::make_shared<sched::dispatch_effects>(std::move(after));
  auto one_done = [=] {
    if (--*left == 0) carry_out(self, std::move(*rest));
  };
  if (*left == 0) carry_out(self, std::move(*rest));
  for (auto id : ids)
    for (auto w : devices)
      self->request(st.workers[static_cast<size_t>(w)], 2 * st.opts.step_timeout, cancel_atom_v,
                    model, id)
          .then(
              [=](uint64_t bytes) {
                self->send(self->state.scheduler, kv_pool_atom_v, model, std::vector<int32_t>{w},
                           std::vector<uint64_t>{bytes});
                one_done();
              },
              [=](caf::error&) { one_done(); });
}

}  // namespace

/// Ends a batch: on error every row still running fails with it; either way the model,
/// its devices and (where the last step did not) the workers' caches are released.
void finish_batch(manager_pointer self, const batch_ptr& b, const caf::error* err) {
  auto& st = self->state;
  set_running(self, b, 0);
  std::vector<uint64_t> dropping;
  if (err || !b->caches_dropped) dropping.push_back(b->id);
  // A chunked prefill under way has caches of its own.
  if (b->pending_id != 0) dropping.push_back(b->pending_id);
  auto& m = st.models.at(b->model);
  if (err) {
    for (auto r : b->sent) reply_error(self, b->rows[r], *err);
    for (auto r : b->pending) reply_error(self, b->rows[r], *err);
  }
  // The lanes are still the batch's: a re-plan moves a model only once its batches ended.
  st.opts.obs->batch_done(b->model, m.cfg.devices, st.disp->lanes_of(m.index), b->peak_rows,
                          b->run_s, now_s() - b->run_s);
  release_adapters(self, b);
  // Its devices, lease and in-flight slot are free: the next batches may start (and the
  // model may be unloaded). Its KV blocks go back once its caches are gone from the
  // workers (drop_caches); the ledger counts them until then, evicted or not.
  auto e = st.disp->batch_done(b->id, now(self), !err, b->compute_ms / 1e3, b->steps);
  if (!dropping.empty()) {
    sched::dispatch_effects after;
    auto mine = std::stable_partition(e.kv_returns.begin(), e.kv_returns.end(),
                                      [&](auto& r) { return r.batch != b->id; });
    after.kv_returns.assign(mine, e.kv_returns.end());
    e.kv_returns.erase(mine, e.kv_returns.end());
    drop_caches(self, b->model, dropping, std::move(after));
  }
  carry_out(self, std::move(e));
}

namespace {

/// How long a running batch waits for a joining row's adapter lease (see join_rows): its
/// running rows wait too.
constexpr std::chrono::milliseconds join_adapter_wait{10000};

/// A step found a device full where the ledger counted room (a pool's pages still going
/// while a load was placed there): its rows go back to the front of the queue to be
/// recomputed, as preempted rows do, rather than fail (issue 44: no request fails for room
/// that waiting would give). A row requeued so max_room_requeues times fails with the step.
constexpr uint32_t max_room_requeues = 8;

void requeue_for_room(manager_pointer self, const batch_ptr& b) {
  // The dispatch core queues every row it ran; a row past the bound is not the manager's
  // any more, and the core skips its key, as a row cancelled in the queue.
  auto keys = self->state.disp->requeue_rows(b->id);
  std::unordered_set<uint64_t> back(keys.begin(), keys.end());
  size_t requeued = 0;
  auto requeue_from = [&](std::vector<size_t>& rows) {
    std::vector<size_t> stay;
    for (auto r : rows) {
      auto& q = b->rows[r];
      // Its client withdrew it (or has what it wants): it ends here, as at a boundary.
      if (b->cancelled.count(q.req.id) > 0) {
        finish_row(self, b, r, b->completed.count(q.req.id) > 0 ? "stop" : "cancelled");
        continue;
      }
      if (back.count(q.key) > 0 && q.room_requeues < max_room_requeues) {
        ++q.room_requeues;
        ++requeued;
        requeue(self, b, r);
      } else {
        stay.push_back(r);
      }
    }
    rows = std::move(stay);
  };
  requeue_from(b->sent);
  requeue_from(b->pending);
  if (requeued > 0) log::info("batch {}: {} rows go back to the queue", b->id, requeued);
}

/// Sends `req` to the first stage of every tensor-parallel rank of the batch's model (each
/// rank's route runs through its stages) and joins their answers: `done` gets rank 0's
/// (the sampling rank's). A rank that fails ends the batch.
void send_step(manager_pointer self, const batch_ptr& b, step_request req,
               std::chrono::milliseconds timeout, std::function<void(step_result&)> done) {
  auto& st = self->state;
  auto& m = st.models.at(b->model);
  const auto tp = static_cast<size_t>(m.cfg.tp);
  const auto pp = static_cast<size_t>(m.cfg.pp);
  const auto step = req.input.step;
  // A gpu-let's steps take longer by its share (and busy partners): so may the answer.
  timeout = sched::gpulet_timeout(st.disp->gpulets().plan, timeout, st.disp->run_share(m.index));
  req.lanes.interference = st.disp->gpulets().plan.interference;
  auto j = make_join<step_result>(
      tp,
      [=](std::vector<step_result> results) {
        // Every worker of every rank said what its KV pool holds: the ledger's figure.
        std::vector<int32_t> devs;
        std::vector<uint64_t> bytes;
        for (auto& r : results) {
          devs.insert(devs.end(), r.kv_devices.begin(), r.kv_devices.end());
          bytes.insert(bytes.end(), r.kv_pool_bytes.begin(), r.kv_pool_bytes.end());
        }
        if (!devs.empty())
          self->send(self->state.scheduler, kv_pool_atom_v, b->model, std::move(devs),
                     std::move(bytes));
        done(results[0]);
      },
      [=](caf::error err, size_t rank) {
        // The code stays (a device error is a 500, a timed-out join a 503); the text says
        // which model, step and rank.
        auto where = fmt::format("model {} step {} (rank {})", b->model, step, rank);
        if (err == caf::sec::request_timeout)
          where += fmt::format(": no answer within {} ms", timeout.count());
        err = with_context(err, where);
        log::warn("batch {} failed: {}", b->id, render(err));
        if (is(err, ec::out_of_device_memory)) requeue_for_room(self, b);
        finish_batch(self, b, &err);
      });
  // The lanes the dispatch core runs the model on: fixed while a batch of it runs.
  const auto& lanes = st.disp->lanes_of(m.index);
  for (size_t rank = 0; rank < tp; ++rank) {
    auto r = req;
    for (size_t stage = 0; stage < pp; ++stage) {
      auto pos = stage * tp + rank;
      r.route.push_back(
          caf::actor_cast<step_stage_actor>(st.workers[static_cast<size_t>(m.cfg.devices[pos])]));
      r.lanes.lanes.push_back(pos < lanes.size() ? lanes[pos] : 0);
      r.lanes.shares.push_back(st.disp->share_of(m.index, pos));
      r.lanes.partitions.push_back(st.disp->partition_of(m.index, pos));
    }
    auto first = r.route[0];
    // Bounded by the manager's tick, not a CAF timeout (model_manager_state::step_waits).
    auto w = std::make_shared<reply_wait>();
    w->deadline = now(self) + timeout;
    w->expire = [=] { j->failed(make_error(caf::sec::request_timeout), rank); };
    watch_step(self, w);
    self->request(first, caf::infinite, step_atom_v, std::move(r))
        .then(
            [=](step_result& res) {
              if (w->answer()) j->ok(rank, std::move(res));
            },
            [=](caf::error& e) {
              if (w->answer()) j->failed(std::move(e), rank);
            });
  }
}

/// The step answered `b->sent.size()` tokens? Else the batch ends with an error.
bool check_tokens(manager_pointer self, const batch_ptr& b, const step_result& res, size_t rows) {
  if (res.tokens.size() == rows) return true;
  auto e = make_error(ec::invalid_state, "step returned " + std::to_string(res.tokens.size()) +
                                             " tokens for " + std::to_string(rows) + " rows");
  finish_batch(self, b, &e);
  return false;
}

/// The one place a step's request takes what the dispatch core's plan decided: the plan
/// itself (the batch id it runs under, the join and the chunk, the KV blocks the pools may
/// take), with its rows as `rows` has them (indices into b->rows, in the plan's order: a row
/// cancelled in the queue is not among them), and per row its prompt or its last token.
/// The workers keep the rows of the batch's previous step that it names, by key. Returns
/// the tokens the step computes (its deadline's and the step fit's figure).
int64_t request_from_plan(const batch_ptr& b, const sched::step_plan& plan,
                          const std::vector<size_t>& rows, step_request& req) {
  req.model = b->model;
  auto& in = req.input;
  in.plan = plan;
  in.plan.rows.clear();
  for (auto r : rows) {
    auto& q = b->rows[r];
    auto p = std::find_if(plan.rows.begin(), plan.rows.end(),
                          [&](const sched::planned_row& x) { return x.key == q.key; });
    if (p != plan.rows.end() && !p->decoding()) {
      // The sampling rank keeps each row's sampler from the prefill on: the settings
      // (bias and stop lists included) travel once, not with every decode step.
      in.prompts.push_back(q.req.tokens);
      in.sampling.push_back(q.req.sampling);
      in.adapters.push_back(q.adapter);
      in.plan.rows.push_back(*p);
    } else {
      in.tokens.push_back(b->outputs[r].back());
      // Its caches hold its prompt and every token it generated but the last.
      const auto n = std::max<int64_t>(1, static_cast<int64_t>(q.req.tokens.size()));
      in.plan.rows.push_back(
          p != plan.rows.end()
              ? *p
              : sched::planned_row{q.key, n, n + static_cast<int64_t>(b->outputs[r].size()) - 1,
                                   1});
    }
  }
  // Rows of the base alone name no adapters.
  if (std::all_of(in.adapters.begin(), in.adapters.end(), [](auto& a) { return a.empty(); }))
    in.adapters.clear();
  return in.plan.tokens();
}

/// Carries the rows' one deadline to the workers (step_request::deadline_ms): the time
/// left to the latest answer_limit of the batch's rows, and what a step of `tokens`
/// tokens is expected to take (the model's step fit).
void set_deadline(manager_pointer self, const batch_ptr& b, step_request& req, int64_t tokens) {
  auto& st = self->state;
  // Every live row of the batch: a failed step fails them all (the running rows, a
  // chunked join's and the joiners).
  sched::time_point latest{};
  const auto grace = st.queues().options().late_grace;
  for (auto& q : b->rows) {
    if (q.deadline == sched::time_point{}) return;  // one without a deadline: none
    latest = std::max(latest, sched::answer_limit(q.deadline, q.req.drop_late, grace));
  }
  if (latest == sched::time_point{}) return;
  auto left_ms = sched::seconds_between(now(self), latest) * 1e3;
  req.deadline_ms = std::max<int64_t>(1, static_cast<int64_t>(left_ms));
  // This step's tokens on the model's fitted line, not one mean over prefills and decodes.
  auto line = st.models.at(b->model).steps.fitted();
  req.expected_ms = (line.fixed_s + line.per_token_s * static_cast<double>(tokens)) * 1e3;
}

/// A step of `tokens` tokens sent at `sent_s` (now_s) took `compute_ms` over its stages:
/// the batch's compute; and its model's step fit learns the step's round trip (compute,
/// the hops between stages, sampling), which is what a step costs a batch. `res` is the
/// step's result: its compute, and how busy its gpu-let's partners were.
void note_step(manager_pointer self, const batch_ptr& b, int64_t tokens, double sent_s,
               const step_result& res, bool loading = false) {
  b->compute_ms += res.compute_ms;
  // A step that also waited for its model's load is not a step's cost (the simulator
  // models loads apart).
  if (loading) return;
  auto& st = self->state;
  auto m = st.models.find(b->model);
  if (m == st.models.end()) return;
  const double took = std::max(0.0, now_s() - sent_s);
  m->second.steps.add(static_cast<double>(tokens), took);
  if (!st.disp->gpulets().enabled()) return;
  // The planner's profile: the step's cost at the share it ran at (its slowest lane's),
  // without the slowdown its busy partners caused, which the planner predicts and adds
  // for the partners each plan gives it (counted twice otherwise: a model that ran beside
  // busy partners would look slower, and get a larger share, than it is).
  const double alone =
      took / sched::interference_slowdown(st.disp->gpulets().plan, res.partner_busy);
  m->second.steps_at[st.disp->run_share(m->second.index)].add(static_cast<double>(tokens), alone);
  std::map<int32_t, sched::step_fit::line> cost;
  for (auto& [s, fit] : m->second.steps_at) cost[s] = fit.fitted();
  st.disp->set_profile(m->second.index, std::move(cost),
                       static_cast<double>(m->second.cfg.slo_ms) / 1e3);
}

void prefill_joiners(manager_pointer self, const batch_ptr& b, const sched::join_plan& plan,
                     int64_t step, std::vector<size_t> joined);

/// Prefills the requests of `plan` as their own batch and appends them to `b` (every
/// stage joins the caches and samplers), then runs b's next step over its rows that went
/// on and the joined rows.
void join_rows(manager_pointer self, const batch_ptr& b, const sched::join_plan& plan,
               int64_t step) {
  auto& st = self->state;
  auto t = now(self);
  std::vector<size_t> joined;
  if (plan.chunk > 0 && b->pending_id == plan.id) {
    // A later chunk: its rows came with the first.
    joined = b->pending;
  } else {
    for (auto& row : plan.rows) {
      auto i = st.waiting.find(row.key);
      if (i == st.waiting.end()) continue;  // cancelled in the queue
      i->second.taken = t;
      i->second.joined = true;
      st.batch_of[i->second.req.id] = b;
      joined.push_back(b->rows.size());
      b->rows.push_back(std::move(i->second));
      st.waiting.erase(i);
      b->outputs.emplace_back();
      b->logprobs.emplace_back();
      b->prompt_logprobs.emplace_back();
    }
  }
  // Rows with adapters the batch does not hold yet join once those are leased; a row
  // whose adapter cannot be had fails alone (the next boundary no longer counts it). The
  // batch waits meanwhile, so the wait is bounded: an adapter with no room beside the
  // running rows' (their leases free it only when they end) fails its row with
  // unavailable, which a client may retry, rather than stall the batch.
  lease_adapters(
      self, b, joined,
      [=](std::map<std::string, caf::error> failed) mutable {
        joined = drop_failed_adapters(self, b, std::move(joined), failed);
        prefill_joiners(self, b, plan, step, std::move(joined));
      },
      join_adapter_wait);
}

/// join_rows' second half: `joined` (indices into b->rows) are prefilled and join.
void prefill_joiners(manager_pointer self, const batch_ptr& b, const sched::join_plan& plan,
                     int64_t step, std::vector<size_t> joined) {
  auto& st = self->state;
  if (joined.empty()) {
    // Every joiner was cancelled in the queue or lost its adapter: with no running row
    // left either, the batch ends here (a step of no rows is refused by the workers).
    if (b->sent.empty() && b->pending.empty()) {
      finish_batch(self, b, nullptr);
      return;
    }
    run_step(self, b, step + 1);
    return;
  }
  step_request req;
  const auto tokens = request_from_plan(b, plan.step, joined, req);
  const auto pp = st.models.at(b->model).cfg.pp;
  set_deadline(self, b, req, tokens);
  if (plan.chunk > 0) st.opts.obs->prefill_chunk(b->model, tokens);
  if (plan.partial()) {
    // A chunk of their prompts, then the running rows' next step: they wait for a chunk,
    // not a whole long prompt. The chunk's rows stay pending (failed with the batch).
    b->pending = joined;
    b->pending_id = plan.id;
    ++b->steps;
    const double sent_s = now_s();
    send_step(self, b, std::move(req), st.opts.step_timeout * static_cast<int>(pp),
              [=](step_result& res) mutable {
                note_step(self, b, tokens, sent_s, res);
                run_step(self, b, step + 1);
              });
    return;
  }
  // The rows join now (an error fails them with the others, as running rows; the plan
  // joins them into b); the join's id stays until it succeeds, so that a failure ends its
  // caches on every stage.
  b->pending.clear();
  // An error from here on fails the joined rows with the others.
  auto going = b->sent;
  b->sent.insert(b->sent.end(), joined.begin(), joined.end());
  for (auto r : joined) b->rows[r].batch_rows = static_cast<uint32_t>(b->sent.size());
  set_running(self, b, b->sent.size());
  ++b->steps;
  const double sent_s = now_s();
  send_step(self, b, std::move(req), st.opts.step_timeout * static_cast<int>(pp),
            [=](step_result& res) mutable {
              if (!check_tokens(self, b, res, joined.size())) return;
              b->pending_id = 0;
              note_step(self, b, tokens, sent_s, res);
              for (size_t j = 0; j < joined.size(); ++j)
                if (take_token(self, b, joined[j], j, res, true)) {
                  going.push_back(joined[j]);
                  // It decodes in the batch's next step, whose plan the boundary gave.
                  for (auto& e : plan.rows)
                    if (e.key == b->rows[joined[j]].key)
                      b->next.rows.push_back(sched::decode_row(e, 1));
                }
              b->sent = std::move(going);
              set_running(self, b, b->sent.size());
              if (b->sent.empty()) {
                finish_batch(self, b, nullptr);
                return;
              }
              run_step(self, b, step + 1);
            });
}

}  // namespace

void watch_step(manager_pointer self, std::shared_ptr<reply_wait> w) {
  if (auto in = self->state.step_waits.watch(std::move(w), now(self)))
    self->delayed_send(self, *in, tick_atom_v);
}

void expire_step_waits(manager_pointer self) {
  if (auto in = self->state.step_waits.tick(now(self))) self->delayed_send(self, *in, tick_atom_v);
}

/// Runs step `step` of the rows in b->sent.
void run_step(manager_pointer self, const batch_ptr& b, int64_t step,
              const sched::step_plan* plan) {
  auto& st = self->state;
  auto& m = st.models.at(b->model);
  const auto pp = static_cast<size_t>(m.cfg.pp);
  step_request req;
  // The first step's plan came with its start; a decode step's with its boundary (and the
  // joiners that went on), its pools' spare with it: only this batch's boundaries change it.
  const auto tokens = request_from_plan(b, plan ? *plan : b->next, b->sent, req);
  req.input.step = static_cast<int32_t>(step);
  // The last step is the one no row can outlive (rows only ever finish earlier, and none
  // joins a batch whose caches are gone).
  int64_t left = 0;
  for (auto r : b->sent)
    left = std::max(left, b->rows[r].req.max_tokens - static_cast<int64_t>(b->outputs[r].size()));
  // A chunked join under way joins this batch's caches later: they stay.
  req.input.last = left <= 1 && b->pending.empty();
  b->caches_dropped = req.input.last;
  ++b->steps;
  set_deadline(self, b, req, tokens);
  const bool loading = step == 0 && b->loading;
  auto timeout = st.opts.step_timeout * static_cast<int>(pp);
  if (step == 0 && b->loading)  // it also waits for the load under way
    timeout += std::max<std::chrono::milliseconds>(
        30s, std::chrono::milliseconds(static_cast<int64_t>(4 * b->load_left_ms)));
  const double sent_s = now_s();
  send_step(self, b, std::move(req), timeout, [=](step_result& res) {
    if (!check_tokens(self, b, res, b->sent.size())) return;
    note_step(self, b, tokens, sent_s, res, loading);
    std::vector<size_t> next;
    for (size_t p = 0; p < b->sent.size(); ++p)
      if (take_token(self, b, b->sent[p], p, res, step == 0)) next.push_back(b->sent[p]);
    compact(b, next);
    set_running(self, b, b->sent.size());
    // With every row done the batch ends, unless a chunked join under way is to join it
    // (its boundary then runs the rest of the join at once).
    if (b->sent.empty() && b->pending.empty()) {
      finish_batch(self, b, nullptr);
      return;
    }
    // A step boundary: queued requests of the model may join (continuous batching), and
    // the rows' KV must fit the batch's blocks.
    std::vector<uint64_t> going;
    for (auto r : b->sent) going.push_back(b->rows[r].key);
    b->boundary_step = step;
    at_step_boundary(self, b, self->state.disp->step_boundary(b->id, going, now(self)));
  });
}

void at_step_boundary(manager_pointer self, const batch_ptr& b, sched::dispatch_effects e) {
  auto& st = self->state;
  // Rows that leave here: preempted ones go back to the queue to be recomputed, with what
  // they generated as part of their prompt; ones that can never fit fail.
  auto leavers = sched::leavers_at(e, b->id);
  if (!leavers.empty()) {
    std::vector<size_t> stay;
    for (size_t i = 0; i < b->sent.size(); ++i) {
      auto r = b->sent[i];
      auto& q = b->rows[r];
      if (!leavers.leaves(q.key)) {
        stay.push_back(r);
        continue;
      }
      if (auto f = leavers.failed.find(q.key); f != leavers.failed.end()) {
        if (b->running > 0) set_running(self, b, b->running - 1);
        reply_error(self, q, row_error(self, f->second, q));
        continue;
      }
      // Its client withdrew it meanwhile (or has what it wants): it ends here, not after a
      // recompute (the queue skips its key).
      if (b->cancelled.count(q.req.id) > 0) {
        finish_row(self, b, r, b->completed.count(q.req.id) > 0 ? "stop" : "cancelled");
        continue;
      }
      requeue(self, b, r);
    }
    compact(b, stay);
    set_running(self, b, b->sent.size());
  }
  // Adapters whose rows are done (or left) go back before any joiner asks for room.
  release_unused_adapters(self, b, e.joins);
  auto joins = std::move(e.joins);
  auto next = sched::next_at_boundary(e, b->id, !b->sent.empty() || !joins.empty());
  for (auto& p : e.plans)
    if (p.batch == b->id) b->next = std::move(p);
  if (next == sched::boundary_next::wait) st.at_boundary[b->id] = b;
  carry_out(self, std::move(e));
  switch (next) {
    case sched::boundary_next::wait:
      return;
    case sched::boundary_next::end:
      finish_batch(self, b, nullptr);
      return;
    case sched::boundary_next::stuck: {
      auto why = sched::boundary_stuck();
      auto err = make_error(why.code, why.reason);
      finish_batch(self, b, &err);
      return;
    }
    case sched::boundary_next::step:
      break;
  }
  auto step = b->boundary_step;
  if (joins.empty())
    run_step(self, b, step + 1);
  else
    join_rows(self, b, joins.front(), step);
}

}  // namespace computron::actors::manager_detail
