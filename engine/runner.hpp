#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
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
/// `step` on its compute lane and no longer interprets steps. It owns the rows' KV block
/// tables too: the dispatch core names the ids in its plans, and a backend gets each row's
/// whole table with its step. The libtorch backend's pool still places each block in its
/// chunks itself and checks the tables against what it holds; a backend whose KV lies at
/// fixed addresses (CUDA graphs) can read block i at slot i. `computron generate`'s
/// reference loop (engine/generate.hpp) runs the same runners without actors.
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

/// A row's KV block table: the ids the dispatch core named for it (sched/kv_block_ids.hpp),
/// in position order.
using block_table = std::vector<uint32_t>;

/// The rows a shard's caches hold, per batch, as the plans move them, with each row's KV
/// block table: a step's rows replace its batch's (after kept_rows) and gain the blocks
/// its plan names, a join appends the joining batch's rows after its target's, and a
/// batch's last step drops it. The runner keeps one; so do the tests' stand-in workers,
/// which check what a worker would do without running a model.
class batch_rows {
 public:
  /// The keep list of `plan`'s step over the rows its batch holds (kept_rows; empty for a
  /// batch this shard has not seen, whose step prefills: a decode step of one is refused),
  /// and the plan's rows become the batch's, each table extended by its new blocks.
  /// Refused (invalid_request) as well: a row whose table would not cover its positions
  /// after the step (planned_row::blocks_after), and a block named twice or held by a row
  /// of the batch that goes on. On error nothing changes. A block that a row of another
  /// batch holds ends that batch here: the dispatch core names a block again only after
  /// the step that dropped it ran everywhere, so that batch's end was lost (its node was
  /// cut off and came back); its id goes to `stale` for the caller to end its caches.
  caf::expected<std::vector<int32_t>> step(const sched::step_plan& plan,
                                           std::vector<uint64_t>* stale = nullptr);
  /// After a join's last step: `from`'s rows go after `into`'s, and `from` is gone. A key
  /// already in `into` (a row preempted there and prefilled again) no longer names its
  /// old position there.
  caf::error join(uint64_t from, uint64_t into);
  void end(uint64_t batch);
  bool holds(uint64_t batch) const { return rows_.count(batch) > 0; }
  /// The keys of a batch's rows, in order (empty: unknown).
  const std::vector<uint64_t>& of(uint64_t batch) const;
  /// Their block tables, in the same order.
  const std::vector<block_table>& tables(uint64_t batch) const;
  size_t batches() const { return rows_.size(); }
  /// Blocks the rows of every batch hold.
  size_t blocks_held() const { return held_.size(); }

 private:
  struct rows {
    std::vector<uint64_t> keys;
    std::vector<block_table> tables;
  };
  void release(const block_table& t);
  std::map<uint64_t, rows> rows_;
  /// Each held block's batch.
  std::unordered_map<uint32_t, uint64_t> held_;
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

  /// The backend's adapter calls (backend::bind_adapter, unbind_adapter), one at a time
  /// with steps and ends as those are.
  caf::error bind_adapter(const std::string& name, std::shared_ptr<gpu::weight_shard> weights);
  void unbind_adapter(const std::string& name);

  backend& compute() { return *backend_; }
  uint64_t kv_device_bytes() const { return backend_->kv_device_bytes(); }
  /// Batches it holds rows or samplers of (tests: nothing is left behind).
  size_t batches() const;

 private:
  caf::expected<step_output> run(const step_input& in, const models::host_tensor* hidden);

  /// Steps, ends and adapter calls one at a time. Its caller keeps them so already (one
  /// compute lane per runner), except while a model moves to another lane: a cancel's end
  /// or an adapter's unbind sent to the new lane could otherwise meet a step still running
  /// on the old one. Recursive: a failed step ends its batch.
  mutable std::recursive_mutex mtx_;
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
