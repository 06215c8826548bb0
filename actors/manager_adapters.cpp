// The manager's LoRA adapters (issue 47): a request that names an adapter ("name", or
// SGLang's "base:name") waits in its base's queue and runs in the base's batches, with its
// adapter per row. A batch leases every adapter its rows run with, beside the base's own
// lease (the ledger keeps an adapter's base resident while the adapter is leased), from its
// start or from the step its rows join, to its end.
#include <map>
#include <memory>
#include <set>

#include <caf/all.hpp>

#include "actors/model_manager_state.hpp"
#include "common/error.hpp"

namespace computron::actors::manager_detail {

std::string registered_name(const model_manager_state& st, const std::string& name) {
  if (st.models.count(name) > 0) return name;
  // "base:name": the adapter `name` of the served model `base`. A name that merely holds
  // a colon, or an adapter of another base, stays as it is (and is unknown).
  auto colon = name.find(':');
  if (colon == std::string::npos) return name;
  auto base = name.substr(0, colon), adapter = name.substr(colon + 1);
  auto a = st.models.find(adapter);
  if (a == st.models.end() || a->second.cfg.base != base) return name;
  return adapter;
}

void lease_adapters(manager_pointer self, const batch_ptr& b, const std::vector<size_t>& rows,
                    std::function<void(std::map<std::string, caf::error>)> done,
                    std::chrono::milliseconds wait) {
  auto& st = self->state;
  std::set<std::string> wanted;
  for (auto r : rows) {
    auto& a = b->rows[r].adapter;
    if (!a.empty() && b->adapters.count(a) == 0) wanted.insert(a);
  }
  if (wanted.empty()) return done({});
  auto failed = std::make_shared<std::map<std::string, caf::error>>();
  auto left = std::make_shared<size_t>(wanted.size());
  const auto deadline = now(self) + wait;
  for (auto& name : wanted) {
    // The batch holds its base's lease meanwhile, so the wait is bounded here (at the
    // deadline the row fails as unavailable, which a client may retry, and the batch goes
    // on). The scheduler's answer is awaited without a timeout: a lease granted after the
    // manager gave up is given back at once, never left held by nobody.
    auto w = std::make_shared<reply_wait>();
    w->deadline = deadline;
    w->expire = [=] {
      (*failed)[name] = make_error(
          ec::unavailable, "LoRA adapter " + name + " found no room beside the rows running " +
                               "with its base " + b->model + " within " +
                               std::to_string(wait.count()) + " ms; retry");
      if (--*left == 0) done(std::move(*failed));
    };
    st.adapter_waits.push_back(w);
    self->delayed_send(self, std::chrono::duration_cast<std::chrono::microseconds>(wait),
                       tick_atom_v);
    self->request(st.scheduler, caf::infinite, acquire_atom_v, name)
        .then(
            [=](lease& l) {
              if (w->given_up) {
                self->send(self->state.scheduler, release_atom_v, name);
                return;
              }
              w->answered = true;
              b->adapters.insert(name);
              // A cold adapter's load is part of its rows' wait, as a cold base's is.
              b->load_ms = std::max(b->load_ms, l.wait_ms);
              b->swapped = b->swapped || l.loaded;
              if (--*left == 0) done(std::move(*failed));
            },
            [=](caf::error& err) {
              if (w->given_up) return;
              w->answered = true;
              (*failed)[name] = with_context(err, "LoRA adapter " + name);
              if (--*left == 0) done(std::move(*failed));
            });
  }
}

void expire_adapter_waits(manager_pointer self) {
  expire_waits(self->state.adapter_waits, now(self));
}

void release_unused_adapters(manager_pointer self, const batch_ptr& b,
                             const std::vector<sched::join_plan>& joins) {
  std::set<std::string> used;
  for (auto& j : joins)
    for (auto& row : j.rows)
      if (auto q = self->state.waiting.find(row.key); q != self->state.waiting.end())
        used.insert(q->second.adapter);
  for (auto* rows : {&b->sent, &b->pending})
    for (auto r : *rows)
      if (r < b->rows.size() && !b->rows[r].adapter.empty()) used.insert(b->rows[r].adapter);
  for (auto i = b->adapters.begin(); i != b->adapters.end();) {
    if (used.count(*i) > 0) {
      ++i;
      continue;
    }
    self->send(self->state.scheduler, release_atom_v, *i);
    i = b->adapters.erase(i);
  }
}

void release_adapters(manager_pointer self, const batch_ptr& b) {
  for (auto& name : b->adapters) self->send(self->state.scheduler, release_atom_v, name);
  b->adapters.clear();
}

std::vector<size_t> drop_failed_adapters(manager_pointer self, const batch_ptr& b,
                                         std::vector<size_t> rows,
                                         const std::map<std::string, caf::error>& failed) {
  if (failed.empty()) return rows;
  std::vector<size_t> kept;
  for (auto r : rows) {
    auto& q = b->rows[r];
    auto f = failed.find(q.adapter);
    if (f == failed.end()) {
      kept.push_back(r);
      continue;
    }
    reply_error(self, q, f->second);
  }
  return kept;
}

const std::string& served_name(const queued_request& q, const batch& b) {
  return q.adapter.empty() ? b.model : q.adapter;
}

}  // namespace computron::actors::manager_detail
