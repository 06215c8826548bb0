#pragma once

#include <functional>
#include <string>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/replies_to.hpp>
#include <caf/settings.hpp>
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

/// Status for operators, declared once: every actor that reports answers it with its own
/// figures (and those of whatever stands behind it); the controller merges them. Each
/// interface below adds it with extend_with.
using status_reporter_actor = caf::typed_actor<caf::replies_to<report_atom>::with<caf::settings>>;

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
    /// Starts that copy and replies once every chunk is queued (seconds 0): a forward step
    /// may run from then on, each layer waiting for its own bytes. A load_atom after it
    /// waits for the rest and reports the whole load's time.
    caf::replies_to<begin_load_atom, std::string>::with<transfer_report>,
    /// Frees the model's shard on the device; copies nothing back.
    caf::replies_to<evict_atom, std::string>::with<transfer_report>,
    /// Forgets the model's shard: its device copy and its host copy (the pinned host
    /// memory goes back). Replies whether it held one.
    caf::replies_to<unregister_atom, std::string>::with<bool>,
    /// Runs one forward step of a batch here and on the following stages.
    caf::replies_to<step_atom, step_request>::with<step_result>,
    /// Drops the caches of a batch that ended early (model, batch id). Replies the bytes
    /// of device pages the model's KV pool holds here after that: the ledger counts a
    /// pool's pages until its worker says they went (kv_pool_atom).
    caf::replies_to<cancel_atom, std::string, uint64_t>::with<uint64_t>,
    /// Its own timer (it sends it to itself): steps whose compute lane has not answered by
    /// their deadline fail (reply_waits).
    caf::reacts_to<tick_atom>,
    /// The device's capacity, use and link, and the shards held.
    caf::replies_to<devices_atom>::with<device_report>,
    /// Hosts the rendezvous of a tensor-parallel group whose ranks live on several
    /// nodes (group name, ranks); replies with the address the ranks meet at.
    caf::replies_to<group_atom, std::string,
                    int32_t>::with<std::string>>::extend_with<status_reporter_actor>;

/// A remote worker as the controller holds it: it relays every message to the worker
/// on its node and answers for it when that node is gone (promptly, where CAF would let
/// requests run into their timeouts).
using worker_guard_actor = shard_worker_actor::extend<
    /// The node came back: relay to this worker from now on, once the shards held before
    /// are prepared on it again. Replies true when it is serving again.
    caf::replies_to<rebind_atom, shard_worker_actor>::with<bool>>;

/// Owns device-memory decisions: residency per model, bytes per device, victims.
using swap_scheduler_actor = caf::typed_actor<
    /// Adds a model (its shards' devices and bytes); it starts offloaded.
    caf::replies_to<register_atom, model_placement>::with<bool>,
    /// Makes the model resident (loading it, evicting others if needed) and leases it:
    /// it will not be evicted until the matching release.
    caf::replies_to<acquire_atom, std::string>::with<lease>,
    /// Ends one lease of the model.
    caf::reacts_to<release_atom, std::string>,
    /// KV blocks for a running batch of the leased model (want, need, wait: see
    /// sched::residency::kv_reserve); replies with the blocks granted and the most the
    /// model could ever hold.
    caf::replies_to<kv_reserve_atom, std::string, uint64_t, uint64_t, bool>::with<uint64_t,
                                                                                  uint64_t>,
    /// A batch gives KV blocks back.
    caf::reacts_to<kv_return_atom, std::string, uint64_t>,
    /// The model's KV pools hold these bytes of device pages on these devices (after a
    /// step): the ledger counts the model's KV there as no less.
    caf::reacts_to<kv_pool_atom, std::string, std::vector<int32_t>, std::vector<uint64_t>>,
    /// Loads the model without leasing it (explicit load from an operator).
    caf::replies_to<load_atom, std::string>::with<residency_report>,
    /// Evicts the model now; refused while batches hold leases on it.
    caf::replies_to<unload_atom, std::string>::with<residency_report>,
    /// Forgets an offloaded model (refused otherwise): its name may then be registered
    /// again, with any placement.
    caf::replies_to<unregister_atom, std::string>::with<bool>,
    /// Pins (never a victim) or unpins the model.
    caf::replies_to<pin_atom, std::string, bool>::with<residency_report>,
    /// Notes arrivals for the model (the cost-aware policy's demand estimate).
    caf::reacts_to<demand_atom, std::string, uint32_t>,
    /// Residency of every model.
    caf::replies_to<status_atom>::with<std::vector<residency_report>>,
    /// Bytes per device as the scheduler accounts them.
    caf::replies_to<devices_atom>::with<std::vector<device_usage>>,
    /// These devices' node is gone: their models are unavailable, and whatever they had
    /// resident elsewhere is given back.
    caf::reacts_to<lost_atom, std::vector<int32_t>>,
    /// These devices are back (empty: their models load again on demand).
    caf::reacts_to<found_atom, std::vector<int32_t>>,
    /// Its own timer: loads that wait to be retried (a device refused them for room that
    /// was about to come free) are planned again.
    caf::reacts_to<tick_atom>,
    /// Switches the victim policy ("lru", "cost"); an empty name only asks. Replies with
    /// the policy in force.
    caf::replies_to<policy_atom,
                    std::string>::with<std::string>>::extend_with<status_reporter_actor>;

/// What serves requests: a model manager, or anything composed in front of managers
/// (a router). The frontend talks to one of these.
using serving_actor = caf::typed_actor<
    /// Completes one sequence.
    caf::replies_to<infer_atom, infer_request>::with<infer_reply>,
    /// Every registered model.
    caf::replies_to<list_atom>::with<std::vector<model_info>>,
    /// One model by name.
    caf::replies_to<info_atom, std::string>::with<model_info>,
    /// One model as registered, without asking the swap scheduler where it stands: its
    /// config, vocabulary and context, and the state the manager itself lists (registering,
    /// failed), else unknown. What a tokenizer lookup needs: the text routes read their
    /// files from it, so a busy or distant scheduler never delays them.
    caf::replies_to<describe_atom, std::string>::with<model_info>,
    /// Makes a model resident now.
    caf::replies_to<load_atom, std::string>::with<model_info>,
    /// Evicts a model now.
    caf::replies_to<unload_atom, std::string>::with<model_info>,
    /// Every device's report.
    caf::replies_to<devices_atom>::with<std::vector<device_report>>,
    /// Ends a request early: its client went away (`complete` false: queued, it fails as
    /// cancelled; running, its row leaves the batch after this step and counts as
    /// cancelled), or its stream receiver has all it wants (`complete` true: a stop string
    /// appeared; the row leaves the same way and counts as a success that stopped). Ids are
    /// the frontend's (infer_request::id); an unknown id is ignored.
    caf::reacts_to<cancel_atom, uint64_t, bool>>::extend_with<status_reporter_actor>;

/// Per-model queues, batching and dispatch of the models the registry hands it. It
/// decides no lifecycle: it serves what it was given and lists what it was told.
using model_manager_actor = serving_actor::extend<
    /// Serves a model the registry registered (its shards are prepared and the scheduler
    /// places it): its config, the bytes its shards hold, and whether the ledger counts
    /// its KV blocks. Replies with its info.
    caf::replies_to<adopt_atom, model_config, uint64_t, bool>::with<model_info>,
    /// A name it cannot serve and why (registering, failed with the reason), which its
    /// list and info show and its refusals give; `unregistered` forgets the name.
    caf::reacts_to<listed_atom, model_info>,
    /// true: stops admitting the model's requests, before it is unregistered (refused
    /// while requests of it are queued or running); false: admits them again (an
    /// unregistration that failed). Replies with its info.
    caf::replies_to<retire_atom, std::string, bool>::with<model_info>,
    /// Forgets a retired model (the registry has freed it everywhere).
    caf::replies_to<forget_atom, std::string>::with<bool>,
    /// The batch-window timer (the manager sends it to itself).
    caf::reacts_to<tick_atom>>;

/// The owner of the model lifecycle (Triton's): registration, unregistration, a model
/// repository's folders (explicit model control), and a node's loss and return. It
/// prepares shards on the workers, places models with the scheduler and hands them to
/// the manager, which serves them.
using registry_actor = caf::typed_actor<
    /// Registers a model: its shards are prepared on their workers. A registration that
    /// fails stays listed as failed with its reason (until registered again or
    /// unregistered), so operators see why a model is missing.
    caf::replies_to<register_atom, model_config>::with<model_info>,
    /// Evicts the model, frees its host copies on every worker and forgets it (or drops a
    /// failed registration). Refused while requests of it are queued or running.
    caf::replies_to<unregister_atom, std::string>::with<model_info>,
    /// Every registered model (failed registrations included) and every repository
    /// folder not registered (unloaded, or failed with the reason it cannot be read).
    caf::replies_to<list_atom>::with<std::vector<model_info>>,
    /// One model as the index lists it: the manager's, else its folder read now
    /// (unloaded, or failed with the reason); unknown_model when it is neither.
    caf::replies_to<info_atom, std::string>::with<model_info>,
    /// Makes a model resident; a folder not registered yet is read and registered first.
    caf::replies_to<load_atom, std::string>::with<model_info>,
    /// Evicts a model; with true also unregisters it (its host memory is freed; a load
    /// registers it again from its folder).
    caf::replies_to<unload_atom, std::string, bool>::with<model_info>,
    /// These devices' node is gone: their models are unavailable (the scheduler hears it).
    caf::reacts_to<lost_atom, std::vector<int32_t>>,
    /// These devices are back: the scheduler hears it, and groups of ranks spanning nodes
    /// meet again.
    caf::reacts_to<found_atom, std::vector<int32_t>>>::extend_with<status_reporter_actor>;

/// Admission in front of a serving actor: request ids, per-model queue bounds
/// (overloaded, never unbounded memory), replies. It watches who asks: when a requester
/// ends before its answer (an HTTP client went away and the actor serving it quit), its
/// requests are cancelled behind it, so abandoned work leaves the queues.
using frontend_actor = serving_actor;

/// One per machine: its shard workers and devices.
using node_actor = caf::typed_actor<
    /// Every device of this node.
    caf::replies_to<devices_atom>::with<std::vector<device_report>>,
    /// The shard workers, in device order.
    caf::replies_to<workers_atom>::with<std::vector<shard_worker_actor>>>::
    extend_with<status_reporter_actor>;

/// What an operator's console attaches to: the controller's serving stack and its
/// scheduler behind one handle, published on the console port (actors/controller).
using controller_actor = caf::typed_actor<
    /// Every registered model.
    caf::replies_to<list_atom>::with<std::vector<model_info>>,
    /// Every device's report.
    caf::replies_to<devices_atom>::with<std::vector<device_report>>,
    /// Makes a model resident now, or evicts it.
    caf::replies_to<load_atom, std::string>::with<model_info>,
    caf::replies_to<unload_atom, std::string>::with<model_info>,
    /// Pins (never a victim) or unpins a model.
    caf::replies_to<pin_atom, std::string, bool>::with<residency_report>,
    /// Completes one sequence, as the HTTP API does.
    caf::replies_to<infer_atom, infer_request>::with<infer_reply>,
    /// Shows ("") or switches the eviction policy.
    caf::replies_to<policy_atom, std::string>::with<std::string>,
    /// Starts a fresh timeline (true), or writes it to a file on the controller's machine
    /// (false, path). Replies with what was done.
    caf::replies_to<trace_atom, bool, std::string>::with<std::string>>::
    extend_with<status_reporter_actor>;  // the merged status of every actor

/// The controller's connection to one node (net/cluster): it notices the node's death,
/// tells the scheduler, reconnects, and rebinds the node's worker guards.
using node_link_actor = caf::typed_actor<
    /// Time to try reconnecting (the link sends it to itself).
    caf::reacts_to<tick_atom>>::extend_with<status_reporter_actor>;

}  // namespace computron::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(computron::actors::lane_job)

/// The handles that travel as message elements (a node's workers cross the network to the
/// controller): CAF 0.17 serializes a typed handle only under a registered name, and a
/// vector only when it is listed too. system_config adds this block.
CAF_BEGIN_TYPE_ID_BLOCK(computron_handles, caf::id_block::computron_messages::end)
CAF_ADD_TYPE_ID(computron_handles, (computron::actors::shard_worker_actor))
CAF_ADD_TYPE_ID(computron_handles, (std::vector<computron::actors::shard_worker_actor>))
CAF_END_TYPE_ID_BLOCK(computron_handles)
