#pragma once

#include <functional>
#include <string>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/atoms.hpp"
#include "actors/messages.hpp"

/// Every typed actor handle of Computron, and nothing else defines one. Each handler's
/// comment says what it is for; the behaviours live in one .cpp per actor.
namespace computron::actors {

using namespace computron::atom;

/// A blocking job for a lane: runs on the lane's own thread; results travel back
/// through what the closure captured. Local only (never crosses the network).
struct lane_job {
  std::function<caf::error()> run;
};

/// One thread that runs blocking work (device copies, forward passes) in order, so
/// that nothing blocks CAF's scheduler threads (a detached actor, CAF_0.17.md §8).
using lane_actor = caf::typed_actor<
    /// Runs the job; replies true or the job's error.
    caf::replies_to<run_atom, lane_job>::with<bool>>;

/// One per device: owns the device, the host copies of its shards and their device
/// copies; nobody else touches them.
using shard_worker_actor = caf::typed_actor<
    /// Creates the host copy of a shard (weights seeded or read from a checkpoint).
    caf::replies_to<prepare_atom, shard_spec>::with<shard_report>,
    /// Copies the model's shard onto the device (chunked, asynchronous); replies when all
    /// of it arrived.
    caf::replies_to<load_atom, std::string>::with<transfer_report>,
    /// Frees the model's shard on the device; copies nothing back.
    caf::replies_to<evict_atom, std::string>::with<transfer_report>,
    /// Runs one forward step of a batch here and on the following stages.
    caf::replies_to<step_atom, step_request>::with<step_result>,
    /// Drops the caches of a batch that ended early (model, batch id).
    caf::reacts_to<cancel_atom, std::string, uint64_t>,
    /// The device's capacity, use and link, and the shards held.
    caf::replies_to<devices_atom>::with<device_report>>;

/// Owns device-memory decisions: residency per model, bytes per device, victims.
using swap_scheduler_actor = caf::typed_actor<
    /// Adds a model (its shards' devices and bytes); it starts offloaded.
    caf::replies_to<register_atom, model_placement>::with<bool>,
    /// Makes the model resident (loading it, evicting others if needed) and leases it:
    /// it will not be evicted until the matching release.
    caf::replies_to<acquire_atom, std::string>::with<lease>,
    /// Ends one lease of the model.
    caf::reacts_to<release_atom, std::string>,
    /// Loads the model without leasing it (explicit load from an operator).
    caf::replies_to<load_atom, std::string>::with<residency_report>,
    /// Evicts the model now; refused while batches hold leases on it.
    caf::replies_to<unload_atom, std::string>::with<residency_report>,
    /// Pins (never a victim) or unpins the model.
    caf::replies_to<pin_atom, std::string, bool>::with<residency_report>,
    /// Notes arrivals for the model (the cost-aware policy's demand estimate).
    caf::reacts_to<demand_atom, std::string, uint32_t>,
    /// Residency of every model.
    caf::replies_to<status_atom>::with<std::vector<residency_report>>,
    /// Bytes per device as the scheduler accounts them.
    caf::replies_to<devices_atom>::with<std::vector<device_usage>>>;

/// What serves requests: a model manager, or anything composed in front of managers
/// (a router). The frontend talks to one of these.
using serving_actor = caf::typed_actor<
    /// Completes one sequence.
    caf::replies_to<infer_atom, infer_request>::with<infer_reply>,
    /// Every registered model.
    caf::replies_to<list_atom>::with<std::vector<model_info>>,
    /// One model by name.
    caf::replies_to<info_atom, std::string>::with<model_info>,
    /// Makes a model resident now.
    caf::replies_to<load_atom, std::string>::with<model_info>,
    /// Evicts a model now.
    caf::replies_to<unload_atom, std::string>::with<model_info>,
    /// Every device's report.
    caf::replies_to<devices_atom>::with<std::vector<device_report>>>;

/// The model registry, per-model queues, batching and dispatch.
using model_manager_actor = serving_actor::extend<
    /// Registers a model: its shards are prepared on their workers.
    caf::replies_to<register_atom, model_config>::with<model_info>,
    /// The batch-window timer (the manager sends it to itself).
    caf::reacts_to<tick_atom>>;

/// Admission in front of a serving actor: request ids, per-model queue bounds
/// (overloaded, never unbounded memory), replies.
using frontend_actor = serving_actor;

/// One per machine: its shard workers and devices.
using node_actor = caf::typed_actor<
    /// Every device of this node.
    caf::replies_to<devices_atom>::with<std::vector<device_report>>,
    /// The shard workers, in device order (as caf::actor; cast to shard_worker_actor).
    caf::replies_to<workers_atom>::with<std::vector<caf::actor>>>;

}  // namespace computron::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(computron::actors::lane_job)
