#include "actors/model_manager.hpp"
#include "actors/model_manager_state.hpp"
#include "sched/kv_blocks.hpp"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include <fmt/ranges.h>
#include <caf/all.hpp>

#include "actors/engine.hpp"
#include "actors/join.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "models/sampling.hpp"
#include "sched/dispatch.hpp"

namespace computron::actors {

namespace manager_detail {

sched::time_point now(manager_pointer self) {
  return self->clock().now();
}

caf::error check_request(const managed_model& m, const infer_request& r, int64_t max_tokens_limit) {
  auto bad = [&](std::string why) { return make_error(ec::invalid_request, std::move(why)); };
  if (r.tokens.empty()) return bad("the prompt is empty");
  for (auto t : r.tokens)
    if (t < 0 || t >= m.vocab)
      return bad("token id " + std::to_string(t) + " is outside the vocabulary of " + m.cfg.name +
                 " (0.." + std::to_string(m.vocab - 1) + ")");
  for (auto id : r.stop_ids)
    if (id < 0 || id >= m.vocab)
      return bad("stop token " + std::to_string(id) + " is outside the vocabulary of " +
                 m.cfg.name + " (0.." + std::to_string(m.vocab - 1) + ")");
  for (auto id : r.sampling.bias_ids)
    if (id < 0 || id >= m.vocab)
      return bad("logit_bias names token " + std::to_string(id) + ", outside the vocabulary of " +
                 m.cfg.name + " (0.." + std::to_string(m.vocab - 1) + ")");
  if (r.max_tokens < 1 || (max_tokens_limit > 0 && r.max_tokens > max_tokens_limit))
    return bad("max_tokens must be " +
               (max_tokens_limit > 0 ? "1.." + std::to_string(max_tokens_limit) : "at least 1") +
               ", got " + std::to_string(r.max_tokens));
  if (static_cast<int64_t>(r.tokens.size()) + r.max_tokens > m.max_positions)
    return bad("prompt of " + std::to_string(r.tokens.size()) + " tokens plus max_tokens " +
               std::to_string(r.max_tokens) + " exceeds the " + std::to_string(m.max_positions) +
               " positions of " + m.cfg.name);
  if (auto err = models::validate(to_sampling_params(r.sampling))) return bad(render(err));
  if (r.sampling.prompt_logprobs < -1 || r.sampling.prompt_logprobs > 20)
    return bad("prompt_logprobs must be in 0..20 (or -1 for none), got " +
               std::to_string(r.sampling.prompt_logprobs));
  // Scoring a prompt holds a row of f32 logits per prompt token on the device and the host.
  constexpr uint64_t max_scored_floats = uint64_t{1} << 27;  // 512 MiB
  if (r.sampling.prompt_logprobs >= 0 &&
      r.tokens.size() * static_cast<uint64_t>(m.vocab) > max_scored_floats)
    return bad("scoring a prompt of " + std::to_string(r.tokens.size()) + " tokens over " +
               m.cfg.name + "'s vocabulary of " + std::to_string(m.vocab) + " takes over 512 MiB " +
               "of logits; at most " +
               std::to_string(max_scored_floats / static_cast<uint64_t>(m.vocab)) +
               " tokens can be scored");
  return {};
}

model_info info_of(const sched::batcher& b, const managed_model& m, const residency_report* r) {
  model_info i;
  i.config = m.cfg;
  i.state = r ? r->state : model_lifecycle::unknown;
  i.bytes = m.bytes;
  i.weight_bytes = m.weight_bytes;
  i.queued = static_cast<uint32_t>(b.queued(m.index));
  i.busy = b.in_flight(m.index) > 0;
  i.served = m.served;
  i.loads = r ? r->loads : 0;
  i.evictions = r ? r->evictions : 0;
  i.vocab = m.vocab;
  i.max_positions = m.max_positions;
  if (r) i.config.pinned = r->pinned;
  if (r) i.idle_s = r->idle_s;
  if (r) i.reason = r->reason;
  if (r) i.kv_blocks = r->kv_blocks;
  if (r) i.kv_bytes = r->kv_bytes;
  if (m.unregistering) i.state = model_lifecycle::unregistering;
  return i;
}

/// Why a request failed before its batch ran, as its client reads it.
caf::error row_error(manager_pointer self, const sched::row_failure& f, const queued_request& q) {
  auto& st = self->state;
  auto id = std::to_string(q.req.id);
  auto& model = st.names[f.model];
  switch (f.why) {
    case sched::row_end::expired:
      return make_error(ec::deadline_exceeded,
                        "request " + id + " passed its deadline in the queue of " + model);
    case sched::row_end::dropped: {
      auto est = st.queues().estimate_s(f.model, f.row.steps).value_or(0);
      auto left = std::max(0.0, sched::seconds_between(now(self), f.row.deadline));
      return make_error(ec::deadline_exceeded,
                        fmt::format("request {} would miss its deadline: {} expects about "
                                    "{:.0f} ms of work, {:.0f} ms are left (drop_late)",
                                    id, model, est * 1e3, left * 1e3));
    }
    case sched::row_end::expired_waiting:
      return make_error(ec::deadline_exceeded,
                        "request " + id + " passed its deadline waiting for " + model);
    case sched::row_end::expired_running:
      return make_error(
          ec::deadline_exceeded,
          fmt::format("request {} passed its deadline while {} generated it ({}: its client "
                      "waits no longer)",
                      id, model,
                      q.req.drop_late
                          ? "drop_late"
                          : fmt::format("{} ms past it",
                                        std::chrono::duration_cast<std::chrono::milliseconds>(
                                            st.queues().options().late_grace)
                                            .count())));
    case sched::row_end::cancelled:
      break;
    case sched::row_end::no_kv_room:
      return make_error(ec::out_of_device_memory,
                        fmt::format("request {} needs {} KV blocks of {} tokens on {}'s devices, "
                                    "more than they can ever hold beside its weights and the "
                                    "pinned models, or in the KV reserve (a shorter prompt or "
                                    "max_tokens, or more or larger devices)",
                                    id, sched::kv_blocks_for(f.row.prompt_tokens + f.row.steps - 1),
                                    sched::kv_block_tokens, model));
  }
  return make_error(ec::cancelled, "request " + id + " was cancelled before it ran");
}

/// How long a batch about to start waits for its rows' adapters beside its base's lease:
/// longer than a join's (nothing runs yet), bounded all the same.
constexpr std::chrono::milliseconds start_adapter_wait{30000};

/// Asks the scheduler for a lease on a formed batch's model; the dispatch core hears the
/// answer.
void start_batch(manager_pointer self, const batch_ptr& b) {
  auto& st = self->state;
  self->request(st.scheduler, st.opts.acquire_timeout, acquire_atom_v, b->model)
      .then(
          [=](lease& l) {
            auto& st = self->state;
            b->load_ms = l.wait_ms;
            b->swapped = l.loaded;
            b->loading = l.loading;
            b->load_left_ms = l.load_left_ms;
            sched::lease_info info;
            info.leased_at = now(self);
            info.loading = l.loading;
            info.load_left_s = l.load_left_ms / 1e3;
            info.load_estimate_s = l.load_estimate_ms / 1e3;
            // Residency as the scheduler saw it at the grant (evictions happen behind the
            // manager); empty: unchanged since the last lease.
            if (!l.resident.empty()) {
              std::vector<uint32_t> in;
              for (auto& name : l.resident)
                if (auto i = st.models.find(name); i != st.models.end())
                  in.push_back(i->second.index);
              info.resident = std::move(in);
            }
            // Then its rows' adapters: a row whose adapter cannot be had fails alone (the
            // dispatch core starts the batch without it).
            std::vector<size_t> all(b->rows.size());
            for (size_t r = 0; r < all.size(); ++r) all[r] = r;
            lease_adapters(
                self, b, all,
                [=](std::map<std::string, caf::error> failed) {
                  auto& st = self->state;
                  auto kept = drop_failed_adapters(self, b, all, failed);
                  if (kept.size() < all.size()) {
                    std::vector<queued_request> rows;
                    for (size_t r = 0, k = 0; r < b->rows.size(); ++r)
                      if (k < kept.size() && kept[k] == r) {
                        rows.push_back(std::move(b->rows[r]));
                        ++k;
                      } else {
                        st.disp->cancel(b->id, b->rows[r].key);
                      }
                    b->rows = std::move(rows);
                  }
                  carry_out(self, st.disp->leased(b->id, info, now(self)));
                },
                start_adapter_wait);
          },
          [=](caf::error& err) {
            auto& st = self->state;
            st.pending.erase(b->id);
            for (auto& q : b->rows) reply_error(self, q, err);
            carry_out(self, st.disp->lease_failed(b->id, now(self)));
          });
}

/// Starts a batch the dispatch core let run: its rows are the live ones.
void run_batch(manager_pointer self, const batch_ptr& b, const sched::started_batch& s) {
  std::vector<queued_request> live;
  for (auto& q : b->rows)
    for (auto& e : s.rows)
      if (e.key == q.key) {
        live.push_back(std::move(q));
        break;
      }
  b->rows = std::move(live);
  b->outputs.assign(b->rows.size(), {});
  b->logprobs.assign(b->rows.size(), {});
  b->prompt_logprobs.assign(b->rows.size(), {});
  b->sent.clear();
  for (size_t r = 0; r < b->rows.size(); ++r) b->sent.push_back(r);
  b->run_s = now_s();
  for (auto& q : b->rows) q.batch_rows = static_cast<uint32_t>(b->rows.size());
  set_running(self, b, b->sent.size());
  run_step(self, b, 0, &s.plan);
}

/// Asks the scheduler for a batch's KV blocks; the answer goes to the dispatch core, and
/// to the batch's step boundary where one waits for it. No timeout: the scheduler always
/// answers (a start ask waits only while other batches hold KV, which they give back), and
/// an answer after a timeout would leave its blocks taken for nobody.
void ask_kv(manager_pointer self, const sched::kv_request& a) {
  auto& st = self->state;
  auto done = [=](uint64_t blocks, uint64_t ceiling) {
    auto& st = self->state;
    auto e = st.disp->kv_granted(a.batch, a.model, blocks, ceiling, now(self));
    if (auto i = st.at_boundary.find(a.batch); i != st.at_boundary.end()) {
      auto b = std::move(i->second);
      st.at_boundary.erase(i);
      at_step_boundary(self, b, std::move(e));
      return;
    }
    carry_out(self, std::move(e));
  };
  self->request(st.scheduler, caf::infinite, kv_reserve_atom_v, st.names[a.model], a.want, a.need,
                a.start)
      .then(done, [=](caf::error& err) {
        log::warn("KV blocks for {}: {}", self->state.names[a.model], to_string(err));
        done(0, UINT64_MAX);
      });
}

void carry_out(manager_pointer self, sched::dispatch_effects e) {
  auto& st = self->state;
  auto t = now(self);
  for (auto& f : e.failures) {
    if (f.batch == 0) {
      auto i = st.waiting.find(f.row.key);
      if (i == st.waiting.end()) continue;  // cancelled in the queue
      reply_error(self, i->second, row_error(self, f, i->second));
      st.waiting.erase(i);
      continue;
    }
    auto i = st.pending.find(f.batch);
    if (i == st.pending.end()) continue;
    for (auto& q : i->second->rows)
      if (q.key == f.row.key) reply_error(self, q, row_error(self, f, q));
  }
  // Rows of a batch about to start that found no KV room go back to the queue (running
  // batches' preemptions are at_step_boundary's).
  for (auto& p : e.preempted) {
    auto i = st.pending.find(p.batch);
    if (i == st.pending.end()) continue;
    auto& rows = i->second->rows;
    for (auto& row : p.rows)
      for (auto r = rows.begin(); r != rows.end(); ++r)
        if (r->key == row.key) {
          st.batch_of.erase(r->req.id);
          st.waiting.emplace(row.key, std::move(*r));
          rows.erase(r);
          break;
        }
  }
  // KV goes back before the lease: the scheduler must not see a lease-free model with KV.
  for (auto& r : e.kv_returns)
    self->send(st.scheduler, kv_return_atom_v, st.names[r.model], r.blocks);
  for (auto& r : e.releases) {
    self->send(st.scheduler, release_atom_v, st.names[r.model]);
    // A batch that ends before it ran (its rows expired, or found no KV room) gives its
    // adapters back too; one that ran did so in finish_batch.
    if (auto i = st.pending.find(r.batch); i != st.pending.end()) {
      release_adapters(self, i->second);
      st.pending.erase(i);
    }
  }
  for (auto& s : e.started) {
    auto i = st.pending.find(s.id);
    if (i == st.pending.end()) continue;
    auto b = std::move(i->second);
    st.pending.erase(i);
    run_batch(self, b, s);
  }
  for (auto& f : e.formed) {
    auto b = std::make_shared<batch>();
    b->id = f.id;
    b->model = st.names[f.model];
    b->dispatched = t;
    for (auto& row : f.rows) {
      auto i = st.waiting.find(row.key);
      if (i == st.waiting.end()) continue;
      st.batch_of[i->second.req.id] = b;
      i->second.taken = t;
      b->rows.push_back(std::move(i->second));
      st.waiting.erase(i);
    }
    if (b->rows.empty()) {
      // Every row of it was cancelled in the queue.
      st.disp->abandon(f.id);
      continue;
    }
    st.pending[f.id] = b;
    start_batch(self, b);
  }
  for (auto& a : e.kv_asks) ask_kv(self, a);
  for (auto at : e.ticks)
    self->delayed_send(self, std::chrono::duration_cast<std::chrono::microseconds>(at - t),
                       tick_atom_v);
  if (e.gpulets_changed) {
    std::string parts;
    for (auto& p : st.disp->partitions()) parts += fmt::format(" [{}]", fmt::join(p, ","));
    log::info("gpu-lets re-planned:{}", parts);
    st.opts.obs->gpulets(st.disp->partitions());
  }
  if (e.dispatched)
    for (uint32_t i = 0; i < st.names.size(); ++i)
      st.opts.obs->queue_depth(st.names[i], st.queues().queued(i));
}

model_manager_actor::behavior_type model_manager(manager_pointer self, model_manager_options opts,
                                                 engine_registry engines,
                                                 std::vector<shard_worker_actor> workers,
                                                 swap_scheduler_actor scheduler,
                                                 std::shared_ptr<sched::dispatcher> disp) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.engines = std::move(engines);
  st.workers = std::move(workers);
  st.scheduler = std::move(scheduler);
  st.disp = std::move(disp);
  // The metrics' gpu-let series exist from the start, split or not.
  st.opts.obs->gpulets(st.disp->partitions());
  return {
      [=](infer_atom, infer_request& req) -> caf::result<infer_reply> {
        auto& st = self->state;
        req.model = registered_name(st, req.model);
        auto i = st.models.find(req.model);
        if (i == st.models.end() || i->second.unregistering) return not_serving(self, req.model);
        // A LoRA adapter's request waits in its base's queue and runs in the base's batches,
        // its rows with the adapter.
        std::string adapter;
        if (!i->second.cfg.base.empty()) {
          adapter = req.model;
          i = st.models.find(i->second.cfg.base);
          if (i == st.models.end() || i->second.unregistering)
            return make_error(ec::unavailable, "LoRA adapter " + adapter + "'s base " +
                                                   st.models.at(adapter).cfg.base +
                                                   " is not served");
        }
        auto& m = i->second;
        if (auto err = check_request(m, req, st.opts.max_tokens_limit)) return err;
        auto t = now(self);
        auto key = st.next_key++;
        // A prompt whose log-probabilities are asked for is computed in one step (a
        // chunked prefill gives only the last position's).
        auto e = st.disp->admit(m.index, key, t, req.deadline_ms, req.max_tokens, req.drop_late,
                                static_cast<int64_t>(req.tokens.size()),
                                req.sampling.prompt_logprobs >= 0);
        if (e.refused) return make_error(e.refused->code, e.refused->reason);
        queued_request q{
            std::move(req), std::move(adapter), key, self->make_response_promise<infer_reply>(), t,
            e.deadline};
        auto rp = q.rp;
        self->send(st.scheduler, demand_atom_v, m.cfg.name, uint32_t{1});
        st.waiting.emplace(key, std::move(q));
        carry_out(self, std::move(e));
        return rp;
      },
      [=](cancel_atom, uint64_t id, bool complete) {
        auto& st = self->state;
        if (auto i = st.batch_of.find(id); i != st.batch_of.end()) {
          auto& b = *i->second;
          b.cancelled.insert(id);
          if (complete) b.completed.insert(id);
          for (auto& q : b.rows)
            if (q.req.id == id) st.disp->cancel(b.id, q.key);
          return;
        }
        for (auto i = st.waiting.begin(); i != st.waiting.end(); ++i)
          if (i->second.req.id == id) {
            // The dispatch core still lists its key; a batch formed with it skips it.
            reply_error(self, i->second,
                        make_error(ec::cancelled, "request " + std::to_string(id) +
                                                      " was cancelled in the queue"));
            st.waiting.erase(i);
            return;
          }
      },
      [=](adopt_atom, model_config& cfg, uint64_t bytes, bool kv) -> caf::result<model_info> {
        return adopt_model(self, cfg, bytes, kv);
      },
      [=](listed_atom, model_info& i) { note_listed(self, std::move(i)); },
      [=](retire_atom, std::string& name, bool retire) -> caf::result<model_info> {
        return retire_model(self, name, retire);
      },
      [=](forget_atom, std::string& name) { return forget_model(self, name); },
      [=](list_atom) -> caf::result<std::vector<model_info>> {
        auto rp = self->make_response_promise<std::vector<model_info>>();
        self->request(self->state.scheduler, 10s, status_atom_v)
            .then(
                [=](std::vector<residency_report>& rs) mutable {
                  std::vector<model_info> out;
                  for (auto& [name, m] : self->state.models) {
                    const residency_report* r = nullptr;
                    for (auto& x : rs)
                      if (x.model == name) r = &x;
                    out.push_back(info_of(self->state.queues(), m, r));
                  }
                  for (auto& [name, i] : self->state.listed) out.push_back(i);
                  std::sort(out.begin(), out.end(),
                            [](auto& a, auto& b) { return a.config.name < b.config.name; });
                  rp.deliver(std::move(out));
                },
                [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](info_atom, std::string& name) -> caf::result<model_info> {
        auto& st = self->state;
        name = registered_name(st, name);
        if (auto l = st.listed.find(name); l != st.listed.end()) return l->second;
        if (st.models.count(name) == 0) return unknown_model_error(name);
        auto rp = self->make_response_promise<model_info>();
        with_info(self, name, rp);
        return rp;
      },
      [=](describe_atom, std::string& name) -> caf::result<model_info> {
        auto& st = self->state;
        name = registered_name(st, name);
        if (auto l = st.listed.find(name); l != st.listed.end()) return l->second;
        auto i = st.models.find(name);
        if (i == st.models.end()) return unknown_model_error(name);
        return info_of(st.queues(), i->second, nullptr);
      },
      [=](load_atom, std::string& name) -> caf::result<model_info> {
        auto& st = self->state;
        name = registered_name(st, name);
        if (auto i = st.models.find(name); i == st.models.end() || i->second.unregistering)
          return not_serving(self, name);
        auto rp = self->make_response_promise<model_info>();
        self->request(st.scheduler, st.opts.acquire_timeout, load_atom_v, name)
            .then(
                [=](residency_report&) mutable {
                  auto& st = self->state;
                  if (auto i = st.models.find(name); i != st.models.end())
                    st.queues().set_resident(i->second.index, true);
                  with_info(self, name, rp);
                },
                [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](unload_atom, std::string& name) -> caf::result<model_info> {
        auto& st = self->state;
        name = registered_name(st, name);
        if (auto i = st.models.find(name); i == st.models.end() || i->second.unregistering)
          return not_serving(self, name);
        auto rp = self->make_response_promise<model_info>();
        self->request(st.scheduler, st.opts.acquire_timeout, unload_atom_v, name)
            .then(
                [=](residency_report&) mutable {
                  auto& st = self->state;
                  st.queues().set_resident(st.models.at(name).index, false);
                  with_info(self, name, rp);
                },
                [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](devices_atom) -> caf::result<std::vector<device_report>> {
        auto rp = self->make_response_promise<std::vector<device_report>>();
        fan_out_all<device_report>(
            self, self->state.workers, caf::timespan{10s},
            [=](std::vector<device_report> rs) mutable {
              // The KV blocks each device holds are the scheduler's to say.
              self->request(self->state.scheduler, 10s, devices_atom_v)
                  .then(
                      [=](std::vector<device_usage>& us) mutable {
                        for (auto& u : us)
                          for (auto& r : rs)
                            if (r.device == u.device) r.kv_bytes = u.kv_bytes;
                        rp.deliver(std::move(rs));
                      },
                      [=](caf::error&) mutable { rp.deliver(std::move(rs)); });
            },
            [=](caf::error e, size_t) mutable { rp.deliver(std::move(e)); }, devices_atom_v);
        return rp;
      },
      [=](report_atom) -> caf::result<caf::settings> { return report(self); },
      [=](tick_atom) {
        expire_adapter_waits(self);
        expire_step_waits(self);
        carry_out(self, self->state.disp->tick(now(self)));
      },
  };
}

/// Replies with the model's info once the scheduler said where it stands.
void with_info(manager_pointer self, const std::string& name,
               caf::typed_response_promise<model_info> rp) {
  self->request(self->state.scheduler, 10s, status_atom_v)
      .then(
          [=](std::vector<residency_report>& rs) mutable {
            auto i = self->state.models.find(name);
            if (i == self->state.models.end()) {
              rp.deliver(make_error(ec::unknown_model, "no model named '" + name + "'"));
              return;
            }
            const residency_report* r = nullptr;
            for (auto& x : rs)
              if (x.model == name) r = &x;
            rp.deliver(info_of(self->state.queues(), i->second, r));
          },
          [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
}

}  // namespace manager_detail

using namespace manager_detail;

caf::expected<model_manager_actor> spawn_model_manager(caf::actor_system& sys,
                                                       std::vector<shard_worker_actor> workers,
                                                       swap_scheduler_actor scheduler,
                                                       engine_registry engines,
                                                       model_manager_options opts) {
  if (workers.empty())
    return make_error(ec::invalid_configuration, "model manager without workers");
  if (!scheduler) return make_error(ec::invalid_configuration, "model manager without a scheduler");
  sched::refusal why;
  auto d = sched::dispatcher::make(opts.batching, workers.size(), &why, opts.gpulets);
  if (!d) return make_error(why.code, why.reason);
  if (!opts.obs) opts.obs = null_observer();
  return sys.spawn(model_manager, std::move(opts), std::move(engines), std::move(workers),
                   std::move(scheduler), std::shared_ptr<sched::dispatcher>(std::move(d)));
}

}  // namespace computron::actors
