#include "engine/runner.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "common/error.hpp"

namespace computron::engine {

namespace {

/// A row's old position in a batch it joined again (preempted there, prefilled anew): no
/// key of the plans is ever this.
constexpr uint64_t gone = std::numeric_limits<uint64_t>::max();

const std::vector<uint64_t> no_rows;

}  // namespace

step_input prefill_step(uint64_t batch, std::vector<std::vector<int64_t>> prompts,
                        std::vector<row_sampling> sampling) {
  step_input in;
  in.plan.batch = batch;
  for (size_t r = 0; r < prompts.size(); ++r) {
    const auto n = std::max<int64_t>(1, static_cast<int64_t>(prompts[r].size()));
    in.plan.rows.push_back({r, n, 0, n});
  }
  in.prompts = std::move(prompts);
  in.sampling = std::move(sampling);
  return in;
}

void next_decode_step(step_input& in, std::vector<int64_t> tokens) {
  ++in.step;
  in.tokens = std::move(tokens);
  in.prompts.clear();
  in.sampling.clear();
  in.adapters.clear();
  for (auto& row : in.plan.rows) {
    row.computed += row.scheduled;
    row.scheduled = 1;
  }
  in.plan.chunk = 0;
  in.plan.left = 0;
  in.plan.into = 0;
}

caf::expected<std::vector<int32_t>> kept_rows(const std::vector<uint64_t>& previous,
                                              const sched::step_plan& plan) {
  std::vector<int32_t> keep;
  keep.reserve(plan.rows.size());
  std::vector<bool> taken(previous.size(), false);
  bool same = plan.rows.size() == previous.size();
  for (auto& row : plan.rows) {
    auto at = std::find(previous.begin(), previous.end(), row.key);
    if (row.key == gone || at == previous.end())
      return make_error(ec::invalid_request, "batch " + std::to_string(plan.batch) +
                                                 " holds no row " + std::to_string(row.key) +
                                                 " here");
    auto pos = static_cast<size_t>(at - previous.begin());
    if (taken[pos])
      return make_error(ec::invalid_request, "a step of batch " + std::to_string(plan.batch) +
                                                 " names row " + std::to_string(row.key) +
                                                 " twice");
    taken[pos] = true;
    same = same && pos == keep.size();
    keep.push_back(static_cast<int32_t>(pos));
  }
  if (same) keep.clear();
  return keep;
}

caf::expected<std::vector<int32_t>> batch_rows::step(const sched::step_plan& plan) {
  std::vector<uint64_t> keys;
  keys.reserve(plan.rows.size());
  for (auto& r : plan.rows) keys.push_back(r.key);
  auto i = rows_.find(plan.batch);
  if (i == rows_.end()) {
    if (plan.mode() == sched::step_mode::decode)
      return make_error(ec::invalid_request, "batch " + std::to_string(plan.batch) +
                                                 " holds no rows here to decode (ended, or "
                                                 "never prefilled)");
    rows_.emplace(plan.batch, std::move(keys));
    return std::vector<int32_t>{};
  }
  auto keep = kept_rows(i->second, plan);
  if (!keep) return keep.error();
  i->second = std::move(keys);
  return keep;
}

caf::error batch_rows::join(uint64_t from, uint64_t into) {
  auto f = rows_.find(from);
  auto t = rows_.find(into);
  if (f == rows_.end() || t == rows_.end())
    return make_error(ec::invalid_request, "rows of batch " + std::to_string(from) +
                                               " join batch " + std::to_string(into) +
                                               ", which is not held here");
  auto& to = t->second;
  for (auto k : f->second) std::replace(to.begin(), to.end(), k, gone);
  to.insert(to.end(), f->second.begin(), f->second.end());
  rows_.erase(f);
  return {};
}

const std::vector<uint64_t>& batch_rows::of(uint64_t batch) const {
  auto i = rows_.find(batch);
  return i == rows_.end() ? no_rows : i->second;
}

runner::runner(std::shared_ptr<backend> b, bool last_stage, bool samples)
    : backend_(std::move(b)), last_stage_(last_stage), samples_(samples && last_stage) {}

void runner::end_batch(uint64_t batch) {
  rows_.end(batch);
  samplers_.erase(batch);
  backend_->end_batch(batch);
  if (!ended_set_.insert(batch).second) return;
  ended_.push_back(batch);
  if (ended_.size() > remembered_ends) {
    ended_set_.erase(ended_.front());
    ended_.pop_front();
  }
}

size_t runner::batches() const {
  std::set<uint64_t> held;
  for (auto& [b, _] : samplers_) held.insert(b);
  size_t n = rows_.batches();
  for (auto b : held)
    if (!rows_.holds(b)) ++n;
  return n;
}

caf::expected<step_output> runner::step(const step_input& in, const models::host_tensor* hidden) {
  // Nothing of an ended batch is made again (its caches, rows or samplers), and it is not
  // ended twice.
  if (ended_set_.count(in.plan.batch) > 0)
    return make_error(ec::invalid_state,
                      "batch " + std::to_string(in.plan.batch) + " has ended here");
  auto out = run(in, hidden);
  // A failed step leaves nothing of its batch here: the manager fails its rows.
  if (!out) end_batch(in.plan.batch);
  return out;
}

caf::expected<step_output> runner::run(const step_input& in, const models::host_tensor* hidden) {
  const auto batch = in.plan.batch;
  if (in.plan.rows.empty())
    return make_error(ec::invalid_request,
                      "a step of batch " + std::to_string(batch) + " has no rows");
  if (in.plan.mode() == sched::step_mode::mixed)
    return make_error(ec::invalid_request,
                      "a step of batch " + std::to_string(batch) +
                          " mixes prefilling and decoding rows, which no backend runs yet");
  if (in.prefills() ? in.prompts.size() != in.rows() : in.tokens.size() != in.rows())
    return make_error(ec::invalid_request,
                      "a step of batch " + std::to_string(batch) + " plans " +
                          std::to_string(in.rows()) + " rows and brings " +
                          std::to_string(in.prefills() ? in.prompts.size() : in.tokens.size()) +
                          (in.prefills() ? " prompts" : " tokens"));
  // Which of the batch's rows go on: those its plan names, by key (the rows that left are
  // the plan's `finished`). A prefill's batch is new here, or a chunk's the same rows.
  auto keep = rows_.step(in.plan);
  if (!keep) return keep.error();
  auto r = backend_->run(in, *keep, hidden);
  if (!r) return r.error();
  step_output out;
  if (!last_stage_) {
    out.hidden = std::move(*r);
  } else if (samples_ && !in.partial_prefill()) {
    auto& samplers = samplers_[batch];
    if (!keep->empty() && !samplers.empty()) {
      // Rows that left the batch take their samplers with them.
      std::vector<models::sampler> kept;
      for (auto k : *keep) {
        if (static_cast<size_t>(k) >= samplers.size())
          return make_error(ec::invalid_state, "row " + std::to_string(k) + " of batch " +
                                                   std::to_string(batch) + " has no sampler");
        kept.push_back(std::move(samplers[static_cast<size_t>(k)]));
      }
      samplers = std::move(kept);
    }
    auto tokens =
        sample_rows(*r, samplers, in.sampling, in.prompts, &out.logprobs, &out.prompt_logprobs);
    if (!tokens) return tokens.error();
    out.tokens = std::move(*tokens);
  }
  if (in.plan.into != 0 && !in.partial_prefill()) {
    // The rows join a running batch: their caches, keys and samplers go after its own.
    const auto into = in.plan.into;
    // Checked before the backend joins its caches, so that a refused join leaves the
    // running batch as it was.
    auto to = samplers_.find(into);
    if (!rows_.holds(into) || (samples_ && to == samplers_.end()))
      return make_error(ec::invalid_request, "rows of batch " + std::to_string(batch) +
                                                 " join batch " + std::to_string(into) +
                                                 ", which is not held here");
    if (auto err = backend_->join_batch(batch, into)) return err;
    if (auto err = rows_.join(batch, into)) return err;
    if (samples_) {
      auto from = samplers_.find(batch);
      if (from != samplers_.end()) {
        for (auto& s : from->second) to->second.push_back(std::move(s));
        samplers_.erase(from);
      }
    }
  }
  if (in.last) end_batch(batch);
  return out;
}

}  // namespace computron::engine
