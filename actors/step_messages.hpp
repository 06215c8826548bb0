#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/atoms.hpp"
#include "sched/gpulets.hpp"

/// The workers' step protocol: what one forward step of a batch carries through a chain of
/// shard workers (one per pipeline stage) and what comes back, with the sampling settings
/// and log-probabilities rows travel with. Part of the actor protocol (actors/messages.hpp
/// includes it); each struct has an inspect() so that it crosses processes unchanged.
namespace computron::actors {

/// How one sequence picks its tokens (models::sampling_params on the wire; the meanings
/// are documented there). Every default is neutral.
struct row_sampling {
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  double min_p = 0;
  double repetition_penalty = 1.0;
  double presence_penalty = 0;
  double frequency_penalty = 0;
  /// OpenAI's logit_bias as two parallel lists (ids, values).
  std::vector<int64_t> bias_ids{};
  std::vector<double> bias_values{};
  /// Until this many tokens were drawn, the ids in `suppress` (EOS and stop ids) cannot be.
  int64_t min_tokens = 0;
  std::vector<int64_t> suppress{};
  /// -1: no log-probabilities; k >= 0: the chosen token's and the top k.
  int32_t logprobs = -1;
  /// -1: none; k >= 0: the log-probability of each prompt token after the first, with the
  /// top k (echo with logprobs; the last stage computes every position's logits).
  int32_t prompt_logprobs = -1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, row_sampling& x) {
  return f(caf::meta::type_name("row_sampling"), x.temperature, x.top_k, x.top_p, x.seed, x.min_p,
           x.repetition_penalty, x.presence_penalty, x.frequency_penalty, x.bias_ids, x.bias_values,
           x.min_tokens, x.suppress, x.logprobs, x.prompt_logprobs);
}

/// One generated (or prompt) token's log-probability under the model's raw distribution,
/// with the most likely alternatives (row_sampling::logprobs of them), most likely first.
struct token_logprobs {
  float logprob = 0;
  std::vector<int64_t> top_ids;
  std::vector<float> top_logprobs;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprobs& x) {
  return f(caf::meta::type_name("token_logprobs"), x.logprob, x.top_ids, x.top_logprobs);
}

/// Activations between pipeline stages, as bytes (gpu::dtype as an integer).
struct tensor_payload {
  uint8_t dtype = 0;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_payload& x) {
  return f(caf::meta::type_name("tensor_payload"), x.dtype, x.shape, x.bytes);
}

struct step_request;
struct step_result;

/// What a step's route names: a worker's step protocol (every shard_worker_actor is one).
/// Declared here, not in interfaces.hpp, because step_request holds them.
using step_stage_actor =
    caf::typed_actor<caf::replies_to<atom::step_atom, step_request>::with<step_result>>;

/// One forward step of a batch through one shard. Step 0 is the prefill of `prompts`;
/// step k > 0 decodes `tokens` (one per sequence). Each stage sends it on to the next
/// stage's worker of the same tensor-parallel rank (`route`, one worker per stage), and
/// the reply travels back along the chain: the last stage's rank 0 samples the tokens.
struct step_request {
  std::string model;
  uint64_t batch_id = 0;
  int32_t step = 0;
  /// Pipeline stage this message is for (index into route).
  int32_t stage = 0;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int64_t> tokens;
  /// Step 0: each row's sampling settings (the sampling rank makes its samplers from them
  /// and keeps them); later steps may leave it empty.
  std::vector<row_sampling> sampling;
  tensor_payload hidden;
  /// The batch ends after this step: workers drop its caches.
  bool last = false;
  std::vector<step_stage_actor> route;
  /// Decode steps: which rows of the previous step go on (their positions in it, in
  /// order); rows that finished leave the caches and the samplers. Empty: all of them.
  std::vector<int32_t> keep;
  /// Step 0 of rows joining a running batch (continuous batching): after this prefill,
  /// every stage appends this batch's caches and samplers after those of batch
  /// `join_into`, and this batch id is gone. 0: an ordinary step.
  uint64_t join_into = 0;
  /// Chunked prefill (step 0 computed in several steps, so that a running batch's decode
  /// steps go between them instead of waiting for a whole long prompt): `prompts` are the
  /// whole prompts on every chunk, `prefill_chunk` > 0 is the most tokens of a prompt this
  /// step computes and `prefill_left` the tokens of each prompt left for later chunks. Row
  /// i computes the tokens of its prefill_window (common/prefill_window.hpp): the prompts
  /// end together, in the chunk with `prefill_left` 0, whose logits are sampled (earlier
  /// chunks answer no tokens and no logits). `prefill_chunk` 0: the whole prompt at once.
  int32_t prefill_chunk = 0;
  int32_t prefill_left = 0;
  /// The request's one deadline, carried to the workers: milliseconds left, when the
  /// request is sent, until the latest deadline of the step's rows (0: none), and the
  /// manager's estimate of the step's compute over all its stages. A stage that starts so
  /// late that the rest of the step cannot end in time refuses it (deadline_exceeded)
  /// instead of computing tokens nobody waits for; each stage passes on what is left.
  int64_t deadline_ms = 0;
  double expected_ms = 0;
  /// KV blocks the ledger holds for the model (on each of its devices) when the step was
  /// sent: a stage's block pool takes chunks of device memory beyond a step's own need only
  /// up to it, so that what the pools allocate is what the ledger counts. 0: no bound (a
  /// model whose KV is not in the ledger).
  int64_t kv_blocks = 0;
  /// Gpu-lets: per stage (as `route`), the compute lane of that stage's device this step
  /// runs on, the lane's share of the device's SMs (percent) and the device's partition
  /// (every lane's share, lane 0 first: a GPU splits its SMs for all its lanes at once).
  /// Empty: lane 0, the whole device.
  std::vector<int32_t> lanes{};
  std::vector<int32_t> shares{};
  std::vector<std::vector<int32_t>> partitions{};
  /// LoRA adapters (models/lora_adapter.hpp): step 0 (a first chunk, or rows joining),
  /// the adapter each row runs with, named as registered ("": the base alone), which
  /// every stage holds beside the model's shard. The rows keep theirs for the batch's
  /// later steps. Empty: every row runs the base alone.
  std::vector<std::string> adapters{};
  /// The plan's interference factor (sched::gpulet_options::interference): what the
  /// worker's wait for its lane and an emulated gpu-let's slowdown charge, as the manager
  /// and the simulator do, so that a node's workers need no setting of their own.
  double interference = sched::gpulet_options{}.interference;

  bool partial_prefill() const { return prefill_chunk > 0 && prefill_left > 0; }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_request& x) {
  return f(caf::meta::type_name("step_request"), x.model, x.batch_id, x.step, x.stage, x.prompts,
           x.tokens, x.sampling, x.hidden, x.last, x.route, x.keep, x.join_into, x.prefill_chunk,
           x.prefill_left, x.deadline_ms, x.expected_ms, x.kv_blocks, x.lanes, x.shares,
           x.partitions, x.adapters, x.interference);
}

/// The tokens a step produced (rank 0 of the last stage; other ranks answer empty).
struct step_result {
  std::vector<int64_t> tokens;
  /// Compute time summed over the stages of the chain.
  double compute_ms = 0;
  /// One per row when any row asks for log-probabilities (empty entries for the others);
  /// empty otherwise. (`{}`: aggregate initialisations may leave it out.)
  std::vector<token_logprobs> logprobs{};
  /// Step 0: per row, its prompt tokens' log-probabilities (from the second token on)
  /// where the row asks for them (row_sampling::prompt_logprobs); empty otherwise.
  std::vector<std::vector<token_logprobs>> prompt_logprobs{};
  /// Gpu-lets: the largest fraction of a stage's compute during which other lanes of its
  /// device were busy (0..1). What slowed the step beyond its share: the planner's step
  /// costs take it out (sched::interference_slowdown), as the planner adds it back.
  double partner_busy = 0;
  /// What each worker of the chain holds in its KV pool for the model after the step: its
  /// device, and the bytes of device pages the pool has mapped (the manager tells the
  /// scheduler, whose ledger never counts less for the model's KV there).
  std::vector<int32_t> kv_devices{};
  std::vector<uint64_t> kv_pool_bytes{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_result& x) {
  return f(caf::meta::type_name("step_result"), x.tokens, x.compute_ms, x.partner_busy, x.logprobs,
           x.prompt_logprobs, x.kv_devices, x.kv_pool_bytes);
}

}  // namespace computron::actors
