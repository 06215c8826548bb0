#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "engine/backend.hpp"
#include "engine/sampling.hpp"
#include "engine/step.hpp"
#include "models/host_tensor.hpp"
#include "models/sampling.hpp"

/// The engine seam: a runner is made from one shard's backend and runs the steps the
/// dispatch core planned, `step(step_input) -> step_output`. It owns what a batch keeps
/// between steps apart from the backend's caches: which rows (by the plan's keys) the caches
/// hold, in their order, and on the sampling rank each row's sampler. A shard worker runs
/// `step` on its compute lane and no longer interprets steps; `computron generate`'s
/// reference loop (actors::direct_generate) runs the same runners without actors.
namespace computron::engine {

/// What a step gives back on one shard.
struct step_output {
  /// Not the last stage: the hidden states for the next stage's runner.
  models::host_tensor hidden;
  /// The sampling rank (last stage, tensor-parallel rank 0): one token per row; empty for a
  /// chunk that leaves more of the prompts for later, and on every other rank.
  std::vector<int64_t> tokens;
  /// One per row when any row asks for log-probabilities; empty otherwise.
  std::vector<token_logprobs> logprobs;
  /// A prefill's rows' prompt log-probabilities (row_sampling::prompt_logprobs).
  std::vector<std::vector<token_logprobs>> prompt_logprobs;
};

/// Which rows of a batch's previous step go on in `plan`: their positions in `previous`
/// (the row keys the caches hold, in order), in the plan's order. Empty when every row goes
/// on in the same order. A key that is not in `previous`, or a position taken twice, is an
/// error (invalid_request): the plan does not describe this batch.
caf::expected<std::vector<int32_t>> kept_rows(const std::vector<uint64_t>& previous,
                                              const sched::step_plan& plan);

/// The rows a shard's caches hold, per batch, as the plans move them: a step's rows replace
/// its batch's (after kept_rows), a join appends the joining batch's rows after its
/// target's, and a batch's last step drops it. The runner keeps one; so do the tests' stand-in
/// workers, which check what a worker would do without running a model.
class batch_rows {
 public:
  /// The keep list of `plan`'s step over the rows its batch holds (kept_rows; empty for a
  /// batch this shard has not seen, whose step prefills: a decode step of one is refused),
  /// and the plan's rows become the batch's. On error nothing changes.
  caf::expected<std::vector<int32_t>> step(const sched::step_plan& plan);
  /// After a join's last step: `from`'s rows go after `into`'s, and `from` is gone. A key
  /// already in `into` (a row preempted there and prefilled again) no longer names its
  /// old position there.
  caf::error join(uint64_t from, uint64_t into);
  void end(uint64_t batch) { rows_.erase(batch); }
  bool holds(uint64_t batch) const { return rows_.count(batch) > 0; }
  /// The keys of a batch's rows, in order (empty: unknown).
  const std::vector<uint64_t>& of(uint64_t batch) const;
  size_t batches() const { return rows_.size(); }

 private:
  std::map<uint64_t, std::vector<uint64_t>> rows_;
};

class runner {
 public:
  /// `last_stage`: the backend returns logits; `samples`: this shard samples them (the last
  /// stage's tensor-parallel rank 0; its other ranks compute the same logits and answer no
  /// tokens).
  runner(std::shared_ptr<backend> b, bool last_stage, bool samples);

  /// Runs one step of a batch. `hidden`: the previous stage's output (null on the first).
  /// On an error the batch is gone here (its caches, rows and samplers): the manager fails
  /// its rows, and a later step of it is refused.
  caf::expected<step_output> step(const step_input& in, const models::host_tensor* hidden);

  /// Forgets a batch (the manager ended it early: failed, cancelled). A step of it that
  /// still arrives (a prefill a stage before this one sent on before the cancel came) is
  /// refused, so nothing of it is made again here.
  void end_batch(uint64_t batch);

  backend& compute() { return *backend_; }
  uint64_t kv_device_bytes() const { return backend_->kv_device_bytes(); }
  /// Batches it holds rows or samplers of (tests: nothing is left behind).
  size_t batches() const;

 private:
  caf::expected<step_output> run(const step_input& in, const models::host_tensor* hidden);

  std::shared_ptr<backend> backend_;
  bool last_stage_ = false;
  bool samples_ = false;
  batch_rows rows_;
  /// The sampling rank's: per batch, one sampler per row, in the rows' order.
  std::map<uint64_t, std::vector<models::sampler>> samplers_;
  /// The batches ended here, newest last (at most `remembered_ends`; the manager's batch
  /// ids only grow, so an old one never comes back).
  std::deque<uint64_t> ended_;
  std::set<uint64_t> ended_set_;
  static constexpr size_t remembered_ends = 4096;
};

}  // namespace computron::engine
