#include "actors/worker_guard.hpp"

#include <functional>
#include <map>
#include <set>

#include <caf/all.hpp>

#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::actors {

namespace {

struct worker_guard_state {
  static constexpr const char* name = "worker_guard";
  worker_guard_options opts;
  shard_worker_actor target;
  bool online = true;
  /// Why it is offline, for every error it gives meanwhile.
  std::string why;
  /// Requests relayed and not answered: failing them is the guard's reason to exist.
  std::map<uint64_t, std::function<void(const caf::error&)>> pending;
  uint64_t next_id = 1;
  /// Shards prepared through this guard, replayed on a restarted node.
  std::map<std::string, shard_spec> prepared;
  /// Models whose cross-node group died with a node: they cannot serve until the
  /// manager prepared them again with a new rendezvous.
  std::set<std::string> stale;
  uint64_t relayed = 0;
  uint64_t failed_fast = 0;
};

using guard_pointer = worker_guard_actor::stateful_pointer<worker_guard_state>;

caf::error offline_error(guard_pointer self) {
  auto& st = self->state;
  return make_error(ec::unavailable, "device " + std::to_string(st.opts.device_index) +
                                         " on node " + st.opts.node + " is unavailable: " + st.why);
}

/// Relays one request to the worker; `fix` adjusts the reply (device numbering) on the
/// way back. The reply or the error reaches the caller once, whichever comes first of
/// the worker's answer and the node's death.
template <class R, class Fix, class... Ts>
caf::result<R> relay(guard_pointer self, Fix fix, Ts... xs) {
  auto& st = self->state;
  if (!st.online) {
    ++st.failed_fast;
    return offline_error(self);
  }
  ++st.relayed;
  auto rp = self->template make_response_promise<R>();
  auto id = st.next_id++;
  st.pending.emplace(id, [rp](const caf::error& e) mutable { rp.deliver(e); });
  auto take = [self, id] {
    auto& p = self->state.pending;
    auto i = p.find(id);
    if (i == p.end()) return false;
    p.erase(i);
    return true;
  };
  self->request(st.target, caf::timespan{st.opts.relay_timeout}, std::move(xs)...)
      .then(
          [=](R& r) mutable {
            if (!take()) return;
            fix(r);
            rp.deliver(std::move(r));
          },
          [=](caf::error& e) mutable {
            if (take()) rp.deliver(std::move(e));
          });
  return rp;
}

void go_offline(guard_pointer self, std::string why) {
  auto& st = self->state;
  if (!st.online && st.why == why) return;
  st.online = false;
  st.why = std::move(why);
  log::warn("device {} on node {}: {}; failing {} requests in flight", st.opts.device_index,
            st.opts.node, st.why, st.pending.size());
  auto pending = std::move(st.pending);
  st.pending.clear();
  auto err = offline_error(self);
  for (auto& [id, fail] : pending) fail(err);
}

worker_guard_actor::behavior_type worker_guard(guard_pointer self, shard_worker_actor target,
                                               worker_guard_options opts) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.target = std::move(target);
  self->monitor(st.target);
  self->set_down_handler([=](caf::down_msg& m) {
    if (m.source != self->state.target.address()) return;  // an earlier incarnation
    go_offline(self, "its node is gone (" + render(m.reason) + ")");
  });
  const int32_t index = st.opts.device_index;
  auto same = [](auto&) {};
  auto renumber = [=](transfer_report& r) { r.device = index; };
  auto regrouping = [](const std::string& m) {
    return make_error(ec::unavailable,
                      "model " + m + " has tensor-parallel ranks on several nodes, and " +
                          "one of them restarted: its group is being formed again");
  };
  return {
      [=](prepare_atom, shard_spec& s) -> caf::result<shard_report> {
        auto spec = s;
        return relay<shard_report>(
            self,
            [=](shard_report& r) {
              r.device = index;
              self->state.stale.erase(spec.model.name);
              self->state.prepared[spec.model.name] = spec;
            },
            prepare_atom_v, std::move(s));
      },
      [=](load_atom, std::string& m) -> caf::result<transfer_report> {
        if (self->state.stale.count(m) > 0) return regrouping(m);
        return relay<transfer_report>(self, renumber, load_atom_v, std::move(m));
      },
      [=](begin_load_atom, std::string& m) -> caf::result<transfer_report> {
        if (self->state.stale.count(m) > 0) return regrouping(m);
        return relay<transfer_report>(self, renumber, begin_load_atom_v, std::move(m));
      },
      [=](evict_atom, std::string& m) -> caf::result<transfer_report> {
        return relay<transfer_report>(self, renumber, evict_atom_v, std::move(m));
      },
      [=](unregister_atom, std::string& m) -> caf::result<bool> {
        // Never replayed on a restarted node from now on; a node that is gone holds
        // nothing of it any more.
        auto& st = self->state;
        bool had = st.prepared.erase(m) > 0;
        st.stale.erase(m);
        if (!st.online) return had;
        return relay<bool>(self, same, unregister_atom_v, std::move(m));
      },
      [=](step_atom, step_request& r) -> caf::result<step_result> {
        return relay<step_result>(self, same, step_atom_v, std::move(r));
      },
      [=](cancel_atom, std::string& m, uint64_t batch) -> caf::result<uint64_t> {
        return relay<uint64_t>(self, same, cancel_atom_v, std::move(m), batch);
      },
      // The worker's own timer: the one behind this guard ticks itself.
      [=](tick_atom) {},
      [=](devices_atom) -> caf::result<device_report> {
        auto& st = self->state;
        if (!st.online) {
          device_report r;
          r.device = index;
          r.name = "unavailable";
          r.node = st.opts.node;
          r.online = false;
          return r;
        }
        auto node = st.opts.node;
        return relay<device_report>(
            self,
            [=](device_report& r) {
              r.device = index;
              r.node = node;
            },
            devices_atom_v);
      },
      [=](group_atom, std::string& g, int32_t size) -> caf::result<std::string> {
        return relay<std::string>(self, same, group_atom_v, std::move(g), size);
      },
      [=](report_atom) -> caf::result<caf::settings> {
        auto& st = self->state;
        auto mine = [=](caf::settings& s) {
          auto& st = self->state;
          s["device"] = caf::config_value{static_cast<int64_t>(index)};
          s["node"] = caf::config_value{st.opts.node};
          s["online"] = caf::config_value{st.online};
          s["relayed"] = caf::config_value{static_cast<int64_t>(st.relayed)};
          s["failed-fast"] = caf::config_value{static_cast<int64_t>(st.failed_fast)};
          s["in-flight"] = caf::config_value{static_cast<int64_t>(st.pending.size())};
          if (!st.online) s["why"] = caf::config_value{st.why};
        };
        if (!st.online) {
          caf::settings s;
          mine(s);
          return s;
        }
        return relay<caf::settings>(self, mine, report_atom_v);
      },
      [=](rebind_atom, shard_worker_actor& w) -> caf::result<bool> {
        auto& st = self->state;
        if (!w) return make_error(ec::invalid_request, "rebind without a worker");
        if (st.online) go_offline(self, "its node is being replaced");
        st.target = std::move(w);
        self->monitor(st.target);
        st.why = "its node is rejoining";
        // Shards whose tensor-parallel group spans nodes cannot be re-formed here: the
        // surviving ranks hold a group with a dead member. The manager re-forms it (a new
        // rendezvous for every rank, found_atom); until then loads of it fail.
        std::vector<shard_spec> specs;
        for (auto i = st.prepared.begin(); i != st.prepared.end();) {
          if (!i->second.group_address.empty()) {
            log::info(
                "device {}: model {} has tensor-parallel ranks on several nodes; it "
                "serves again once the manager re-forms its group",
                index, i->first);
            st.stale.insert(i->first);
            i = st.prepared.erase(i);
          } else {
            specs.push_back(i->second);
            ++i;
          }
        }
        auto rp = self->make_response_promise<bool>();
        auto target = st.target;
        auto timeout = caf::timespan{st.opts.replay_timeout};
        auto back = [=]() mutable {
          // A node that only froze still holds device copies the scheduler gave up on:
          // start clean, every shard offloaded.
          for (auto& s : specs)
            self->request(target, timeout, evict_atom_v, s.model.name)
                .then([](transfer_report&) {}, [](caf::error&) {});
          if (self->state.target != target) {
            rp.deliver(make_error(ec::invalid_state, "rebound again meanwhile"));
            return;
          }
          self->state.online = true;
          self->state.why.clear();
          log::info("device {} on node {} is back ({} shards prepared again)", index,
                    self->state.opts.node, specs.size());
          rp.deliver(true);
        };
        if (specs.empty()) {
          back();
          return rp;
        }
        auto j = make_join<shard_report>(
            specs.size(), [=](std::vector<shard_report>) mutable { back(); },
            [=](caf::error e, size_t i) mutable {
              rp.deliver(make_error(ec::unavailable,
                                    "preparing " + specs[i].model.name + " again on device " +
                                        std::to_string(index) + " failed: " + render(e)));
            });
        for (size_t i = 0; i < specs.size(); ++i)
          self->request(target, timeout, prepare_atom_v, specs[i])
              .then([=](shard_report& r) { j->ok(i, std::move(r)); },
                    [=](caf::error& e) { j->failed(std::move(e), i); });
        return rp;
      },
  };
}

}  // namespace

caf::expected<worker_guard_actor> spawn_worker_guard(caf::actor_system& sys,
                                                     shard_worker_actor worker,
                                                     worker_guard_options opts) {
  if (!worker) return make_error(ec::invalid_configuration, "worker guard without a worker");
  return sys.spawn(worker_guard, std::move(worker), std::move(opts));
}

}  // namespace computron::actors
