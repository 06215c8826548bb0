#pragma once

#include <map>
#include <set>
#include <string>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/node.hpp"
#include "engine/runner.hpp"

/// Deterministic actor tests under Catch2 (CAF_0.17.md §7): CAF's test coordinator runs
/// every actor on the test thread; time moves only when the test advances it.
namespace computron::testing {

struct deterministic_config : actors::system_config {
  deterministic_config() {
    set("scheduler.policy", caf::atom("testing"));
    set("logger.inline-output", true);
  }
};

struct deterministic_fixture {
  deterministic_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  caf::scoped_actor self{sys, true};

  ~deterministic_fixture() {
    // Pending request timeouts keep actors alive: drain them too, or ~actor_system hangs.
    while (sched.run() + sched.trigger_timeouts() > 0) {
    }
  }

  /// Sends a request, runs the system until it is idle, and returns the reply; an error
  /// (not a hang) when no reply came.
  template <class T, class Handle, class... Ts>
  caf::expected<T> ask(const Handle& h, const Ts&... xs) {
    auto rh = self->request(h, caf::timespan{std::chrono::hours(24)}, xs...);
    sched.run();
    if (self->mailbox().empty()) return caf::make_error(caf::sec::request_timeout, "no reply yet");
    caf::expected<T> out{caf::make_error(caf::sec::unexpected_response)};
    std::move(rh).receive([&](T& x) { out = std::move(x); },
                          [&](caf::error& e) { out = std::move(e); });
    return out;
  }
};

/// A shard worker that only pretends: loads and evictions succeed at once unless the
/// script says a model fails or hangs. Counts what it was asked.
struct fake_worker_script {
  std::map<std::string, int> loads;
  std::map<std::string, int> evictions;
  std::set<std::string> failing;
  std::set<std::string> hanging;
  /// Loads started (begin_load, once per shard) and models whose start fails.
  std::map<std::string, int> begins;
  std::set<std::string> failing_begin;
  /// What a failing begin answers: no room (the scheduler retries), or another code.
  ec failing_begin_error = ec::out_of_device_memory;
  /// Models whose prepare fails (a registration that fails on a worker), and the
  /// prepares asked of the workers.
  std::set<std::string> failing_prepare;
  std::map<std::string, int> prepares;
  std::map<std::string, int> unregistered;
  /// Models whose eviction fails.
  std::set<std::string> failing_evict{};
  /// Steps (counted from 1, as step_rows counts them) that find the device full: they
  /// fail with out_of_device_memory, as a KV pool that cannot grow does.
  std::set<size_t> room_short_steps{};
  /// Rows of each step the worker ran, and its keep list (which rows of the batch's
  /// previous step go on, as a worker's runner derives it from the plan's row keys).
  std::vector<size_t> step_rows;
  std::vector<std::vector<int32_t>> keeps;
  /// Per device and model (a shard), the rows each batch holds and their KV block tables,
  /// as a shard's runner tracks them.
  std::map<std::pair<int32_t, std::string>, engine::batch_rows> rows;
  /// Per step, how many rows' sampling settings it carried (the prefill only).
  std::vector<size_t> sampling_rows;
  /// Per batch, its rows' settings as the prefill gave them, kept as a worker keeps them.
  std::map<uint64_t, std::vector<actors::row_sampling>> batch_sampling;
  /// Per step, the batch its rows joined (its plan's `into`; 0: none).
  std::vector<uint64_t> joins;
  /// Per step, its rows' LoRA adapters (engine::step_input::adapters).
  std::vector<std::vector<std::string>> adapters;
  /// Cancels (a batch's caches dropped) wait in the holder, as hanging loads do.
  bool hold_cancels = false;
  /// Holds hanging loads and cancels until it receives ok_atom (promises are delivered by
  /// their owner only, so the test releases them through this actor).
  caf::actor holder;
};

inline caf::behavior load_holder(caf::event_based_actor* self) {
  auto held = std::make_shared<std::vector<caf::response_promise>>();
  auto cancels = std::make_shared<std::vector<caf::response_promise>>();
  return {
      [=](actors::load_atom, std::string&) {
        held->push_back(self->make_response_promise());
        return held->back();
      },
      [=](actors::cancel_atom, std::string&, uint64_t) {
        cancels->push_back(self->make_response_promise());
        return cancels->back();
      },
      [=](caf::ok_atom) {
        for (auto& rp : *held) rp.deliver(actors::transfer_report{});
        held->clear();
        for (auto& rp : *cancels) rp.deliver(uint64_t{0});
        cancels->clear();
      },
  };
}

/// Receives a request's streamed tokens (and the row each names); after `cancel_after`
/// of them it cancels the request at the manager that streams them.
inline caf::behavior stream_listener(caf::event_based_actor* self, std::vector<int64_t>* seen,
                                     size_t cancel_after, std::vector<uint32_t>* rows) {
  using namespace actors;
  return {
      [=](token_atom, uint64_t id, uint32_t row, int64_t token, const token_logprobs&) {
        if (rows) rows->push_back(row);
        seen->push_back(token);
        if (seen->size() == cancel_after)
          self->send(caf::actor_cast<model_manager_actor>(self->current_sender()), cancel_atom_v,
                     id, false);
      },
  };
}

/// Streams a request for 50 tokens after the prompt {1, 2, 3} (as row `stream_row`) to a
/// stream_listener that cancels it on its second token, and runs the system until it is
/// answered: the answer (an error where none came), the tokens streamed and their rows.
inline caf::expected<actors::infer_reply> cancelled_on_second_token(
    deterministic_fixture& f, const actors::model_manager_actor& manager, uint64_t id,
    uint32_t stream_row, std::vector<int64_t>* seen, std::vector<uint32_t>* rows) {
  using namespace actors;
  auto listener = f.sys.spawn(stream_listener, seen, size_t{2}, rows);
  infer_request r;
  r.model = "m";
  r.tokens = {1, 2, 3};
  r.max_tokens = 50;
  r.stream = caf::actor_cast<token_sink_actor>(listener);
  r.stream_row = stream_row;
  r.id = id;
  auto h = f.self->request(manager, caf::timespan{std::chrono::hours(24)}, infer_atom_v, r);
  f.sched.run();
  f.sched.advance_time(std::chrono::milliseconds(6));
  f.sched.run();
  caf::expected<infer_reply> out{caf::make_error(caf::sec::request_timeout, "no reply yet")};
  if (!f.self->mailbox().empty())
    std::move(h).receive([&](infer_reply& rep) { out = std::move(rep); },
                         [&](caf::error& e) { out = std::move(e); });
  caf::anon_send_exit(listener, caf::exit_reason::user_shutdown);
  return out;
}

inline actors::shard_worker_actor::behavior_type fake_worker(
    actors::shard_worker_actor::pointer self, fake_worker_script* script, int32_t device) {
  using namespace actors;
  return {
      [=](prepare_atom, shard_spec& s) -> caf::result<shard_report> {
        ++script->prepares[s.model.name];
        if (script->failing_prepare.count(s.model.name) > 0)
          return make_error(ec::io_error, "injected: cannot read the weights of " + s.model.name);
        return shard_report{s.model.name, device, 0, false};
      },
      [=](load_atom, std::string& m) -> caf::result<transfer_report> {
        ++script->loads[m];
        if (script->failing.count(m) > 0)
          return make_error(ec::device_error, "injected failure on " + m);
        if (script->hanging.count(m) > 0) {
          auto rp = self->make_response_promise<transfer_report>();
          self->request(script->holder, caf::timespan{std::chrono::hours(24)}, load_atom_v, m)
              .then([=](transfer_report& r) mutable { rp.deliver(std::move(r)); },
                    [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
          return rp;
        }
        return transfer_report{m, device, 0, 0};
      },
      [=](begin_load_atom, std::string& m) -> caf::result<transfer_report> {
        ++script->begins[m];
        if (script->failing_begin.count(m) > 0)
          return make_error(script->failing_begin_error, "injected: no room for " + m);
        return transfer_report{m, device, 0, 0};
      },
      [=](evict_atom, std::string& m) -> caf::result<transfer_report> {
        if (script->failing_evict.count(m) > 0)
          return make_error(ec::device_error, "injected eviction failure on " + m);
        ++script->evictions[m];
        return transfer_report{m, device, 0, 0};
      },
      [=](unregister_atom, std::string& m) {
        ++script->unregistered[m];
        return true;
      },
      [=](step_atom, step_request& req) -> caf::result<step_result> {
        // Prefill samples 7 for every row; each decode step samples the row's last
        // token plus one. The steps' row counts and keep lists are recorded.
        auto& r = req.input;
        const auto batch = r.plan.batch;
        script->step_rows.push_back(r.prefills() ? r.prompts.size() : r.tokens.size());
        if (script->room_short_steps.count(script->step_rows.size()) > 0)
          return make_error(
              ec::out_of_device_memory,
              "injected: no room for 1 more KV blocks on device " + std::to_string(device));
        auto& shard_rows = script->rows[{device, req.model}];
        auto keep = shard_rows.step(r.plan);
        if (!keep) return keep.error();
        script->keeps.push_back(*keep);
        script->sampling_rows.push_back(r.sampling.size());
        auto& kept = script->batch_sampling[batch];
        if (r.prefills()) {
          kept = r.sampling;
        } else if (!keep->empty()) {
          std::vector<row_sampling> still;
          for (auto k : *keep) still.push_back(kept.at(static_cast<size_t>(k)));
          kept = std::move(still);
        }
        script->joins.push_back(r.plan.into);
        script->adapters.push_back(r.adapters);
        std::vector<int64_t> next;
        if (r.prefills())
          next.assign(r.prompts.size(), 7);
        else
          for (auto t : r.tokens) next.push_back(t + 1);
        // Rows that ask for log-probabilities get -token/100 with the token as the top one.
        std::vector<token_logprobs> lps;
        for (size_t i = 0; i < kept.size() && i < next.size(); ++i)
          if (kept[i].logprobs >= 0) {
            lps.resize(next.size());
            auto lp = static_cast<float>(-static_cast<double>(next[i]) / 100);
            lps[i] = token_logprobs{lp, {next[i]}, {lp}};
          }
        // A prefill's rows that ask for their prompts' log-probabilities get -token/100 for
        // every prompt token from the second on.
        std::vector<std::vector<token_logprobs>> prompt_lps;
        if (r.prefills())
          for (size_t i = 0; i < kept.size() && i < r.prompts.size(); ++i)
            if (kept[i].prompt_logprobs >= 0) {
              prompt_lps.resize(r.prompts.size());
              for (size_t t = 1; t < r.prompts[i].size(); ++t) {
                auto tok = r.prompts[i][t];
                auto lp = static_cast<float>(-static_cast<double>(tok) / 100);
                prompt_lps[i].push_back(token_logprobs{lp, {tok}, {lp}});
              }
            }
        if (r.plan.into != 0 && !r.partial_prefill()) {
          // The joined rows' settings go after the running batch's, as a worker's samplers.
          auto& into = script->batch_sampling[r.plan.into];
          into.insert(into.end(), kept.begin(), kept.end());
          script->batch_sampling.erase(batch);
          if (auto err = shard_rows.join(batch, r.plan.into)) return err;
        }
        if (r.last) shard_rows.end(batch);
        return step_result{next, 0, lps, std::move(prompt_lps)};
      },
      [=](cancel_atom, std::string& m, uint64_t batch) -> caf::result<uint64_t> {
        script->rows[{device, m}].end(batch);
        if (!script->hold_cancels) return uint64_t{0};  // these workers hold no KV pages
        auto rp = self->make_response_promise<uint64_t>();
        self->request(script->holder, caf::timespan{std::chrono::hours(24)}, cancel_atom_v, m,
                      batch)
            .then([=](uint64_t bytes) mutable { rp.deliver(bytes); },
                  [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](actors::tick_atom) {},
      [=](devices_atom) { return device_report{}; },
      [=](group_atom, std::string&, int32_t) -> caf::result<std::string> {
        return make_error(ec::invalid_configuration, "fake workers host no groups");
      },
      [=](report_atom) { return caf::settings{}; },
  };
}

}  // namespace computron::testing
