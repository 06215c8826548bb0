// A batch's rows as the manager answers them: a row's token from a step (it goes on, or it
// is answered: a stop id, max_tokens, cancelled), a failed row, a preempted row going back
// to the queue to be recomputed, and the batch's rows compacted to those that go on. The
// steps that produce the tokens are batch_steps.cpp's.
#include <algorithm>
#include <set>

#include <caf/all.hpp>

#include "actors/model_manager_state.hpp"
#include "common/error.hpp"
#include "sched/step_rows.hpp"

namespace computron::actors::manager_detail {

void reply_error(manager_pointer self, queued_request& q, const caf::error& err) {
  self->state.batch_of.erase(q.req.id);
  auto outcome = is(err, ec::deadline_exceeded) ? "deadline_exceeded"
                 : is(err, ec::cancelled)       ? "cancelled"
                                                : "error";
  // Counted before the answer leaves: a client that reads the metrics next sees it.
  self->state.opts.obs->request_done(q.req.model, outcome,
                                     sched::seconds_between(q.arrival, now(self)));
  q.rp.deliver(err);
}

/// Answers one row: its tokens so far and why it ended.
void finish_row(manager_pointer self, const batch_ptr& b, size_t r, const std::string& reason,
                int64_t stop_id) {
  auto& st = self->state;
  auto& q = b->rows[r];
  st.batch_of.erase(q.req.id);
  auto t = now(self);
  infer_reply rep;
  request_timeline tl;
  tl.queue_s = sched::seconds_between(q.arrival, q.taken);
  tl.swap_s = q.joined ? 0 : b->load_ms / 1e3;
  if (q.first_token != sched::time_point{})
    tl.ttft_s = sched::seconds_between(q.arrival, q.first_token);
  tl.itl_s = std::move(q.itl_s);
  tl.e2e_s = sched::seconds_between(q.arrival, t);
  tl.finish_reason = reason;
  tl.prompt_tokens = static_cast<int64_t>(q.preemptions > 0 ? q.prompt_len : q.req.tokens.size());
  rep.id = q.req.id;
  // An adapter's row answers under the adapter's name (as vLLM's do), and counts there.
  const auto& served = served_name(q, *b);
  rep.model = served;
  // A row recomputed after a preemption answers what it generated before, then since.
  rep.tokens = std::move(q.prior_outputs);
  rep.logprobs = std::move(q.prior_logprobs);
  if (r < b->outputs.size())
    rep.tokens.insert(rep.tokens.end(), b->outputs[r].begin(), b->outputs[r].end());
  if (r < b->logprobs.size())
    rep.logprobs.insert(rep.logprobs.end(), b->logprobs[r].begin(), b->logprobs[r].end());
  tl.generation_tokens = static_cast<int64_t>(rep.tokens.size());
  if (q.preemptions > 0)
    rep.prompt_logprobs = std::move(q.prior_prompt_logprobs);
  else if (r < b->prompt_logprobs.size())
    rep.prompt_logprobs = std::move(b->prompt_logprobs[r]);
  rep.queue_ms = sched::seconds_between(q.arrival, q.taken) * 1e3;
  rep.load_ms = q.joined ? 0 : b->load_ms;
  rep.compute_ms = b->compute_ms;
  rep.total_ms = sched::seconds_between(q.arrival, t) * 1e3;
  rep.batch_size = q.batch_rows;
  rep.swapped = b->swapped && !q.joined;
  rep.finish_reason = reason;
  rep.stop_id = stop_id;
  // Counted before the answer leaves: a client that reads the metrics next sees it (and
  // no longer running).
  if (b->running > 0) set_running(self, b, b->running - 1);
  if (reason != "cancelled") {
    ++st.models.at(b->model).served;
    if (auto a = st.models.find(q.adapter); a != st.models.end()) ++a->second.served;
  }
  st.opts.obs->request_done(served, reason == "cancelled" ? "cancelled" : "ok",
                            sched::seconds_between(q.arrival, t));
  st.opts.obs->request_timeline(served, tl);
  q.rp.deliver(std::move(rep));
}

void set_running(manager_pointer self, const batch_ptr& b, size_t rows) {
  auto& n = self->state.running[b->model];
  n = n + rows - std::min(n, b->running);
  b->running = rows;
  b->peak_rows = std::max(b->peak_rows, rows);
  self->state.opts.obs->running_requests(b->model, n);
}

/// Row `r`'s token from position `p` of a step's result: the row goes on (true), or is
/// answered now and leaves the batch (cancelled, a stop id, max_tokens), so no decode step
/// is spent on a row that is done.
bool take_token(manager_pointer self, const batch_ptr& b, size_t r, size_t p, step_result& res,
                bool prefill) {
  auto& q = b->rows[r];
  auto token = res.tokens[p];
  auto t = now(self);
  if (q.first_token == sched::time_point{})
    q.first_token = t;
  else
    q.itl_s.push_back(sched::seconds_between(q.last_token, t));
  q.last_token = t;
  if (prefill && p < res.prompt_logprobs.size())
    b->prompt_logprobs[r] = std::move(res.prompt_logprobs[p]);
  if (b->cancelled.count(q.req.id) > 0) {
    finish_row(self, b, r, b->completed.count(q.req.id) > 0 ? "stop" : "cancelled");
    return false;
  }
  auto& stops = q.req.stop_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
    // The stop id was generated too: its log-probability comes last, as vLLM lists it
    // (lm-eval's loglikelihood reads the one token after an echoed prompt).
    if (q.req.sampling.logprobs >= 0 && p < res.logprobs.size())
      b->logprobs[r].push_back(std::move(res.logprobs[p]));
    finish_row(self, b, r, "stop", token);
    return false;
  }
  b->outputs[r].push_back(token);
  token_logprobs lp;
  if (q.req.sampling.logprobs >= 0 && p < res.logprobs.size()) {
    lp = std::move(res.logprobs[p]);
    b->logprobs[r].push_back(lp);
  }
  if (q.req.stream)
    self->send(q.req.stream, token_atom_v, q.req.id, q.req.stream_row, token, std::move(lp));
  if (static_cast<int64_t>(b->outputs[r].size()) >= q.req.max_tokens) {
    finish_row(self, b, r, "length");
    return false;
  }
  return true;
}

/// Keeps only the rows in `going` (indices into b->rows, in the workers' order) and those
/// of a chunked prefill under way: a batch that lives on as rows leave and join
/// (continuous batching) holds its live rows only, and b->sent numbers them 0..n-1 again.
void compact(const batch_ptr& b, const std::vector<size_t>& going) {
  std::vector<queued_request> rows;
  std::vector<std::vector<int64_t>> outputs;
  std::vector<std::vector<token_logprobs>> logprobs, prompt_logprobs;
  std::set<uint64_t> cancelled, completed;
  auto all = going;
  all.insert(all.end(), b->pending.begin(), b->pending.end());
  for (auto r : all) {
    auto id = b->rows[r].req.id;
    if (b->cancelled.count(id) > 0) cancelled.insert(id);
    if (b->completed.count(id) > 0) completed.insert(id);
    rows.push_back(std::move(b->rows[r]));
    outputs.push_back(std::move(b->outputs[r]));
    logprobs.push_back(std::move(b->logprobs[r]));
    prompt_logprobs.push_back(std::move(b->prompt_logprobs[r]));
  }
  b->rows = std::move(rows);
  b->outputs = std::move(outputs);
  b->logprobs = std::move(logprobs);
  b->prompt_logprobs = std::move(prompt_logprobs);
  b->cancelled = std::move(cancelled);
  b->completed = std::move(completed);
  b->sent.resize(going.size());
  for (size_t i = 0; i < b->sent.size(); ++i) b->sent[i] = i;
  for (size_t i = 0; i < b->pending.size(); ++i) b->pending[i] = going.size() + i;
}

/// Row `r` was preempted: its request goes back to the queue to be recomputed, what it
/// generated becoming part of its prompt (sched::recompute_budget, the dispatch core's
/// rule for its queued row), and its answer will start with what it generated so far.
void requeue(manager_pointer self, const batch_ptr& b, size_t r) {
  auto& st = self->state;
  auto& q = b->rows[r];
  auto& out = b->outputs[r];
  const auto generated = static_cast<int64_t>(out.size());
  // A row that generated nothing yet (its prefill's step failed) goes back as it came: its
  // answer has nothing before the recompute, its prompt's log-probabilities included.
  if (generated > 0 && q.preemptions++ == 0) {
    q.prompt_len = q.req.tokens.size();
    q.prior_prompt_logprobs = std::move(b->prompt_logprobs[r]);
  }
  auto budget = sched::recompute_budget(
      {static_cast<int64_t>(q.req.tokens.size()), q.req.max_tokens, q.req.sampling.min_tokens},
      generated);
  q.req.tokens.insert(q.req.tokens.end(), out.begin(), out.end());
  q.req.max_tokens = budget.max_tokens;
  q.req.sampling.min_tokens = budget.min_tokens;
  q.joined = false;
  q.prior_outputs.insert(q.prior_outputs.end(), out.begin(), out.end());
  q.prior_logprobs.insert(q.prior_logprobs.end(), b->logprobs[r].begin(), b->logprobs[r].end());
  st.batch_of.erase(q.req.id);
  st.opts.obs->preempted(b->model);
  st.waiting.emplace(q.key, std::move(q));
}

}  // namespace computron::actors::manager_detail
