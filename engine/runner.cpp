#include "engine/runner.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "common/error.hpp"
#include "sched/kv_blocks.hpp"

namespace computron::engine {

namespace {

/// A row's old position in a batch it joined again (preempted there, prefilled anew): no
/// key of the plans is ever this.
constexpr uint64_t gone = std::numeric_limits<uint64_t>::max();

const std::vector<uint64_t> no_rows;
const std::vector<block_table> no_tables;

}  // namespace

step_input prefill_step(uint64_t batch, std::vector<std::vector<int64_t>> prompts,
                        std::vector<row_sampling> sampling) {
  step_input in;
  in.plan.batch = batch;
  uint32_t next_block = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    const auto n = std::max<int64_t>(1, static_cast<int64_t>(prompts[r].size()));
    sched::planned_row row{r, n, 0, n};
    for (auto b = sched::kv_blocks_for(n); b-- > 0;) row.blocks.push_back(next_block++);
    in.plan.rows.push_back(std::move(row));
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
  // Rows never leave this loop's batch: the blocks named so far are ids 0 .. n - 1.
  uint32_t next_block = 0;
  for (auto& row : in.plan.rows)
    next_block += static_cast<uint32_t>(sched::kv_blocks_for(row.computed + row.scheduled));
  for (auto& row : in.plan.rows) {
    const auto had = sched::kv_blocks_for(row.computed + row.scheduled);
    row.computed += row.scheduled;
    row.scheduled = 1;
    row.blocks.clear();
    for (auto b = sched::kv_blocks_for(row.computed + 1) - had; b-- > 0;)
      row.blocks.push_back(next_block++);
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

caf::expected<std::vector<int32_t>> batch_rows::step(const sched::step_plan& plan,
                                                     std::vector<uint64_t>* stale) {
  // (An empty keep list means every row goes on: a plan of no rows would keep them all.)
  if (plan.rows.empty())
    return make_error(ec::invalid_request,
                      "a step of batch " + std::to_string(plan.batch) + " has no rows");
  auto i = rows_.find(plan.batch);
  std::vector<int32_t> keep;
  if (i == rows_.end()) {
    if (plan.mode() == sched::step_mode::decode)
      return make_error(ec::invalid_request, "batch " + std::to_string(plan.batch) +
                                                 " holds no rows here to decode (ended, or "
                                                 "never prefilled)");
  } else {
    auto k = kept_rows(i->second.keys, plan);
    if (!k) return k.error();
    keep = std::move(*k);
  }
  // Checked before anything changes: the rows' new blocks (none may be held by a row of
  // this batch that the step keeps, nor named twice), and every table must cover its
  // row's positions after the step. A block that a row of another batch holds is the
  // dispatch core's to name again only once that batch's caches are gone everywhere: the
  // batch is stale here (its end never came, as when its node was cut off) and ends.
  const size_t before = i == rows_.end() ? 0 : i->second.keys.size();
  std::vector<bool> kept(before, keep.empty());
  for (auto pos : keep) kept[static_cast<size_t>(pos)] = true;
  std::set<uint32_t> dropped;
  for (size_t r = 0; r < before; ++r)
    if (!kept[r]) dropped.insert(i->second.tables[r].begin(), i->second.tables[r].end());
  std::set<uint32_t> named;
  std::set<uint64_t> old;
  for (size_t r = 0; r < plan.rows.size(); ++r) {
    auto& row = plan.rows[r];
    for (auto id : row.blocks) {
      auto h = held_.find(id);
      const bool mine = h != held_.end() && h->second == plan.batch && dropped.count(id) == 0;
      if (mine || !named.insert(id).second)
        return make_error(ec::invalid_request, "a step of batch " + std::to_string(plan.batch) +
                                                   " gives row " + std::to_string(row.key) +
                                                   " KV block " + std::to_string(id) +
                                                   ", which a row of the batch holds");
      if (h != held_.end() && h->second != plan.batch) old.insert(h->second);
    }
    size_t had = 0;
    if (i != rows_.end())
      had = i->second.tables[keep.empty() ? r : static_cast<size_t>(keep[r])].size();
    const auto blocks = had + row.blocks.size();
    if (static_cast<int64_t>(blocks) < sched::kv_blocks_for(row.computed + row.scheduled))
      return make_error(ec::invalid_request, "a step of batch " + std::to_string(plan.batch) +
                                                 " leaves row " + std::to_string(row.key) + " " +
                                                 std::to_string(blocks) + " KV blocks for " +
                                                 std::to_string(row.computed + row.scheduled) +
                                                 " positions");
  }
  for (auto b : old) {
    end(b);
    if (stale) stale->push_back(b);
  }
  for (auto id : dropped) held_.erase(id);
  for (auto id : named) held_[id] = plan.batch;
  // (`i` survives: ending other batches erases only their own entries.)
  if (i == rows_.end()) i = rows_.emplace(plan.batch, rows{}).first;
  auto& mine = i->second;
  if (!keep.empty()) {
    std::vector<block_table> tables;
    tables.reserve(keep.size());
    for (auto pos : keep) tables.push_back(std::move(mine.tables[static_cast<size_t>(pos)]));
    mine.tables = std::move(tables);
  }
  mine.tables.resize(plan.rows.size());
  mine.keys.clear();
  for (size_t r = 0; r < plan.rows.size(); ++r) {
    mine.keys.push_back(plan.rows[r].key);
    auto& t = mine.tables[r];
    t.insert(t.end(), plan.rows[r].blocks.begin(), plan.rows[r].blocks.end());
  }
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
  for (auto k : f->second.keys) std::replace(to.keys.begin(), to.keys.end(), k, gone);
  to.keys.insert(to.keys.end(), f->second.keys.begin(), f->second.keys.end());
  for (auto& table : f->second.tables) {
    for (auto id : table) held_[id] = into;
    to.tables.push_back(std::move(table));
  }
  rows_.erase(f);
  return {};
}

void batch_rows::release(const block_table& t) {
  for (auto id : t) held_.erase(id);
}

void batch_rows::end(uint64_t batch) {
  auto i = rows_.find(batch);
  if (i == rows_.end()) return;
  for (auto& t : i->second.tables) release(t);
  rows_.erase(i);
}

const std::vector<uint64_t>& batch_rows::of(uint64_t batch) const {
  auto i = rows_.find(batch);
  return i == rows_.end() ? no_rows : i->second.keys;
}

const std::vector<block_table>& batch_rows::tables(uint64_t batch) const {
  auto i = rows_.find(batch);
  return i == rows_.end() ? no_tables : i->second.tables;
}

runner::runner(std::shared_ptr<backend> b, bool last_stage, bool samples)
    : backend_(std::move(b)), last_stage_(last_stage), samples_(samples && last_stage) {}

void runner::end_batch(uint64_t batch) {
  std::lock_guard<std::recursive_mutex> guard{mtx_};
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

caf::error runner::bind_adapter(const std::string& name,
                                std::shared_ptr<gpu::weight_shard> weights) {
  std::lock_guard<std::recursive_mutex> guard{mtx_};
  return backend_->bind_adapter(name, std::move(weights));
}

void runner::unbind_adapter(const std::string& name) {
  std::lock_guard<std::recursive_mutex> guard{mtx_};
  backend_->unbind_adapter(name);
}

size_t runner::batches() const {
  std::lock_guard<std::recursive_mutex> guard{mtx_};
  std::set<uint64_t> held;
  for (auto& [b, _] : samplers_) held.insert(b);
  size_t n = rows_.batches();
  for (auto b : held)
    if (!rows_.holds(b)) ++n;
  return n;
}

namespace {

/// Each row's next draw as a device can make it, when every row has one (empty otherwise).
/// A prefill's samplers are made here, before the step, when every row can be drawn on the
/// device; any other prefill makes them after it (sample_rows), as it always did.
std::vector<models::device_draw> device_draws(std::vector<models::sampler>& samplers,
                                              const step_input& in) {
  std::vector<models::device_draw> draws;
  if (samplers.empty() && in.prefills() && in.sampling.size() == in.rows() &&
      std::all_of(in.sampling.begin(), in.sampling.end(),
                  [](const row_sampling& s) { return device_drawable(s); }))
    for (size_t r = 0; r < in.sampling.size(); ++r)
      samplers.emplace_back(to_sampling_params(in.sampling[r]),
                            r < in.prompts.size() ? in.prompts[r] : std::vector<int64_t>{});
  if (samplers.size() != in.rows()) return draws;
  for (auto& s : samplers) {
    auto d = s.next_device_draw();
    if (!d) return {};
    draws.push_back(*d);
  }
  return draws;
}

}  // namespace

caf::expected<step_output> runner::step(const step_input& in, const models::host_tensor* hidden) {
  std::lock_guard<std::recursive_mutex> guard{mtx_};
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
  std::vector<uint64_t> stale;
  auto keep = rows_.step(in.plan, &stale);
  if (!keep) return keep.error();
  for (auto b : stale) end_batch(b);
  const bool sampling = last_stage_ && samples_ && !in.partial_prefill();
  std::vector<models::device_draw> draws;
  if (sampling) {
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
    draws = device_draws(samplers, in);
  }
  auto r = backend_->run(in, *keep, rows_.tables(batch), hidden, sampling ? &draws : nullptr);
  if (!r) return r.error();
  step_output out;
  if (!last_stage_) {
    out.hidden = std::move(*r);
  } else if (sampling) {
    auto& samplers = samplers_[batch];
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
