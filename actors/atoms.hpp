#pragma once

#include <caf/atom.hpp>
#include <caf/type_id.hpp>

/// Every atom of Computron's actor protocol, in one type-ID block (CAF 0.17 atoms: at
/// most 10 characters). Message structs have their own block in actors/messages.hpp.
CAF_BEGIN_TYPE_ID_BLOCK(computron_atoms, caf::first_custom_type_id)
CAF_ADD_ATOM(computron_atoms, computron::atom, infer_atom, "infer")
CAF_ADD_ATOM(computron_atoms, computron::atom, step_atom, "step")
CAF_ADD_ATOM(computron_atoms, computron::atom, cancel_atom, "cancel")
CAF_ADD_ATOM(computron_atoms, computron::atom, prepare_atom, "prepare")
CAF_ADD_ATOM(computron_atoms, computron::atom, load_atom, "load")
CAF_ADD_ATOM(computron_atoms, computron::atom, evict_atom, "evict")
CAF_ADD_ATOM(computron_atoms, computron::atom, unload_atom, "unload")
CAF_ADD_ATOM(computron_atoms, computron::atom, acquire_atom, "acquire")
CAF_ADD_ATOM(computron_atoms, computron::atom, release_atom, "release")
CAF_ADD_ATOM(computron_atoms, computron::atom, pin_atom, "pin")
CAF_ADD_ATOM(computron_atoms, computron::atom, demand_atom, "demand")
CAF_ADD_ATOM(computron_atoms, computron::atom, register_atom, "register")
CAF_ADD_ATOM(computron_atoms, computron::atom, list_atom, "list")
CAF_ADD_ATOM(computron_atoms, computron::atom, info_atom, "info")
CAF_ADD_ATOM(computron_atoms, computron::atom, devices_atom, "devices")
CAF_ADD_ATOM(computron_atoms, computron::atom, workers_atom, "workers")
CAF_ADD_ATOM(computron_atoms, computron::atom, status_atom, "status")
CAF_ADD_ATOM(computron_atoms, computron::atom, run_atom, "run")
CAF_ADD_ATOM(computron_atoms, computron::atom, tick_atom, "tick")
CAF_ADD_ATOM(computron_atoms, computron::atom, report_atom, "report")
CAF_ADD_ATOM(computron_atoms, computron::atom, group_atom, "group")
CAF_ADD_ATOM(computron_atoms, computron::atom, rebind_atom, "rebind")
CAF_ADD_ATOM(computron_atoms, computron::atom, lost_atom, "lost")
CAF_ADD_ATOM(computron_atoms, computron::atom, found_atom, "found")
CAF_ADD_ATOM(computron_atoms, computron::atom, policy_atom, "policy")
CAF_ADD_ATOM(computron_atoms, computron::atom, trace_atom, "trace")
CAF_ADD_ATOM(computron_atoms, computron::atom, token_atom, "token")
CAF_ADD_ATOM(computron_atoms, computron::atom, unregister_atom, "unregister")
CAF_ADD_ATOM(computron_atoms, computron::atom, begin_load_atom, "beginload")
CAF_END_TYPE_ID_BLOCK(computron_atoms)
