// A custom pipeline composed from the library's public actors: one frontend in front of
// a router that sends each model's requests to the model manager that owns it. Each
// manager has its own node (two emulated devices), scheduler and policy: two pools of
// devices served behind one endpoint.
//
//   frontend -> router -> manager "left"  (node of 2 devices, LRU)
//                      -> manager "right" (node of 2 devices, cost-aware)
//
// Run: build/examples/router_pipeline  (exits 0 when every request was answered right)
#include <iostream>
#include <map>

#include <caf/all.hpp>

#include "actors/frontend.hpp"
#include "actors/join.hpp"
#include "actors/node.hpp"
#include "common/error.hpp"

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;

namespace {

struct router_state {
  static constexpr const char* name = "router";
  /// Which manager serves each model.
  std::map<std::string, model_manager_actor> owner;
  std::vector<model_manager_actor> managers;
};

/// A serving_actor that forwards by model name; list and devices merge every manager's.
serving_actor::behavior_type router(serving_actor::stateful_pointer<router_state> self,
                                    std::map<std::string, model_manager_actor> owner) {
  self->state.owner = std::move(owner);
  for (auto& [model, m] : self->state.owner)
    if (std::find(self->state.managers.begin(), self->state.managers.end(), m) ==
        self->state.managers.end())
      self->state.managers.push_back(m);
  auto find = [=](const std::string& model) -> caf::expected<model_manager_actor> {
    auto i = self->state.owner.find(model);
    if (i == self->state.owner.end())
      return make_error(ec::unknown_model, "no manager serves " + model);
    return i->second;
  };
  return {
      [=](infer_atom a, infer_request& r) -> caf::result<infer_reply> {
        auto m = find(r.model);
        if (!m) return m.error();
        return self->delegate(caf::actor_cast<serving_actor>(*m), a, std::move(r));
      },
      [=](list_atom) -> caf::result<std::vector<model_info>> {
        auto rp = self->make_response_promise<std::vector<model_info>>();
        fan_out_all<std::vector<model_info>>(
            self, self->state.managers, caf::timespan{10s},
            [=](std::vector<std::vector<model_info>> parts) mutable {
              std::vector<model_info> all;
              for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
              rp.deliver(std::move(all));
            },
            [=](caf::error e, size_t) mutable { rp.deliver(std::move(e)); }, list_atom_v);
        return rp;
      },
      [=](info_atom a, std::string& model) -> caf::result<model_info> {
        auto m = find(model);
        if (!m) return m.error();
        return self->delegate(caf::actor_cast<serving_actor>(*m), a, std::move(model));
      },
      [=](describe_atom a, std::string& model) -> caf::result<model_info> {
        auto m = find(model);
        if (!m) return m.error();
        return self->delegate(caf::actor_cast<serving_actor>(*m), a, std::move(model));
      },
      [=](load_atom a, std::string& model) -> caf::result<model_info> {
        auto m = find(model);
        if (!m) return m.error();
        return self->delegate(caf::actor_cast<serving_actor>(*m), a, std::move(model));
      },
      [=](unload_atom a, std::string& model) -> caf::result<model_info> {
        auto m = find(model);
        if (!m) return m.error();
        return self->delegate(caf::actor_cast<serving_actor>(*m), a, std::move(model));
      },
      // Ids are the frontend's, unique across pools: the one pool that holds it acts.
      [=](cancel_atom a, uint64_t id, bool complete) {
        for (auto& m : self->state.managers) self->send(m, a, id, complete);
      },
      [=](devices_atom) -> caf::result<std::vector<device_report>> {
        auto rp = self->make_response_promise<std::vector<device_report>>();
        fan_out_all<std::vector<device_report>>(
            self, self->state.managers, caf::timespan{10s},
            [=](std::vector<std::vector<device_report>> parts) mutable {
              std::vector<device_report> all;
              for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
              rp.deliver(std::move(all));
            },
            [=](caf::error e, size_t) mutable { rp.deliver(std::move(e)); }, devices_atom_v);
        return rp;
      },
      [=](report_atom) -> caf::result<caf::settings> {
        // Each pool's merged status, side by side.
        auto rp = self->make_response_promise<caf::settings>();
        fan_out_all<caf::settings>(
            self, self->state.managers, caf::timespan{10s},
            [=](std::vector<caf::settings> parts) mutable {
              caf::settings out;
              caf::config_value::list pools;
              for (auto& p : parts) pools.emplace_back(std::move(p));
              out["pools"] = caf::config_value{std::move(pools)};
              rp.deliver(std::move(out));
            },
            [=](caf::error e, size_t) mutable { rp.deliver(std::move(e)); }, report_atom_v);
        return rp;
      },
  };
}

model_config toy(const std::string& name, uint64_t seed) {
  model_config m;
  m.name = name;
  m.kind = "toy";
  m.tp = 2;
  m.devices = {0, 1};
  m.seed = seed;
  m.toy_shard_bytes = 1 << 20;
  return m;
}

}  // namespace

int main() {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  // Two independent pools, each a full runtime of its own (2 emulated devices that
  // hold one 2-shard toy model at a time, so the models on each side swap).
  std::vector<runtime> pools;
  for (std::string policy : {"lru", "cost"}) {
    runtime_options o;
    o.devices.kind = "emulated";
    o.devices.count = 2;
    o.devices.emulated_capacity_bytes = 3ull << 19;  // 1.5 MiB
    o.scheduler.ledger.policy = policy;
    auto rt = start_runtime(sys, o, torch_free_engines());
    if (!rt) {
      std::cerr << "router_pipeline: " << render(rt.error()) << '\n';
      return 1;
    }
    pools.push_back(std::move(*rt));
  }
  std::map<std::string, model_manager_actor> owner;
  int failures = 0;
  auto add = [&](size_t pool, const model_config& m) {
    self->request(pools[pool].registry, 30s, register_atom_v, m)
        .receive([&](model_info&) { owner.emplace(m.name, pools[pool].manager); },
                 [&](caf::error& e) {
                   std::cerr << "register " << m.name << ": " << render(e) << '\n';
                   ++failures;
                 });
  };
  add(0, toy("left-a", 1));
  add(0, toy("left-b", 2));
  add(1, toy("right-a", 3));
  add(1, toy("right-b", 4));
  auto r = sys.spawn(router, owner);
  auto fe = spawn_frontend(sys, r, frontend_options{}).value();
  for (int round = 0; round < 2; ++round)
    for (std::string model : {"left-a", "right-a", "left-b", "right-b", "nowhere"}) {
      infer_request req;
      req.model = model;
      req.tokens = {3, 1, 4, 1, 5};
      req.max_tokens = 3;
      self->request(fe, 30s, infer_atom_v, req)
          .receive(
              [&](infer_reply& rep) {
                std::cout << model << ": " << rep.tokens.size() << " tokens, swapped "
                          << rep.swapped << '\n';
                if (rep.tokens.size() != 3) ++failures;
              },
              [&](caf::error& e) {
                bool expected = model == "nowhere" && is(e, ec::unknown_model);
                std::cout << model << ": " << render(e) << '\n';
                if (!expected) ++failures;
              });
    }
  self->request(fe, 10s, list_atom_v)
      .receive(
          [&](std::vector<model_info>& ms) {
            std::cout << ms.size() << " models behind one frontend\n";
            if (ms.size() != 4) ++failures;
          },
          [&](caf::error& e) {
            std::cerr << render(e) << '\n';
            ++failures;
          });
  caf::anon_send_exit(fe, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  for (auto& p : pools) p.shutdown();
  std::cout << (failures == 0 ? "router_pipeline: ok\n" : "router_pipeline: FAILED\n");
  return failures == 0 ? 0 : 1;
}
