#include "actors/model_manager_state.hpp"

#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::actors::manager_detail {

/// "no model named ..." (unknown_model).
caf::error unknown_model_error(const std::string& name) {
  return make_error(ec::unknown_model, "no model named '" + name + "'");
}

/// Why a name is not serving: it failed to register, is being registered or
/// unregistered; else unknown_model.
caf::error not_serving(manager_pointer self, const std::string& name) {
  auto& st = self->state;
  if (auto f = st.failed.find(name); f != st.failed.end())
    return make_error(f->second.code, "model " + name + " failed to register: " + f->second.reason);
  if (st.registering.count(name) > 0)
    return make_error(ec::unavailable, "model " + name + " is being registered");
  if (auto m = st.models.find(name); m != st.models.end() && m->second.unregistering)
    return make_error(ec::unavailable, "model " + name + " is being unregistered");
  return unknown_model_error(name);
}

/// A model listed without a managed entry (registering, failed, unregistered).
model_info listed_only(const model_config& cfg, model_lifecycle state, std::string reason) {
  model_info i;
  i.config = cfg;
  i.state = state;
  i.reason = std::move(reason);
  return i;
}

/// The stages of `cfg` whose tensor-parallel ranks sit on several nodes.
std::vector<size_t> split_stages(const model_manager_state& st, const model_config& cfg) {
  std::vector<size_t> split;
  const auto& nodes = st.opts.device_nodes;
  const auto tp = static_cast<size_t>(cfg.tp);
  for (size_t stage = 0; stage < static_cast<size_t>(cfg.pp) && !nodes.empty(); ++stage) {
    std::set<std::string> on;
    for (size_t r = 0; r < tp; ++r)
      on.insert(nodes.at(static_cast<size_t>(cfg.devices[stage * tp + r])));
    if (on.size() > 1) split.push_back(stage);
  }
  return split;
}

/// Prepares every rank of `stages` of `cfg` on its worker; `done` gets the reports in
/// device order, `fail` the first error (naming the device). A stage whose ranks sit on
/// several nodes first gets a rendezvous that its rank 0's worker hosts; the address
/// reaches the other ranks inside their shard specs.
void prepare_shards(manager_pointer self, const model_config& cfg, std::vector<size_t> stages,
                    std::function<void(std::vector<shard_report>)> done,
                    std::function<void(caf::error)> fail) {
  auto& st = self->state;
  const auto tp = static_cast<size_t>(cfg.tp);
  std::vector<size_t> positions;
  for (auto k : stages)
    for (size_t r = 0; r < tp; ++r) positions.push_back(k * tp + r);
  if (positions.empty()) {
    done({});
    return;
  }
  auto j = make_join<shard_report>(
      positions.size(), [=](std::vector<shard_report> reports) { done(std::move(reports)); },
      [=](caf::error err, size_t i) {
        // The worker's code stays (a device error is a 5xx, a bad config a 400).
        fail(with_context(err, "preparing " + cfg.name + " on device " +
                                   std::to_string(cfg.devices[positions[i]]) + " failed"));
      });
  auto timeout = st.opts.prepare_timeout;
  auto send_prepares = [=](std::vector<std::string> addresses) {
    auto& st = self->state;
    for (size_t i = 0; i < positions.size(); ++i) {
      auto pos = positions[i];
      self->request(st.workers[static_cast<size_t>(cfg.devices[pos])], timeout, prepare_atom_v,
                    shard_spec{cfg, static_cast<int32_t>(pos % tp), static_cast<int32_t>(pos / tp),
                               addresses[pos / tp]})
          .then([=](shard_report& r) { j->ok(i, std::move(r)); },
                [=](caf::error& e) { j->failed(std::move(e), i); });
    }
  };
  std::vector<size_t> split;
  std::set<size_t> wanted(stages.begin(), stages.end());
  for (auto k : split_stages(st, cfg))
    if (wanted.count(k) > 0) split.push_back(k);
  std::vector<std::string> none(static_cast<size_t>(cfg.pp));
  if (split.empty()) {
    send_prepares(none);
    return;
  }
  auto hosts = make_join<std::string>(
      split.size(),
      [=](std::vector<std::string> got) {
        auto addresses = none;
        for (size_t k = 0; k < split.size(); ++k) addresses[split[k]] = got[k];
        send_prepares(std::move(addresses));
      },
      [=](caf::error err, size_t k) {
        fail(with_context(err, "stage " + std::to_string(split[k]) + " of " + cfg.name +
                                   " spans nodes, and its rendezvous failed"));
      });
  for (size_t k = 0; k < split.size(); ++k)
    self->request(st.workers[static_cast<size_t>(cfg.devices[split[k] * tp])], 30s, group_atom_v,
                  cfg.name + "/stage" + std::to_string(split[k]), cfg.tp)
        .then([=](std::string& a) { hosts->ok(k, std::move(a)); },
              [=](caf::error& e) { hosts->failed(std::move(e), k); });
}

/// Registers `requested`: validated, refused with the sizes when it can never fit its
/// devices, prepared on every worker, then placed with the scheduler; listed as failed
/// with the reason when any step fails.
caf::result<model_info> register_model(manager_pointer self, model_config requested) {
  auto& st = self->state;
  auto kinds = st.opts.device_kinds;
  kinds.resize(st.workers.size(), gpu::device_kind::emulated);
  auto cfg = resolve_dtype(std::move(requested), kinds);
  if (auto i = st.models.find(cfg.name); i != st.models.end())
    return make_error(ec::invalid_state, "model " + cfg.name + " is already registered");
  if (st.registering.count(cfg.name) > 0)
    return make_error(ec::invalid_state, "model " + cfg.name + " is being registered");
  if (auto err = validate_model(st.engines, cfg, kinds)) {
    if (!cfg.name.empty()) st.failed[cfg.name] = {cfg, render(err), ec::unavailable};
    return err;
  }
  st.registering.emplace(cfg.name, cfg);
  // Stays listed as failed, with the reason, until it registers or is unregistered.
  auto fail = [=](const caf::error& err) {
    self->state.registering.erase(cfg.name);
    self->state.failed[cfg.name] = {
        cfg, render(err),
        is(err, ec::out_of_device_memory) ? ec::out_of_device_memory : ec::unavailable};
    log::error("model {} failed to register: {}", cfg.name, render(err));
  };
  auto rp = self->make_response_promise<model_info>();
  std::vector<size_t> all_stages;
  for (size_t k = 0; k < static_cast<size_t>(cfg.pp); ++k) all_stages.push_back(k);
  // Its shards' bytes from the engine's layout (nothing is allocated), aligned as
  // a worker accounts them; empty when the layout fails (preparing says why).
  std::vector<uint64_t> planned;
  auto& eng = *st.engines.at(cfg.kind);
  const auto tp = static_cast<size_t>(cfg.tp);
  for (size_t pos = 0; pos < cfg.devices.size(); ++pos) {
    auto table = eng.layout(
        shard_spec{cfg, static_cast<int32_t>(pos % tp), static_cast<int32_t>(pos / tp), {}});
    if (!table) {
      planned.clear();
      break;
    }
    planned.push_back(gpu::align_up(table->total_bytes(), gpu::device::granularity));
  }
  auto prepare = [=]() mutable {
    prepare_shards(
        self, cfg, all_stages,
        [=](std::vector<shard_report> reports) mutable {
          model_placement p{cfg.name, cfg.devices, {}, cfg.pinned, cfg.priority, {}};
          for (auto& r : reports) p.bytes.push_back(r.bytes);
          if (self->state.opts.kv_in_ledger) {
            auto& eng = *self->state.engines.at(cfg.kind);
            for (size_t pos = 0; pos < cfg.devices.size(); ++pos) {
              auto b = eng.kv_block_bytes(shard_spec{
                  cfg, static_cast<int32_t>(pos % tp), static_cast<int32_t>(pos / tp), {}});
              if (b == 0) {
                p.kv_block_bytes.clear();
                break;
              }
              p.kv_block_bytes.push_back(b);
            }
          }
          self->request(self->state.scheduler, 10s, register_atom_v, p)
              .then(
                  [=](bool) mutable {
                    auto& st = self->state;
                    st.registering.erase(cfg.name);
                    st.failed.erase(cfg.name);
                    auto& eng = *st.engines.at(cfg.kind);
                    managed_model m;
                    m.cfg = cfg;
                    m.vocab = eng.vocab(cfg);
                    m.max_positions = eng.max_positions(cfg);
                    for (auto b : p.bytes) m.bytes += b;
                    m.weight_bytes = eng.weight_bytes(cfg);
                    m.index = st.disp->add_model(cfg.name, cfg.tp, cfg.pp, cfg.devices,
                                                 cfg.priority, !p.kv_block_bytes.empty());
                    st.names.push_back(cfg.name);
                    st.models.emplace(cfg.name, std::move(m));
                    st.opts.obs->model_registered(cfg.name, cfg.devices);
                    log::info("registered {} ({} {}, tp {} x pp {}, {} bytes)", cfg.name, cfg.kind,
                              cfg.spec, cfg.tp, cfg.pp, st.models.at(cfg.name).bytes);
                    with_info(self, cfg.name, rp);
                  },
                  [=](caf::error& e) mutable {
                    // Refused by the scheduler: the host copies filled for it go.
                    for (auto d : cfg.devices)
                      self->request(self->state.workers[static_cast<size_t>(d)], 30s,
                                    unregister_atom_v, cfg.name)
                          .then([](bool) {}, [](caf::error&) {});
                    fail(e);
                    rp.deliver(std::move(e));
                  });
        },
        [=](caf::error err) mutable {
          fail(err);
          rp.deliver(std::move(err));
        });
  };
  // A model that can never fit its devices (even with every other one evicted) is
  // refused before any host copy is filled, with the sizes.
  self->request(st.scheduler, 10s, devices_atom_v)
      .then(
          [=](std::vector<device_usage>& devs) mutable {
            std::vector<uint64_t> usable(self->state.workers.size(), 0);
            for (auto& d : devs)
              if (d.device >= 0 && static_cast<size_t>(d.device) < usable.size())
                usable[static_cast<size_t>(d.device)] = d.capacity_bytes;
            if (!planned.empty())
              if (auto no = sched::check_fits(
                      cfg.name, {cfg.devices, planned, cfg.pinned, cfg.priority}, usable)) {
                auto err = make_error(no->code, no->reason);
                fail(err);
                rp.deliver(std::move(err));
                return;
              }
            prepare();
          },
          [=](caf::error& e) mutable {
            fail(e);
            rp.deliver(std::move(e));
          });
  return rp;
}

/// A node is back. Its workers have their shards again (the guards replayed them),
/// except those in groups that span nodes: every rank of such a stage meets again at a
/// new rendezvous.
void rejoin_groups(manager_pointer self, const std::vector<int32_t>& devs) {
  auto& st = self->state;
  std::set<int32_t> back(devs.begin(), devs.end());
  for (auto& [name, m] : st.models) {
    const auto tp = static_cast<size_t>(m.cfg.tp);
    std::vector<size_t> stages;
    for (auto k : split_stages(st, m.cfg)) {
      bool touched = false;
      for (size_t r = 0; r < tp; ++r)
        touched = touched || back.count(m.cfg.devices[k * tp + r]) > 0;
      if (touched) stages.push_back(k);
    }
    if (stages.empty()) continue;
    log::info("{}: {} of its stages span nodes and meet again", name, stages.size());
    auto model = name;
    prepare_shards(
        self, m.cfg, stages,
        [=](std::vector<shard_report>) { log::info("{}: its cross-node groups met again", model); },
        [=](caf::error e) { log::error("{} stays unavailable: {}", model, render(e)); });
  }
}

/// Unregisters `name`: evicted, forgotten by the scheduler, its host copies freed on every
/// worker; refused while requests are queued or running.
caf::result<model_info> unregister_model(manager_pointer self, const std::string& name) {
  auto& st = self->state;
  if (auto f = st.failed.find(name); f != st.failed.end()) {
    auto info = listed_only(f->second.cfg, model_lifecycle::unregistered, {});
    st.failed.erase(f);
    return info;
  }
  auto i = st.models.find(name);
  if (i == st.models.end()) return not_serving(self, name);
  auto& m = i->second;
  if (m.unregistering)
    return make_error(ec::invalid_state, "model " + name + " is being unregistered");
  auto queued = st.queues().queued(m.index);
  auto running = st.queues().in_flight(m.index);
  if (queued > 0 || running > 0)
    return make_error(ec::invalid_state, "model " + name + " has " + std::to_string(queued) +
                                             " requests queued and " + std::to_string(running) +
                                             " batches running; unregister it when they are done");
  // From here new requests are refused. Evict, let the scheduler forget it, then
  // every worker frees its shard's host copy; the name is free once all did.
  m.unregistering = true;
  auto rp = self->make_response_promise<model_info>();
  auto fail = [=](const caf::error& e) mutable {
    if (auto j = self->state.models.find(name); j != self->state.models.end())
      j->second.unregistering = false;
    rp.deliver(with_context(e, "unregistering " + name));
  };
  auto timeout = st.opts.acquire_timeout;
  self->request(st.scheduler, timeout, unload_atom_v, name)
      .then(
          [=](residency_report&) mutable {
            self->request(self->state.scheduler, timeout, unregister_atom_v, name)
                .then(
                    [=](bool) mutable {
                      auto& st = self->state;
                      auto cfg = st.models.at(name).cfg;
                      std::vector<shard_worker_actor> holders;
                      for (auto d : cfg.devices)
                        holders.push_back(st.workers.at(static_cast<size_t>(d)));
                      auto forget = [=]() mutable {
                        auto& st = self->state;
                        auto j = st.models.find(name);
                        // Its batcher queue (empty) and its entry in `names` stay:
                        // both are indexed by the queue's index.
                        if (j != st.models.end()) {
                          st.queues().set_resident(j->second.index, false);
                          st.models.erase(j);
                        }
                        log::info("unregistered {}", name);
                        rp.deliver(listed_only(cfg, model_lifecycle::unregistered, {}));
                      };
                      fan_out_all<bool>(
                          self, holders, caf::timespan{timeout},
                          [=](std::vector<bool>) mutable { forget(); },
                          [=](caf::error e, size_t k) mutable {
                            // The scheduler has forgotten it already: the name is
                            // free; what a worker could not free is logged.
                            log::error("unregistering {}: device {} did not free its shard: {}",
                                       name, cfg.devices[k], render(e));
                            forget();
                          },
                          unregister_atom_v, name);
                    },
                    [=](caf::error& e) mutable { fail(e); });
          },
          [=](caf::error& e) mutable { fail(e); });
  return rp;
}

}  // namespace computron::actors::manager_detail
