#include "actors/node.hpp"

#include <atomic>

#include <caf/all.hpp>

#include "actors/join.hpp"
#include "common/error.hpp"

namespace computron::actors {

namespace {

using namespace std::chrono_literals;

struct node_state {
  static constexpr const char* name = "node";
  std::vector<shard_worker_actor> workers;
};

node_actor::behavior_type node(node_actor::stateful_pointer<node_state> self,
                               std::vector<shard_worker_actor> workers) {
  self->state.workers = std::move(workers);
  return {
      [=](devices_atom) -> caf::result<std::vector<device_report>> {
        auto rp = self->make_response_promise<std::vector<device_report>>();
        fan_out_all<device_report>(
            self, self->state.workers, caf::timespan{10s},
            [=](std::vector<device_report> rs) mutable { rp.deliver(std::move(rs)); },
            [=](caf::error e, size_t) mutable { rp.deliver(std::move(e)); }, devices_atom_v);
        return rp;
      },
      [=](report_atom) -> caf::result<caf::settings> {
        auto rp = self->make_response_promise<caf::settings>();
        fan_out_all<caf::settings>(
            self, self->state.workers, caf::timespan{5s},
            [=](std::vector<caf::settings> rs) mutable {
              caf::settings out;
              caf::config_value::list ds;
              for (auto& r : rs) ds.emplace_back(std::move(r));
              out["devices"] = caf::config_value{std::move(ds)};
              out["mailbox"] = caf::config_value{static_cast<int64_t>(self->mailbox().size())};
              rp.deliver(std::move(out));
            },
            [=](caf::error e, size_t) mutable { rp.deliver(std::move(e)); }, report_atom_v);
        return rp;
      },
      [=](workers_atom) { return self->state.workers; },
  };
}

}  // namespace

system_config::system_config(idle_polling polling) {
  add_message_types<caf::id_block::computron_atoms>();
  add_message_types<caf::id_block::computron_messages>();
  add_message_types<caf::id_block::computron_handles>();
  register_errors(*this);
  if (polling == idle_polling::prompt) {
    // No sleeping polls: straight from the quick ones to the condition variable, which
    // every enqueue from outside the scheduler notifies. Work enqueued by a busy thread
    // for itself is stolen by an idle one within the relaxed timeout.
    set("work-stealing.moderate-poll-attempts", size_t{0});
    set("work-stealing.relaxed-sleep-duration", caf::timespan{1ms});
  }
}

caf::expected<node_handle> spawn_node(caf::actor_system& sys,
                                      const std::vector<gpu::device_ptr>& devices,
                                      engine_registry engines, shard_worker_options worker_opts,
                                      int32_t first_index) {
  if (devices.empty())
    return make_error(ec::invalid_configuration, "a node needs at least one device");
  static std::atomic<uint64_t> node_counter{0};
  worker_opts.group_scope = "node" + std::to_string(node_counter++);
  node_handle h;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto o = worker_opts;
    o.device_index = first_index + static_cast<int32_t>(i);
    auto w = spawn_shard_worker(sys, devices[i], engines, o);
    if (!w) {
      for (auto& spawned : h.workers) caf::anon_send_exit(spawned, caf::exit_reason::user_shutdown);
      return w.error();
    }
    h.workers.push_back(*w);
  }
  h.node = sys.spawn(node, h.workers);
  return h;
}

void runtime::shutdown() {
  auto bye = [](const auto& h) {
    if (h) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  };
  bye(frontend);
  bye(registry);
  bye(manager);
  bye(scheduler);
  bye(node.node);
  for (auto& w : node.workers) bye(w);
}

namespace {

/// Scheduler, manager, registry and frontend over `rt.node.workers`, accounted by `sds`.
caf::expected<runtime> spawn_stack(caf::actor_system& sys, runtime rt, runtime_options opts,
                                   engine_registry engines, std::vector<scheduler_device> sds) {
  opts.scheduler.obs = opts.obs;
  opts.manager.obs = opts.obs;
  opts.frontend.obs = opts.obs;
  // Admission has one owner: the manager's batching options; the frontend only bounds
  // what is in flight and waits for the same deadline (plus slack).
  // The frontend waits for an answer as long past its deadline as the manager serves it,
  // and a second more, so that the manager's answer (with its reason) comes first.
  opts.frontend.reply_slack =
      std::chrono::duration_cast<std::chrono::milliseconds>(opts.manager.batching.late_grace) +
      std::chrono::seconds(1);
  opts.frontend.default_deadline =
      std::chrono::duration_cast<std::chrono::milliseconds>(opts.manager.batching.default_deadline);
  opts.registry.device_kinds.clear();
  for (auto& d : sds) opts.registry.device_kinds.push_back(d.kind);
  auto fail = [&](caf::error e) {
    rt.shutdown();
    return e;
  };
  auto s = spawn_swap_scheduler(sys, std::move(sds), opts.scheduler);
  if (!s) return fail(s.error());
  rt.scheduler = *s;
  auto m = spawn_model_manager(sys, rt.node.workers, rt.scheduler, engines, opts.manager);
  if (!m) return fail(m.error());
  rt.manager = *m;
  auto r = spawn_registry(sys, rt.node.workers, rt.scheduler, rt.manager, std::move(engines),
                          std::move(opts.registry));
  if (!r) return fail(r.error());
  rt.registry = *r;
  auto f = spawn_frontend(sys, caf::actor_cast<serving_actor>(rt.manager), opts.frontend);
  if (!f) return fail(f.error());
  rt.frontend = *f;
  return rt;
}

}  // namespace

caf::error prepare_gpulets(const std::vector<gpu::device_ptr>& devices,
                           const sched::gpulet_config& g) {
  if (!g.enabled()) return {};
  auto smallest = sched::allowed_shares(g.plan);
  for (size_t d = 0; d < devices.size(); ++d) {
    auto& dev = *devices[d];
    if (dev.info().kind != gpu::device_kind::cuda) continue;
    auto where = "devices.gpulets on device " + std::to_string(d) + " (" + dev.info().name + ")";
    if (auto err = dev.check_gpulets()) return with_context(std::move(err), where);
    std::vector<int32_t> partition;
    if (d < g.partitions.size())
      partition = g.partitions[d];
    else if (g.automatic && !smallest.empty())
      partition = {smallest.front()};
    for (size_t lane = 0; lane < partition.size(); ++lane)
      if (partition[lane] < 100)
        if (auto s = dev.gpulet_stream(partition, lane); !s)
          return with_context(std::move(s.error()), where);
  }
  return {};
}

caf::expected<runtime> start_runtime(caf::actor_system& sys, runtime_options opts,
                                     engine_registry engines) {
  runtime rt;
  auto devs = gpu::open_devices(opts.devices);
  if (!devs) return devs.error();
  rt.devices = std::move(*devs);
  if (auto err = prepare_gpulets(rt.devices, opts.manager.gpulets)) return err;
  auto n = spawn_node(sys, rt.devices, engines, opts.worker);
  if (!n) return n.error();
  rt.node = std::move(*n);
  std::vector<scheduler_device> sds;
  for (size_t i = 0; i < rt.devices.size(); ++i)
    sds.push_back({rt.node.workers[i], rt.devices[i]->capacity_bytes(),
                   rt.devices[i]->info().link_gbps, rt.devices[i]->info().kind,
                   rt.devices[i]->page_bytes()});
  return spawn_stack(sys, std::move(rt), std::move(opts), std::move(engines), std::move(sds));
}

caf::expected<runtime> start_runtime_over(caf::actor_system& sys, runtime_options opts,
                                          engine_registry engines,
                                          std::vector<scheduler_device> devices) {
  if (devices.empty()) return make_error(ec::invalid_configuration, "a runtime without devices");
  runtime rt;
  for (auto& d : devices) rt.node.workers.push_back(d.worker);
  return spawn_stack(sys, std::move(rt), std::move(opts), std::move(engines), std::move(devices));
}

}  // namespace computron::actors
