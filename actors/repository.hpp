#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/interfaces.hpp"

namespace computron::actors {

/// One folder of a model repository as read: its model, or why it cannot be read.
struct repository_folder {
  std::string name;
  model_config config;
  /// Set when the folder cannot be served (unreadable config, unknown keys, ...).
  caf::error error;
};

/// Reads the repository's folders: all of them (`only` empty), or the one named `only`
/// (none if it does not exist). Hidden folders are never models. Blocking file reads:
/// the repository actor runs on its own thread.
using repository_scan = std::function<std::vector<repository_folder>(const std::string& only)>;

struct repository_options {
  /// No scan: model control over the registered models only (load of an unknown name
  /// is unknown_model).
  repository_scan scan;
  /// A registration fills host copies of the weights: it may take minutes.
  std::chrono::seconds register_timeout{3600};
  /// Load, unload and unregister (a load may wait for evictions).
  std::chrono::seconds timeout{600};
};

/// Spawns model control over `manager` and a repository folder (Triton's explicit
/// mode): see repository_actor in interfaces.hpp.
caf::expected<repository_actor> spawn_repository(caf::actor_system& sys,
                                                 model_manager_actor manager,
                                                 repository_options opts);

}  // namespace computron::actors
