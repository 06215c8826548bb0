#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/atoms.hpp"
#include "engine/step.hpp"
#include "sched/gpulets.hpp"

/// The workers' step protocol: what one forward step of a batch carries through a chain of
/// shard workers (one per pipeline stage) and what comes back, with the sampling settings
/// and log-probabilities rows travel with. Part of the actor protocol (actors/messages.hpp
/// includes it); each struct has an inspect() so that it crosses processes unchanged.
namespace computron::actors {

/// How one sequence picks its tokens, and a token's log-probabilities: the engine's
/// (engine/step.hpp), on the wire as they are.
using computron::engine::row_sampling;
using computron::engine::token_logprobs;

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

/// Gpu-lets: per stage (as a step's route), the compute lane of that stage's device the
/// step runs on, the lane's share of the device's SMs (percent) and the device's partition
/// (every lane's share, lane 0 first: a GPU splits its SMs for all its lanes at once).
/// Empty: lane 0, the whole device.
struct step_lanes {
  std::vector<int32_t> lanes{};
  std::vector<int32_t> shares{};
  std::vector<std::vector<int32_t>> partitions{};
  /// The plan's interference factor (sched::gpulet_options::interference): what the
  /// worker's wait for its lane and an emulated gpu-let's slowdown charge, as the manager
  /// and the simulator do, so that a node's workers need no setting of their own.
  double interference = sched::gpulet_options{}.interference;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_lanes& x) {
  return f(caf::meta::type_name("step_lanes"), x.lanes, x.shares, x.partitions, x.interference);
}

/// One forward step of a batch through one shard: the dispatch core's plan with its rows'
/// inputs (engine::step_input), the route and the lanes. Each stage runs it on its runner
/// and sends it on to the next stage's worker of the same tensor-parallel rank (`route`,
/// one worker per stage); the reply travels back along the chain: the last stage's rank 0
/// samples the tokens.
struct step_request {
  std::string model;
  computron::engine::step_input input;
  /// The previous stage's output (empty on the first stage).
  tensor_payload hidden;
  /// Pipeline stage this message is for (index into route).
  int32_t stage = 0;
  std::vector<step_stage_actor> route;
  step_lanes lanes{};
  /// The request's one deadline, carried to the workers: milliseconds left, when the
  /// request is sent, until the latest deadline of the step's rows (0: none), and the
  /// manager's estimate of the step's compute over all its stages. A stage that starts so
  /// late that the rest of the step cannot end in time refuses it (deadline_exceeded)
  /// instead of computing tokens nobody waits for; each stage passes on what is left.
  int64_t deadline_ms = 0;
  double expected_ms = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_request& x) {
  return f(caf::meta::type_name("step_request"), x.model, x.input, x.hidden, x.stage, x.route,
           x.lanes, x.deadline_ms, x.expected_ms);
}

/// The tokens a step produced (rank 0 of the last stage; other ranks answer empty).
struct step_result {
  std::vector<int64_t> tokens;
  /// Compute time summed over the stages of the chain.
  double compute_ms = 0;
  /// One per row when any row asks for log-probabilities (empty entries for the others);
  /// empty otherwise. (`{}`: aggregate initialisations may leave it out.)
  std::vector<token_logprobs> logprobs{};
  /// A prefill: per row, its prompt tokens' log-probabilities (from the second token on)
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
