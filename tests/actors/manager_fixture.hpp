#pragma once

// A model manager under CAF's test coordinator, with one fake worker, a scheduler and a
// registry: the manager's and the registry's tests share it. Its clock moves only when
// the test says, so batch windows, queue times and deadlines are exact, with no sleeps.
#include <catch2/catch.hpp>

#include "actors/model_manager.hpp"
#include "actors/registry.hpp"
#include "actors/swap_scheduler.hpp"
#include "common/error.hpp"
#include "tests/support/deterministic.hpp"

namespace computron::testing {

using namespace computron::actors;
using namespace std::chrono_literals;

/// One fake worker (loads and steps answer at once), a scheduler and a manager with a
/// 5 ms batch window and batches of up to 4.
struct manager_fixture : deterministic_fixture {
  fake_worker_script script;
  shard_worker_actor worker;
  swap_scheduler_actor scheduler;
  model_manager_actor manager;
  registry_actor registry;

  /// The fake workers answer a step at once, loaded or not; tests of a hanging load turn
  /// compute while loading off so its batch waits for the load, as a real step would.
  explicit manager_fixture(bool compute_while_loading = true, bool continuous = true) {
    script.holder = sys.spawn(computron::testing::load_holder);
    worker = sys.spawn(fake_worker, &script, 0);
    swap_scheduler_options so;
    so.ledger.compute_while_loading = compute_while_loading;
    scheduler = spawn_swap_scheduler(sys, {{worker, 100 << 20, 10.0}}, so).value();
    model_manager_options mo;
    mo.batching.max_batch_size = 4;
    mo.batching.batch_window = 5ms;
    mo.batching.default_deadline = 1s;
    mo.batching.continuous = continuous;
    manager = spawn_model_manager(sys, {worker}, scheduler, torch_free_engines(), mo).value();
    registry = spawn_registry(sys, {worker}, scheduler, manager, torch_free_engines(), {}).value();
    model_config m;
    m.name = "m";
    m.kind = "toy";
    m.devices = {0};
    REQUIRE(ask<model_info>(registry, register_atom_v, m));
  }

  ~manager_fixture() {
    for (auto a : {caf::actor_cast<caf::actor>(registry), caf::actor_cast<caf::actor>(manager),
                   caf::actor_cast<caf::actor>(scheduler), caf::actor_cast<caf::actor>(worker),
                   script.holder})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

  auto send(int64_t deadline_ms = 0) {
    infer_request r;
    r.model = "m";
    r.tokens = {1, 2, 3};
    r.max_tokens = 1;
    r.deadline_ms = deadline_ms;
    return self->request(manager, caf::timespan{24h}, infer_atom_v, r);
  }

  bool replied() { return !self->mailbox().empty(); }

  /// Runs messages one by one until the workers ran `steps` steps (bounded).
  void run_steps(size_t steps) {
    for (int i = 0; i < 10000 && script.step_rows.size() < steps; ++i) sched.run_once();
    REQUIRE(script.step_rows.size() == steps);
  }

  /// Runs everything, lets every batch window close, runs everything again.
  void settle() {
    sched.run();
    sched.advance_time(6ms);
    sched.run();
  }
};

}  // namespace computron::testing
