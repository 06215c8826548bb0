// The manager's roster: the models the registry handed it (adopt, retire, forget) and the
// names it was told it cannot serve (registering, failed), which its list, info and
// refusals show. The lifecycle itself is the registry's (registration.cpp).
#include <set>

#include "actors/model_manager_state.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::actors::manager_detail {

caf::error unknown_model_error(const std::string& name) {
  return make_error(ec::unknown_model, "no model named '" + name + "'");
}

caf::error not_serving(manager_pointer self, const std::string& name) {
  auto& st = self->state;
  if (auto f = st.listed.find(name); f != st.listed.end()) {
    if (f->second.state == model_lifecycle::failed)
      return make_error(
          f->second.reason_code != 0 ? static_cast<ec>(f->second.reason_code) : ec::unavailable,
          "model " + name + " failed to register: " + f->second.reason);
    if (f->second.state == model_lifecycle::registering)
      return make_error(ec::unavailable, "model " + name + " is being registered");
  }
  if (auto m = st.models.find(name); m != st.models.end() && m->second.unregistering)
    return make_error(ec::unavailable, "model " + name + " is being unregistered");
  return unknown_model_error(name);
}

void note_listed(manager_pointer self, model_info i) {
  auto& st = self->state;
  auto name = i.config.name;
  if (i.state == model_lifecycle::registering || i.state == model_lifecycle::failed)
    st.listed[name] = std::move(i);
  else
    st.listed.erase(name);
}

caf::result<model_info> adopt_model(manager_pointer self, const model_config& cfg, uint64_t bytes,
                                    bool kv_in_ledger) {
  auto& st = self->state;
  if (st.models.count(cfg.name) > 0)
    return make_error(ec::invalid_state, "model " + cfg.name + " is already served");
  auto e = st.engines.find(cfg.kind);
  if (e == st.engines.end())
    return make_error(ec::invalid_configuration, "no engine for model kind " + cfg.kind);
  st.listed.erase(cfg.name);
  auto& eng = *e->second;
  managed_model m;
  m.cfg = cfg;
  m.vocab = eng.vocab(cfg);
  m.max_positions = eng.max_positions(cfg);
  m.bytes = bytes;
  m.weight_bytes = eng.weight_bytes(cfg);
  // A name registered again gets a queue of its own (`names` is indexed with them).
  m.index = st.disp->add_model(cfg.name, cfg.tp, cfg.pp, cfg.devices, cfg.priority, kv_in_ledger);
  st.disp->set_profile(m.index, {}, static_cast<double>(cfg.slo_ms) / 1e3);
  st.names.push_back(cfg.name);
  st.models.emplace(cfg.name, std::move(m));
  st.opts.obs->model_registered(cfg.name, cfg.devices);
  auto rp = self->make_response_promise<model_info>();
  with_info(self, cfg.name, rp);
  return rp;
}

caf::result<model_info> retire_model(manager_pointer self, const std::string& name, bool retire) {
  auto& st = self->state;
  auto i = st.models.find(name);
  if (i == st.models.end()) return not_serving(self, name);
  auto& m = i->second;
  if (!retire) {
    m.unregistering = false;
  } else {
    if (m.unregistering)
      return make_error(ec::invalid_state, "model " + name + " is being unregistered");
    auto queued = st.queues().queued(m.index);
    auto running = st.queues().in_flight(m.index);
    if (!m.cfg.base.empty()) {
      // An adapter's requests wait and run in its base's queue and batches.
      for (auto& [key, q] : st.waiting) queued += q.adapter == name ? 1 : 0;
      std::set<const batch*> batches;
      for (auto& [id, b] : st.batch_of)
        for (auto& q : b->rows)
          if (q.req.id == id && q.adapter == name) batches.insert(b.get());
      running += batches.size();
    }
    if (queued > 0 || running > 0)
      return make_error(ec::invalid_state,
                        "model " + name + " has " + std::to_string(queued) +
                            " requests queued and " + std::to_string(running) +
                            " batches running; unregister it when they are done");
    // From here new requests are refused.
    m.unregistering = true;
  }
  return info_of(st.queues(), m, nullptr);
}

bool forget_model(manager_pointer self, const std::string& name) {
  auto& st = self->state;
  auto j = st.models.find(name);
  if (j == st.models.end()) return false;
  // Its batcher queue (empty) and its entry in `names` stay: both are indexed by the
  // queue's index.
  st.queues().set_resident(j->second.index, false);
  st.disp->remove_model(j->second.index);
  st.models.erase(j);
  return true;
}

}  // namespace computron::actors::manager_detail
