#include "actors/shard_worker.hpp"
#include "actors/shard_worker_state.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <caf/all.hpp>

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::actors {

namespace {

using namespace worker_detail;

/// The device's largest free block, for the scheduler's planning.
uint64_t mapped(const shard_worker_state& st) {
  return st.dev->used_bytes();
}

int64_t largest_free(const shard_worker_state& st) {
  return static_cast<int64_t>(st.dev->largest_free_block());
}

/// Waits (on the copy lane) until no step computes on the shard, and keeps the next ones
/// out while `lock` is held; bounded, so a wedged step fails the eviction, not the lane.
caf::error quiesce(std::unique_lock<std::shared_timed_mutex>& lock,
                   std::chrono::milliseconds within, const std::string& model, int32_t device) {
  if (lock.try_lock_for(within)) return {};
  return make_error(ec::unavailable,
                    fmt::format("a step of {} still computes on device {} after {} ms: its "
                                "pages stay mapped",
                                model, device, within.count()));
}

shard_worker_actor::behavior_type shard_worker(worker_pointer self, gpu::device_ptr dev,
                                               engine_registry engines, shard_worker_options opts) {
  auto& st = self->state;
  st.dev = std::move(dev);
  st.engines = std::move(engines);
  st.opts = std::move(opts);
  // Two lanes: a load never waits behind a forward pass, nor a forward behind a load.
  st.copy_lane = self->template spawn<caf::detached + caf::linked>(lane_behavior);
  st.compute_lanes.push_back(self->template spawn<caf::detached + caf::linked>(lane_behavior));
  st.gpulets = std::make_shared<gpulet_clock>();
  st.emulate_gpulets = st.dev->info().kind == gpu::device_kind::emulated;
  const int32_t index = st.opts.device_index;
  auto missing = [=](const std::string& model) {
    return make_error(ec::unknown_model,
                      "device " + std::to_string(index) + " holds no shard of model " + model);
  };
  return {
      [=](prepare_atom, shard_spec& s) -> caf::result<shard_report> {
        auto& st = self->state;
        const auto name = s.model.name;
        if (auto i = st.shards.find(name); i != st.shards.end()) {
          if (!same_shard(i->second.spec, s))
            return make_error(ec::invalid_state, "device " + std::to_string(index) +
                                                     " already holds a different shard of model " +
                                                     name);
          if (s.group_address != i->second.spec.group_address && !s.group_address.empty())
            return rejoin(self, name, s);
          return shard_report{name, index, st.dev->pages_of(i->second.weights->size_bytes()),
                              i->second.weights->host_pinned()};
        }
        if (st.preparing.count(name) > 0)
          return make_error(ec::invalid_state, "model " + name + " is being prepared on device " +
                                                   std::to_string(index));
        auto e = st.engines.find(s.model.kind);
        if (e == st.engines.end())
          return make_error(ec::invalid_configuration, "no engine for kind " + s.model.kind);
        st.preparing.insert(name);
        auto entry = std::make_shared<shard_entry>();
        entry->spec = s;
        auto eng = e->second;
        auto device = st.dev;
        // Ranks on several nodes meet at the address in the spec; the name must then be
        // the same in every process, so it is not scoped by node.
        const bool remote_group = !s.group_address.empty();
        if (remote_group && !st.opts.groups) {
          st.preparing.erase(name);
          return make_error(ec::invalid_configuration,
                            "model " + name + " has tensor-parallel ranks on several nodes, and " +
                                "this process cannot join such groups (no Gloo)");
        }
        auto group = group_name(remote_group ? std::string{"cluster"} : st.opts.group_scope, s);
        auto groups = st.opts.groups;
        auto bind_host = st.opts.host;
        auto peer_timeout = st.opts.step_timeout;
        lane_job job{[=]() -> caf::error {
          auto table = eng->layout(s);
          if (!table) return table.error();
          auto w = gpu::weight_shard::create(device, std::move(*table));
          if (!w) return w.error();
          entry->weights = std::shared_ptr<gpu::weight_shard>(std::move(*w));
          if (auto err = eng->fill(s, *entry->weights)) return err;
          // A LoRA adapter is bytes for its base's forward: no group, no runner of its own.
          if (!s.model.base.empty()) return {};
          auto g = remote_group ? groups->join(s.group_address, group, s.tp_rank, s.model.tp,
                                               bind_host, peer_timeout)
                                : gpu::join_local_group(group, s.tp_rank, s.model.tp, peer_timeout);
          if (!g) return g.error();
          entry->group = std::shared_ptr<gpu::collective>(std::move(*g));
          auto b = eng->make_backend(s, *entry->weights, *entry->group);
          if (!b) return b.error();
          entry->runner = runner_of(s, std::move(*b));
          return {};
        }};
        auto rp = self->make_response_promise<shard_report>();
        self->request(self->state.copy_lane, caf::timespan{std::chrono::hours(1)}, run_atom_v,
                      std::move(job))
            .then(
                [=](bool) mutable {
                  auto report = shard_report{
                      name, index, self->state.dev->pages_of(entry->weights->size_bytes()),
                      entry->weights->host_pinned()};
                  auto finish = [=]() mutable {
                    self->state.preparing.erase(name);
                    self->state.shards[name] = std::move(*entry);
                    rp.deliver(report);
                  };
                  auto runner = entry->runner;
                  warm_on_compute_lane(
                      self, name,
                      [=]() -> caf::error {
                        auto warmed = eng->warm_up(s, device);
                        auto prepared = runner ? runner->compute().prepare() : caf::error{};
                        return warmed ? std::move(warmed) : std::move(prepared);
                      },
                      finish);
                },
                [=](caf::error& err) mutable {
                  self->state.preparing.erase(name);
                  rp.deliver(std::move(err));
                });
        return rp;
      },
      [=](begin_load_atom, std::string& model) -> caf::result<transfer_report> {
        auto& st = self->state;
        auto i = st.shards.find(model);
        if (i == st.shards.end()) return missing(model);
        auto w = i->second.weights;
        if (w->state() == gpu::residency::resident)
          return transfer_report{model, index, w->size_bytes(), 0, largest_free(st), mapped(st)};
        i->second.begun = true;
        auto began = i->second.load_began;
        auto chunk = st.opts.chunk_bytes;
        // load() allocates and queues the chunks, then returns: quick, but it may wait for
        // the device, so it runs on the copy lane, behind any eviction still in flight.
        lane_job job{[=]() -> caf::error {
          if (w->state() != gpu::residency::offloaded) return {};
          *began = std::chrono::steady_clock::now();
          return w->load({chunk});
        }};
        auto rp = self->make_response_promise<transfer_report>();
        self->request(st.copy_lane, st.opts.load_timeout + 5s, run_atom_v, std::move(job))
            .then(
                [=](bool) mutable {
                  rp.deliver(transfer_report{model, index, w->size_bytes(), 0,
                                             largest_free(self->state), mapped(self->state)});
                },
                [=](caf::error& err) mutable {
                  log::warn("device {}: load of {} failed to start: {}", index, model, render(err));
                  rp.deliver(std::move(err));
                });
        return rp;
      },
      [=](load_atom, std::string& model) -> caf::result<transfer_report> {
        auto& st = self->state;
        auto i = st.shards.find(model);
        if (i == st.shards.end()) return missing(model);
        auto w = i->second.weights;
        // After a begin_load the load may have finished already; it is still reported.
        const bool begun = std::exchange(i->second.begun, false);
        if (!begun && w->state() == gpu::residency::resident && i->second.evicting == 0)
          return transfer_report{model, index, w->size_bytes(), 0};
        auto seconds = std::make_shared<double>(0);
        auto began = i->second.load_began;
        auto chunk = st.opts.chunk_bytes;
        auto timeout = st.opts.load_timeout;
        lane_job job{[=]() -> caf::error {
          if (w->state() == gpu::residency::offloaded) {
            *began = std::chrono::steady_clock::now();
            if (auto err = w->load({chunk})) return err;
          }
          if (auto err = w->wait_loaded(timeout)) return err;
          *seconds = seconds_since(*began);
          return {};
        }};
        auto rp = self->make_response_promise<transfer_report>();
        self->request(st.copy_lane, timeout + 5s, run_atom_v, std::move(job))
            .then(
                [=](bool) mutable {
                  auto& st = self->state;
                  ++st.loads;
                  st.bytes_loaded += w->size_bytes();
                  st.load_seconds += *seconds;
                  rp.deliver(transfer_report{model, index, w->size_bytes(), *seconds,
                                             largest_free(st), mapped(st)});
                },
                [=](caf::error& err) mutable {
                  log::warn("device {}: load of {} failed: {}", index, model, render(err));
                  rp.deliver(std::move(err));
                });
        return rp;
      },
      [=](evict_atom, std::string& model) -> caf::result<transfer_report> {
        auto& st = self->state;
        auto i = st.shards.find(model);
        if (i == st.shards.end()) return missing(model);
        auto w = i->second.weights;
        auto busy = i->second.in_use;
        auto seconds = std::make_shared<double>(0);
        // A step on a loading shard may wait for its bytes as well as compute.
        auto within = st.opts.step_timeout + st.opts.load_timeout;
        // Behind any load in flight on the copy lane, so a load is never freed mid-copy,
        // and after any step still computing on the shard.
        lane_job job{[=]() -> caf::error {
          auto t0 = std::chrono::steady_clock::now();
          if (w->state() == gpu::residency::offloaded) return {};
          std::unique_lock<std::shared_timed_mutex> quiet{*busy, std::defer_lock};
          if (auto err = quiesce(quiet, within, model, index)) return err;
          if (auto err = w->evict()) return err;
          *seconds = seconds_since(t0);
          return {};
        }};
        auto rp = self->make_response_promise<transfer_report>();
        ++i->second.evicting;
        auto done = [=] {
          if (auto j = self->state.shards.find(model); j != self->state.shards.end())
            --j->second.evicting;
        };
        self->request(st.copy_lane, st.opts.load_timeout + 5s, run_atom_v, std::move(job))
            .then(
                [=](bool) mutable {
                  done();
                  rp.deliver(transfer_report{model, index, w->size_bytes(), *seconds,
                                             largest_free(self->state), mapped(self->state)});
                },
                [=](caf::error& err) mutable {
                  done();
                  rp.deliver(std::move(err));
                });
        return rp;
      },
      [=](unregister_atom, std::string& model) -> caf::result<bool> {
        auto& st = self->state;
        if (st.preparing.count(model) > 0)
          return make_error(ec::invalid_state, "model " + model + " is being prepared on device " +
                                                   std::to_string(index));
        auto i = st.shards.find(model);
        if (i == st.shards.end()) return false;
        auto entry = std::make_shared<shard_entry>(std::move(i->second));
        st.shards.erase(i);
        // An adapter: its base's backend lets go of it, on the lane that runs the base.
        if (auto b = st.shards.find(entry->spec.model.base);
            !entry->spec.model.base.empty() && b != st.shards.end() && b->second.runner)
          if (auto lane = compute_lane(self, b->second.lane)) {
            auto runner = b->second.runner;
            lane_job unbind{[=]() -> caf::error {
              runner->unbind_adapter(model);
              return {};
            }};
            self->request(*lane, st.opts.step_timeout, run_atom_v, std::move(unbind))
                .then([](bool) {}, [](caf::error&) {});
          }
        // Behind any copy in flight, on the copy lane: the device copy goes, then the
        // runner and the host copy with their last references (freeing pinned memory
        // can block, so not on a scheduler thread).
        auto within = st.opts.step_timeout + st.opts.load_timeout;
        lane_job job{[=]() -> caf::error {
          if (entry->weights && entry->weights->state() != gpu::residency::offloaded) {
            std::unique_lock<std::shared_timed_mutex> quiet{*entry->in_use, std::defer_lock};
            if (auto err = quiesce(quiet, within, model, index)) return err;
            if (auto err = entry->weights->evict()) return err;
          }
          entry->runner.reset();
          entry->group.reset();
          entry->weights.reset();
          return {};
        }};
        auto rp = self->make_response_promise<bool>();
        self->request(st.copy_lane, st.opts.load_timeout + 5s, run_atom_v, std::move(job))
            .then(
                [=](bool) mutable {
                  log::info("device {}: forgot {} (host copy freed)", index, model);
                  rp.deliver(true);
                },
                [=](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [=](step_atom, step_request& req) -> caf::result<step_result> { return run_step(self, req); },
      [=](cancel_atom, std::string& model, uint64_t batch_id) -> caf::result<uint64_t> {
        auto& st = self->state;
        auto i = st.shards.find(model);
        if (i == st.shards.end() || !i->second.runner) return uint64_t{0};
        auto runner = i->second.runner;
        auto bytes = std::make_shared<uint64_t>(0);
        lane_job job{[=]() -> caf::error {
          runner->end_batch(batch_id);
          *bytes = runner->kv_device_bytes();
          return {};
        }};
        auto lane = compute_lane(self, i->second.lane);
        if (!lane) return std::move(lane.error());
        auto rp = self->make_response_promise<uint64_t>();
        self->request(*lane, st.opts.step_timeout, run_atom_v, std::move(job))
            .then([=](bool) mutable { rp.deliver(*bytes); },
                  [=](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [=](tick_atom) {
        if (auto in = self->state.lane_waits.tick(self->clock().now()))
          self->delayed_send(self, *in, tick_atom_v);
      },
      [=](devices_atom) -> device_report {
        auto& st = self->state;
        auto& info = st.dev->info();
        device_report r;
        r.device = index;
        r.name = info.name;
        r.kind = gpu::to_string(info.kind);
        r.capacity_bytes = info.capacity_bytes;
        r.used_bytes = st.dev->used_bytes();
        r.link_gbps = info.link_gbps;
        for (auto& [name, e] : st.shards) {
          r.shards.push_back(name);
          if (e.weights->state() == gpu::residency::resident) r.resident.push_back(name);
        }
        r.loads = st.loads;
        r.bytes_loaded = st.bytes_loaded;
        r.load_seconds = st.load_seconds;
        r.node = st.opts.node;
        return r;
      },
      [=](group_atom, std::string& group, int32_t size) -> caf::result<std::string> {
        auto& st = self->state;
        if (!st.opts.groups)
          return make_error(ec::invalid_configuration,
                            "device " + std::to_string(index) +
                                " cannot host a cross-node group (no Gloo in this process)");
        if (size < 2 || size > 1024)
          return make_error(ec::invalid_request,
                            "group " + group + " of " + std::to_string(size) + " ranks");
        // Binding a listening socket is quick: no lane needed.
        auto addr = st.opts.groups->host(st.opts.host, size, st.opts.step_timeout);
        if (!addr) return addr.error();
        log::info("device {}: hosting the rendezvous of {} at {}", index, group, *addr);
        return *addr;
      },
      [=](report_atom) -> caf::settings {
        auto& st = self->state;
        caf::settings out;
        auto& info = st.dev->info();
        out["device"] = caf::config_value{static_cast<int64_t>(index)};
        out["name"] = caf::config_value{info.name};
        out["node"] = caf::config_value{st.opts.node};
        out["capacity-bytes"] = caf::config_value{static_cast<int64_t>(info.capacity_bytes)};
        out["used-bytes"] = caf::config_value{static_cast<int64_t>(st.dev->used_bytes())};
        out["link-gbps"] = caf::config_value{info.link_gbps};
        caf::config_value::list held, resident;
        for (auto& [name, e] : st.shards) {
          held.emplace_back(name);
          if (e.weights->state() == gpu::residency::resident) resident.emplace_back(name);
        }
        out["shards"] = caf::config_value{std::move(held)};
        out["resident"] = caf::config_value{std::move(resident)};
        out["loads"] = caf::config_value{static_cast<int64_t>(st.loads)};
        out["load-gbps"] =
            caf::config_value{st.load_seconds > 0 ? st.bytes_loaded / st.load_seconds / 1e9 : 0.0};
        out["mailbox"] = caf::config_value{static_cast<int64_t>(self->mailbox().size())};
        return out;
      },
  };
}

}  // namespace

caf::expected<shard_worker_actor> spawn_shard_worker(caf::actor_system& sys, gpu::device_ptr dev,
                                                     engine_registry engines,
                                                     shard_worker_options opts) {
  if (!dev) return make_error(ec::invalid_configuration, "shard worker without a device");
  if (engines.empty()) return make_error(ec::invalid_configuration, "shard worker without engines");
  if (opts.chunk_bytes == 0) return make_error(ec::invalid_configuration, "chunk size 0");
  return sys.spawn(shard_worker, std::move(dev), std::move(engines), std::move(opts));
}

}  // namespace computron::actors
