// Registration and unregistration, the registry's side of the model lifecycle: a
// model is checked, prepared on its workers and placed with the scheduler before the
// manager is handed it; unregistering takes it from the manager first, then frees it
// everywhere. Also the re-forming of groups of ranks that span nodes when a node returns.
#include "actors/registry_state.hpp"

#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "sched/ledger.hpp"
#include "sched/placement.hpp"

namespace computron::actors::registry_detail {

namespace {

/// Tells the manager where a name it cannot serve stands (registering, failed, or
/// neither any more), so that its list and its refusals say so.
void tell_manager(registry_pointer self, const std::string& name) {
  auto& st = self->state;
  model_info i;
  if (auto f = st.failed.find(name); f != st.failed.end())
    i = listed_info(f->second.cfg, model_lifecycle::failed, f->second.reason,
                    static_cast<uint8_t>(f->second.code));
  else if (auto r = st.registering.find(name); r != st.registering.end())
    i = listed_info(r->second, model_lifecycle::registering);
  else
    i.state = model_lifecycle::unregistered;
  i.config.name = name;
  self->send(st.manager, listed_atom_v, std::move(i));
}

/// The stages of `cfg` whose tensor-parallel ranks sit on several nodes.
std::vector<size_t> split_stages(const registry_state& st, const model_config& cfg) {
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
void prepare_shards(registry_pointer self, const model_config& cfg, std::vector<size_t> stages,
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

}  // namespace

/// Each shard's bytes on its device (position = stage x tp + rank), from the engine's
/// layout (nothing is allocated); empty when the layout fails or the kind is unknown.
static std::vector<uint64_t> shard_bytes(const registry_state& st, const model_config& cfg) {
  std::vector<uint64_t> out;
  auto e = st.engines.find(cfg.kind);
  if (e == st.engines.end() || cfg.tp < 1) return out;
  const auto tp = static_cast<size_t>(cfg.tp);
  for (size_t pos = 0; pos < cfg.devices.size(); ++pos) {
    auto table = e->second->layout(
        shard_spec{cfg, static_cast<int32_t>(pos % tp), static_cast<int32_t>(pos / tp), {}});
    if (!table) return {};
    out.push_back(table->total_bytes());
  }
  return out;
}

static void register_placed(registry_pointer self, model_config requested, registered_fn done);

/// A LoRA adapter's config as registered: its base's kind, shape, dtype, split and devices
/// (it runs inside the base's forward, on the base's devices), its own name, folder, seed
/// and toy size, and how it is served (pinning, priority, SLO; the base's tokenizer unless
/// it names one). Errors: a base that is not registered (being registered: unavailable,
/// retry), an adapter as a base, devices other than the base's.
/// The registered model an adapter's `base` names (sched::match_base's rule over the
/// whole models registered and being registered); empty: none, or several.
static std::string find_base(const registry_state& st, const std::string& base) {
  std::vector<sched::base_candidate> served, coming;
  for (auto& [name, m] : st.registered)
    if (m.base.empty()) served.push_back({name, m.weights_path});
  for (auto& [name, m] : st.registering)
    if (m.base.empty()) coming.push_back({name, m.weights_path});
  return sched::match_base(base, served, coming);
}

static caf::expected<model_config> adapter_config(const registry_state& st,
                                                  model_config requested) {
  if (auto found = find_base(st, requested.base); !found.empty()) requested.base = found;
  auto b = st.registered.find(requested.base);
  if (b == st.registered.end()) {
    if (st.registering.count(requested.base) > 0)
      return make_error(ec::unavailable, "adapter " + requested.name + ": its base " +
                                             requested.base + " is being registered");
    std::string bases;
    for (auto& [name, m] : st.registered)
      if (m.base.empty()) bases += (bases.empty() ? "" : ", ") + name;
    return make_error(
        ec::unknown_model,
        "adapter " + requested.name + " names base model " + requested.base +
            ", which is not registered (served: " + (bases.empty() ? std::string{"none"} : bases) +
            "; name one as its base: \"base\" in its computron.json or serve config, "
            "base_model_name in --lora-modules)");
  }
  const auto& base = b->second;
  if (!base.base.empty())
    return make_error(ec::invalid_configuration, "adapter " + requested.name + " names " +
                                                     requested.base +
                                                     " as its base, which is an adapter itself");
  if (!requested.devices.empty() && requested.devices != base.devices)
    return make_error(ec::invalid_configuration, "adapter " + requested.name +
                                                     " runs on its base " + requested.base +
                                                     "'s devices; leave its devices out");
  auto cfg = base;
  cfg.name = requested.name;
  cfg.base = requested.base;
  cfg.weights_path = requested.weights_path;
  cfg.checkpoint_dtype.clear();
  cfg.seed = requested.seed;
  // A toy adapter (tests, benchmarks) that gives no size takes a sixteenth of its base's.
  cfg.toy_shard_bytes = requested.toy_shard_bytes > 0
                            ? requested.toy_shard_bytes
                            : std::max<uint64_t>(1, base.toy_shard_bytes / 16);
  cfg.pinned = requested.pinned;
  cfg.priority = requested.priority;
  if (!requested.tokenizer.empty()) cfg.tokenizer = requested.tokenizer;
  if (requested.slo_ms > 0) cfg.slo_ms = requested.slo_ms;
  cfg.max_lora_rank = st.opts.max_lora_rank;
  return cfg;
}

/// Registers `requested`: placed by the scheduler's rule when it names no devices
/// (sched::spread_placement over what the registered models' shards take of each
/// device), validated, refused with the sizes when it can never fit its devices,
/// prepared on every worker, placed with the scheduler, then handed to the manager;
/// listed as failed with the reason when any step fails.
void register_model(registry_pointer self, model_config requested, registered_fn done) {
  if (!requested.base.empty()) {
    auto cfg = adapter_config(self->state, requested);
    if (!cfg) return done(std::move(cfg.error()));
    return register_placed(self, std::move(*cfg), std::move(done));
  }
  if (!requested.devices.empty() || requested.tp < 1 || requested.pp < 1 ||
      int64_t{requested.tp} * requested.pp > 65536)
    return register_placed(self, std::move(requested), std::move(done));
  self->request(self->state.scheduler, 10s, devices_atom_v)
      .then(
          [=](std::vector<device_usage>& devs) mutable {
            auto& st = self->state;
            std::vector<uint64_t> usable(st.workers.size(), 0), placed(st.workers.size(), 0);
            for (auto& d : devs)
              if (d.device >= 0 && static_cast<size_t>(d.device) < usable.size())
                usable[static_cast<size_t>(d.device)] = d.capacity_bytes;
            // Registered and registering models alike: two registrations at once must not
            // both take the emptiest devices.
            for (auto* group : {&st.registered, &st.registering})
              for (auto& [name, m] : *group) {
                auto bytes = shard_bytes(st, m);
                for (size_t i = 0; i < bytes.size(); ++i)
                  if (static_cast<size_t>(m.devices[i]) < placed.size())
                    placed[static_cast<size_t>(m.devices[i])] += bytes[i];
              }
            const auto shards = static_cast<size_t>(requested.tp * requested.pp);
            requested.devices = sched::spread_placement(shards, usable, placed);
            if (requested.devices.empty())
              for (int32_t i = 0; i < requested.tp * requested.pp; ++i)
                requested.devices.push_back(i);  // too few devices: validation says so
            register_placed(self, std::move(requested), std::move(done));
          },
          [=](caf::error& e) mutable { done(std::move(e)); });
}

static void register_placed(registry_pointer self, model_config requested, registered_fn done) {
  auto& st = self->state;
  auto kinds = st.opts.device_kinds;
  kinds.resize(st.workers.size(), gpu::device_kind::emulated);
  auto cfg = resolve_dtype(std::move(requested), kinds);
  if (st.registered.count(cfg.name) > 0)
    return done(make_error(ec::invalid_state, "model " + cfg.name + " is already registered"));
  if (st.registering.count(cfg.name) > 0)
    return done(make_error(ec::invalid_state, "model " + cfg.name + " is being registered"));
  if (auto err = validate_model(st.engines, cfg, kinds)) {
    if (!cfg.name.empty()) {
      st.failed[cfg.name] = {cfg, render(err), ec::unavailable};
      tell_manager(self, cfg.name);
    }
    return done(std::move(err));
  }
  // A failed registration tried again is registering now, not failed.
  st.failed.erase(cfg.name);
  st.registering.emplace(cfg.name, cfg);
  tell_manager(self, cfg.name);
  // Stays listed as failed, with the reason, until it registers or is unregistered.
  auto fail = [=](const caf::error& err) {
    self->state.registering.erase(cfg.name);
    self->state.failed[cfg.name] = {
        cfg, render(err),
        is(err, ec::out_of_device_memory) ? ec::out_of_device_memory : ec::unavailable};
    tell_manager(self, cfg.name);
    log::error("model {} failed to register: {}", cfg.name, render(err));
  };
  std::vector<size_t> all_stages;
  for (size_t k = 0; k < static_cast<size_t>(cfg.pp); ++k) all_stages.push_back(k);
  // Its shards' bytes from the engine's layout (nothing is allocated), aligned as
  // a worker accounts them; empty when the layout fails (preparing says why).
  auto planned = shard_bytes(st, cfg);  // rounded to the device's pages below
  const auto tp = static_cast<size_t>(cfg.tp);
  // What the workers filled for it goes again: the scheduler or the manager refused it.
  auto free_shards = [=] {
    for (auto d : cfg.devices)
      self->request(self->state.workers[static_cast<size_t>(d)], 30s, unregister_atom_v, cfg.name)
          .then([](bool) {}, [](caf::error&) {});
  };
  auto hand_over = [=](model_placement p) mutable {
    uint64_t bytes = 0;
    for (auto b : p.bytes) bytes += b;
    self->request(self->state.manager, self->state.opts.timeout, adopt_atom_v, cfg, bytes,
                  !p.kv_block_bytes.empty())
        .then(
            [=](model_info& info) mutable {
              auto& st = self->state;
              st.registering.erase(cfg.name);
              st.failed.erase(cfg.name);
              st.registered[cfg.name] = cfg;
              log::info("registered {} ({} {}, tp {} x pp {}, {} bytes)", cfg.name, cfg.kind,
                        cfg.spec, cfg.tp, cfg.pp, bytes);
              done(std::move(info));
            },
            [=](caf::error& e) mutable {
              // The manager may have taken it before its answer failed: it lets it go.
              self->request(self->state.manager, self->state.opts.timeout, forget_atom_v, cfg.name)
                  .then([](bool) {}, [](caf::error&) {});
              self->request(self->state.scheduler, 10s, unregister_atom_v, cfg.name)
                  .then([](bool) {}, [](caf::error&) {});
              free_shards();
              fail(e);
              done(std::move(e));
            });
  };
  auto prepare = [=]() mutable {
    prepare_shards(
        self, cfg, all_stages,
        [=](std::vector<shard_report> reports) mutable {
          model_placement p{cfg.name, cfg.devices, {}, cfg.pinned, cfg.priority, {}, cfg.base};
          for (auto& r : reports) p.bytes.push_back(r.bytes);
          // An adapter's rows keep their KV in its base's blocks.
          if (self->state.opts.kv_in_ledger && cfg.base.empty()) {
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
              .then([=](bool) mutable { hand_over(p); },
                    [=](caf::error& e) mutable {
                      free_shards();
                      fail(e);
                      done(std::move(e));
                    });
        },
        [=](caf::error err) mutable {
          fail(err);
          done(std::move(err));
        });
  };
  // A model that can never fit its devices (even with every other one evicted) is
  // refused before any host copy is filled, with the sizes.
  self->request(st.scheduler, 10s, devices_atom_v)
      .then(
          [=](std::vector<device_usage>& devs) mutable {
            std::vector<uint64_t> usable(self->state.workers.size(), 0);
            std::vector<uint64_t> page(self->state.workers.size(), 1);
            for (auto& d : devs)
              if (d.device >= 0 && static_cast<size_t>(d.device) < usable.size()) {
                usable[static_cast<size_t>(d.device)] = d.capacity_bytes;
                page[static_cast<size_t>(d.device)] = std::max<uint64_t>(1, d.page_bytes);
              }
            // As a worker accounts them: whole pages of each shard's device.
            for (size_t i = 0; i < planned.size(); ++i) {
              auto d = static_cast<size_t>(cfg.devices[i]);
              if (d < page.size()) planned[i] = (planned[i] + page[d] - 1) / page[d] * page[d];
            }
            if (!planned.empty())
              if (auto no = sched::check_fits(
                      cfg.name, {cfg.devices, planned, cfg.pinned, cfg.priority}, usable)) {
                auto err = make_error(no->code, no->reason);
                fail(err);
                done(std::move(err));
                return;
              }
            prepare();
          },
          [=](caf::error& e) mutable {
            fail(e);
            done(std::move(e));
          });
}

/// A node is back. Its workers have their shards again (the guards replayed them),
/// except those in groups that span nodes: every rank of such a stage meets again at a
/// new rendezvous.
void rejoin_groups(registry_pointer self, const std::vector<int32_t>& devs) {
  auto& st = self->state;
  std::set<int32_t> back(devs.begin(), devs.end());
  for (auto& [name, cfg] : st.registered) {
    if (!cfg.base.empty()) continue;  // an adapter has no group of its own
    const auto tp = static_cast<size_t>(cfg.tp);
    std::vector<size_t> stages;
    for (auto k : split_stages(st, cfg)) {
      bool touched = false;
      for (size_t r = 0; r < tp; ++r) touched = touched || back.count(cfg.devices[k * tp + r]) > 0;
      if (touched) stages.push_back(k);
    }
    if (stages.empty()) continue;
    log::info("{}: {} of its stages span nodes and meet again", name, stages.size());
    auto model = name;
    prepare_shards(
        self, cfg, stages,
        [=](std::vector<shard_report>) { log::info("{}: its cross-node groups met again", model); },
        [=](caf::error e) { log::error("{} stays unavailable: {}", model, render(e)); });
  }
}

/// Unregisters `name`: the manager stops admitting it (refused while requests of it are
/// queued or running), then it is evicted, forgotten by the scheduler, its host copies are
/// freed on every worker, and the manager forgets it.
caf::result<model_info> unregister_model(registry_pointer self, const std::string& name) {
  auto& st = self->state;
  if (auto f = st.failed.find(name); f != st.failed.end()) {
    auto info = listed_info(f->second.cfg, model_lifecycle::unregistered);
    st.failed.erase(f);
    tell_manager(self, name);
    return info;
  }
  if (st.registering.count(name) > 0)
    return make_error(ec::unavailable, "model " + name + " is being registered");
  if (st.unregistering.count(name) > 0)
    return make_error(ec::invalid_state, "model " + name + " is being unregistered");
  auto i = st.registered.find(name);
  if (i == st.registered.end())
    return make_error(ec::unknown_model, "no model named '" + name + "'");
  std::string adapters;
  for (auto& [other, c] : st.registered)
    if (c.base == name) adapters += (adapters.empty() ? "" : ", ") + other;
  if (!adapters.empty())
    return make_error(ec::invalid_state, "model " + name + " is the base of adapters " + adapters +
                                             ": unregister them first");
  auto cfg = i->second;
  st.unregistering.insert(name);
  auto rp = self->make_response_promise<model_info>();
  auto timeout = st.opts.timeout;
  auto fail = [=](const caf::error& e, bool readmit) mutable {
    self->state.unregistering.erase(name);
    if (readmit)
      self->request(self->state.manager, timeout, retire_atom_v, name, false)
          .then([](model_info&) {}, [](caf::error&) {});
    rp.deliver(with_context(e, "unregistering " + name));
  };
  // The name is free once every worker let go of its shard (or said why it could not:
  // the scheduler has forgotten it already, so what a worker could not free is logged).
  auto forget = [=]() mutable {
    self->request(self->state.manager, timeout, forget_atom_v, name)
        .then([](bool) {}, [](caf::error&) {});
    self->state.unregistering.erase(name);
    self->state.registered.erase(name);
    log::info("unregistered {}", name);
    rp.deliver(listed_info(cfg, model_lifecycle::unregistered));
  };
  auto free_shards = [=]() mutable {
    std::vector<shard_worker_actor> holders;
    for (auto d : cfg.devices) holders.push_back(self->state.workers.at(static_cast<size_t>(d)));
    fan_out_all<bool>(
        self, holders, caf::timespan{timeout}, [=](std::vector<bool>) mutable { forget(); },
        [=](caf::error e, size_t k) mutable {
          log::error("unregistering {}: device {} did not free its shard: {}", name, cfg.devices[k],
                     render(e));
          forget();
        },
        unregister_atom_v, name);
  };
  // From the manager's yes on, new requests are refused.
  self->request(st.manager, timeout, retire_atom_v, name, true)
      .then(
          [=](model_info&) mutable {
            self->request(self->state.scheduler, timeout, unload_atom_v, name)
                .then(
                    [=](residency_report&) mutable {
                      self->request(self->state.scheduler, timeout, unregister_atom_v, name)
                          .then([=](bool) mutable { free_shards(); },
                                [=](caf::error& e) mutable { fail(e, true); });
                    },
                    [=](caf::error& e) mutable { fail(e, true); });
          },
          [=](caf::error& e) mutable {
            // Refused (requests in flight), or no answer: in case it took effect, the
            // manager admits the model again (harmless where it did not).
            self->state.unregistering.erase(name);
            self->request(self->state.manager, timeout, retire_atom_v, name, false)
                .then([](model_info&) {}, [](caf::error&) {});
            rp.deliver(std::move(e));
          });
  return rp;
}

}  // namespace computron::actors::registry_detail
