#include "actors/frontend.hpp"

#include <map>
#include <set>

#include <caf/all.hpp>

#include "common/error.hpp"
#include "sched/batching.hpp"

namespace computron::actors {

namespace {

struct frontend_state {
  static constexpr const char* name = "frontend";
  serving_actor backend;
  frontend_options opts;
  std::map<std::string, uint32_t> outstanding;
  uint32_t total = 0;
  uint64_t next_id = 1;
  /// The unanswered requests of each requester that can end (a monitored actor); when
  /// it ends first, they are cancelled at the backend.
  std::map<caf::actor_addr, std::set<uint64_t>> asked_by;
};

using frontend_pointer = frontend_actor::stateful_pointer<frontend_state>;

frontend_actor::behavior_type frontend(frontend_pointer self, serving_actor backend,
                                       frontend_options opts) {
  self->state.backend = std::move(backend);
  self->state.opts = std::move(opts);
  // A requester ended before its answers: nobody will read them, so the backend stops
  // working on them (a queued request leaves at once, a running row after its step).
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    auto i = st.asked_by.find(dm.source);
    if (i == st.asked_by.end()) return;
    for (auto id : i->second) self->send(st.backend, cancel_atom_v, id, false);
    st.asked_by.erase(i);
  });
  return {
      [=](infer_atom, infer_request& req) -> caf::result<infer_reply> {
        auto& st = self->state;
        auto& n = st.outstanding[req.model];
        if (n >= st.opts.max_outstanding_per_model || st.total >= st.opts.max_outstanding) {
          if (n == 0) st.outstanding.erase(req.model);
          st.opts.obs->request_done(req.model, "overloaded", 0);
          return make_error(ec::overloaded,
                            "too many requests in flight for " + req.model + "; retry later");
        }
        ++n;
        ++st.total;
        req.id = st.next_id++;
        auto model = req.model;
        auto id = req.id;
        // Watched: local requesters (the HTTP server's actors). Anonymous requests have
        // nobody to watch, and a remote one (a console over CAF) is not monitored: a
        // monitor across nodes is state on both ends, and under LeakSanitizer the console
        // process then exited with CAF's broker and proxies unreleased.
        auto requester = caf::actor_cast<caf::actor_addr>(self->current_sender());
        if (requester && requester.node() != self->node()) requester = caf::actor_addr{};
        if (requester) {
          auto& ids = st.asked_by[requester];
          if (ids.empty()) self->monitor(requester);
          ids.insert(id);
        }
        auto done = [=] {
          auto& st = self->state;
          --st.total;
          auto i = st.outstanding.find(model);
          if (i != st.outstanding.end() && --i->second == 0) st.outstanding.erase(i);
          if (!requester) return;
          auto a = st.asked_by.find(requester);
          if (a == st.asked_by.end()) return;
          a->second.erase(id);
          if (a->second.empty()) {
            self->demonitor(requester);
            st.asked_by.erase(a);
          }
        };
        auto t = self->clock().now();
        auto deadline = sched::deadline_of(t, req.deadline_ms, st.opts.default_deadline) - t;
        auto rp = self->make_response_promise<infer_reply>();
        self->request(st.backend, deadline + st.opts.reply_slack, infer_atom_v, std::move(req))
            .then(
                [=](infer_reply& r) mutable {
                  done();
                  rp.deliver(std::move(r));
                },
                [=](caf::error& e) mutable {
                  done();
                  rp.deliver(std::move(e));
                });
        return rp;
      },
      [=](cancel_atom a, uint64_t id, bool complete) {
        self->send(self->state.backend, a, id, complete);
      },
      [=](list_atom a) { return self->delegate(self->state.backend, a); },
      [=](info_atom a, std::string& m) {
        return self->delegate(self->state.backend, a, std::move(m));
      },
      [=](describe_atom a, std::string& m) {
        return self->delegate(self->state.backend, a, std::move(m));
      },
      [=](load_atom a, std::string& m) {
        return self->delegate(self->state.backend, a, std::move(m));
      },
      [=](unload_atom a, std::string& m) {
        return self->delegate(self->state.backend, a, std::move(m));
      },
      [=](devices_atom a) { return self->delegate(self->state.backend, a); },
      [=](report_atom) -> caf::result<caf::settings> {
        auto rp = self->make_response_promise<caf::settings>();
        self->request(self->state.backend, std::chrono::seconds(10), report_atom_v)
            .then(
                [=](caf::settings& s) mutable {
                  auto& st = self->state;
                  caf::settings mine;
                  mine["outstanding"] = caf::config_value{static_cast<int64_t>(st.total)};
                  mine["max-outstanding"] =
                      caf::config_value{static_cast<int64_t>(st.opts.max_outstanding)};
                  s["frontend"] = caf::config_value{std::move(mine)};
                  rp.deliver(std::move(s));
                },
                [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
  };
}

}  // namespace

caf::expected<frontend_actor> spawn_frontend(caf::actor_system& sys, serving_actor backend,
                                             frontend_options opts) {
  if (!backend) return make_error(ec::invalid_configuration, "frontend without a backend");
  if (opts.max_outstanding_per_model == 0 || opts.max_outstanding == 0)
    return make_error(ec::invalid_configuration, "frontend queue bounds must be at least 1");
  if (!opts.obs) opts.obs = null_observer();
  return sys.spawn(frontend, std::move(backend), std::move(opts));
}

}  // namespace computron::actors
