#pragma once

// The registry's state and the pieces its two files share (internal to actors/):
// registry.cpp is the actor (model control over the repository's folders, node loss and
// return), registration.cpp registers and unregisters models and re-forms the groups of
// ranks that span nodes.
#include <functional>
#include <map>
#include <set>
#include <string>

#include <caf/all.hpp>

#include "actors/registry.hpp"
#include "common/error.hpp"

namespace computron::actors::registry_detail {

using namespace std::chrono_literals;

/// A registration that failed: listed with its reason until it registers or is
/// unregistered. Requests for it are refused with the reason and `code`:
/// out_of_device_memory where it can never fit its devices (a retry cannot help), else
/// unavailable.
struct failed_model {
  model_config cfg;
  std::string reason;
  ec code = ec::unavailable;
};

struct registry_state {
  static constexpr const char* name = "registry";
  registry_options opts;
  engine_registry engines;
  std::vector<shard_worker_actor> workers;
  swap_scheduler_actor scheduler;
  model_manager_actor manager;
  /// Every registered model's config (dtype resolved), by name: what unregistering frees
  /// and a returning node re-forms.
  std::map<std::string, model_config> registered;
  /// Registrations under way, and those that failed (with why). The manager is told of
  /// both (listed_atom), so that its list shows them and its refusals give the reason.
  std::map<std::string, model_config> registering;
  std::map<std::string, failed_model> failed;
  /// Names being unregistered.
  std::set<std::string> unregistering;
};

using registry_pointer = registry_actor::stateful_pointer<registry_state>;

/// Registers `requested` (registration.cpp): `done` gets its info, or why it was refused
/// or failed (then it is listed as failed).
using registered_fn = std::function<void(caf::expected<model_info>)>;
void register_model(registry_pointer self, model_config requested, registered_fn done);
/// Unregisters `name` (registration.cpp).
caf::result<model_info> unregister_model(registry_pointer self, const std::string& name);
/// Re-forms the cross-node groups of the stages on devices `devs` of a node that is back.
void rejoin_groups(registry_pointer self, const std::vector<int32_t>& devs);

}  // namespace computron::actors::registry_detail
