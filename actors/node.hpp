#pragma once

#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/expected.hpp>

#include "actors/engine.hpp"
#include "actors/frontend.hpp"
#include "actors/interfaces.hpp"
#include "actors/model_manager.hpp"
#include "actors/registry.hpp"
#include "actors/shard_worker.hpp"
#include "actors/swap_scheduler.hpp"
#include "gpu/backends.hpp"

namespace computron::actors {

/// How CAF's scheduler threads wait for work once their queues are empty.
enum class idle_polling {
  /// CAF 0.17's own: 100 quick polls, then 500 polls 50 us apart (each sleep lasts 50-110 us
  /// with Linux's timer slack), then a condition variable. A message that comes from a
  /// thread of its own (a compute lane's reply, a scoped actor, the HTTP server) to a
  /// thread in that middle phase waits out the sleep: on a decode step's round trip, that
  /// was about half its host time (bench/RESULTS.md, issue 46's host share).
  caf,
  /// The quick polls, then the condition variable at once, which such a message wakes; an
  /// idle thread still looks for work to steal every millisecond (1000 wake-ups a second
  /// per idle thread, CAF's own 100 once it is long idle; a thread that just went idle
  /// steals less often than in CAF's middle phase). The default.
  prompt,
};

/// An actor system configuration with Computron's message types and error category
/// registered (the same in every process of a cluster), and its scheduler's idle polling.
struct system_config : caf::actor_system_config {
  explicit system_config(idle_polling polling = idle_polling::prompt);
};

/// A node's actor and its workers.
struct node_handle {
  node_actor node;
  std::vector<shard_worker_actor> workers;
};

/// Spawns one shard worker per device and the node actor that reports them. Worker i
/// answers for global device index `first_index + i`.
caf::expected<node_handle> spawn_node(caf::actor_system& sys,
                                      const std::vector<gpu::device_ptr>& devices,
                                      engine_registry engines, shard_worker_options worker_opts,
                                      int32_t first_index = 0);

/// Everything `computron serve` runs in one process.
struct runtime_options {
  gpu::device_options devices;
  shard_worker_options worker;
  swap_scheduler_options scheduler;
  model_manager_options manager;
  /// Registration, unregistration and the repository's folders (the device kinds are
  /// filled in from the devices).
  registry_options registry;
  frontend_options frontend;
  /// Metrics and trace; shared by every actor.
  std::shared_ptr<observer> obs = null_observer();
};

/// The in-process stack: devices, node, scheduler, manager, registry, frontend.
struct runtime {
  std::vector<gpu::device_ptr> devices;
  node_handle node;
  swap_scheduler_actor scheduler;
  model_manager_actor manager;
  /// Models are registered and unregistered here.
  registry_actor registry;
  frontend_actor frontend;
  /// Asks every actor to exit (the actor system then joins their threads).
  void shutdown();
};

/// Gpu-lets on a GPU are green contexts: checks that `devices`' GPUs have them and makes
/// a fixed partition's now (each lane's stream, off the request path; "auto": the
/// smallest share's), so that a GPU without them, or a share too small for its SMs, is
/// refused at start naming the device. Emulated devices need nothing.
caf::error prepare_gpulets(const std::vector<gpu::device_ptr>& devices,
                           const sched::gpulet_config& gpulets);

/// Opens the devices and spawns the stack. Errors: no devices, invalid options, gpu-lets
/// a GPU cannot run (prepare_gpulets).
caf::expected<runtime> start_runtime(caf::actor_system& sys, runtime_options opts,
                                     engine_registry engines);

/// The controller's stack over workers that exist already (other nodes' workers behind
/// their guards): scheduler, manager, registry and frontend; `devices[i]` accounts worker i. The
/// runtime's node has no actor and its device list is empty. Errors: no devices,
/// invalid options.
caf::expected<runtime> start_runtime_over(caf::actor_system& sys, runtime_options opts,
                                          engine_registry engines,
                                          std::vector<scheduler_device> devices);

}  // namespace computron::actors
