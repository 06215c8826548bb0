// The registry actor: model control over the registered models and a repository's
// folders (Triton's explicit mode), node loss and return, and its spawn function.
// Registering and unregistering themselves are in registration.cpp.
#include <algorithm>
#include <map>

#include <caf/all.hpp>

#include "actors/registry_state.hpp"
#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::actors::registry_detail {

/// A scan's folders, as its reader hands them to the registry (in this process only).
struct scanned_folders {
  std::vector<repository_folder> folders;
};

}  // namespace computron::actors::registry_detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(computron::actors::registry_detail::scanned_folders)

namespace computron::actors {

namespace registry_detail {

namespace {

/// One unreadable folder: what a scan that fails reports (`only`, or "?" for all).
std::vector<repository_folder> unreadable(const std::string& only, const std::string& why) {
  repository_folder f;
  f.name = only.empty() ? "?" : only;
  f.error = make_error(ec::io_error, "cannot read the repository: " + why);
  return {f};
}

/// Reads the repository once, on a thread of its own (the reads block), and quits.
caf::behavior folder_reader(caf::event_based_actor* self, repository_scan read, std::string only) {
  return {[=](caf::get_atom) {
    self->quit();
    try {
      return scanned_folders{read(only)};
    } catch (const std::exception& e) {
      return scanned_folders{unreadable(only, e.what())};
    }
  }};
}

/// Folders from the scan (all, or `only`), handed to `then` on the registry's thread when
/// the read is done. The read runs on a detached reader, not here: a slow file system
/// does not keep the registry from hearing a node's loss (lost_atom) meanwhile.
void scan(registry_pointer self, const std::string& only,
          std::function<void(std::vector<repository_folder>)> then) {
  auto& st = self->state;
  if (!st.opts.scan) return then({});
  auto reader = self->template spawn<caf::detached>(folder_reader, st.opts.scan, only);
  self->request(reader, st.opts.timeout, caf::get_atom_v)
      .then([=](scanned_folders& s) { then(std::move(s.folders)); },
            [=](caf::error& e) { then(unreadable(only, render(e))); });
}

/// A folder that is not registered, as the index lists it. One that cannot be read must be
/// fixed by an operator; requests get 503 with the reason.
model_info folder_info(const repository_folder& f) {
  auto cfg = f.config;
  cfg.name = f.name;
  if (!f.error) return listed_info(std::move(cfg), model_lifecycle::unloaded);
  return listed_info(std::move(cfg), model_lifecycle::failed, render(f.error),
                     static_cast<uint8_t>(ec::unavailable));
}

/// Registers `cfg`, then makes it resident.
void register_and_load(registry_pointer self, model_config cfg,
                       caf::typed_response_promise<model_info> rp) {
  auto name = cfg.name;
  log::info("registering {} from its repository folder", name);
  register_model(self, std::move(cfg), [=](caf::expected<model_info> r) mutable {
    if (!r) {
      rp.deliver(std::move(r.error()));
      return;
    }
    self->request(self->state.manager, self->state.opts.timeout, load_atom_v, name)
        .then([=](model_info& i) mutable { rp.deliver(std::move(i)); },
              [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
  });
}

/// Reads the folder `name` and registers and loads its model; `missing` when there is
/// no such folder, the read error when it cannot be read.
void from_folder(registry_pointer self, const std::string& name,
                 caf::typed_response_promise<model_info> rp, caf::error missing) {
  scan(self, name, [=](std::vector<repository_folder> folders) mutable {
    if (folders.empty())
      rp.deliver(std::move(missing));
    else if (folders.front().error)
      rp.deliver(folders.front().error);
    else
      register_and_load(self, folders.front().config, std::move(rp));
  });
}

}  // namespace

registry_actor::behavior_type registry(registry_pointer self, registry_state init) {
  self->state = std::move(init);
  return {
      [=](register_atom, model_config& cfg) -> caf::result<model_info> {
        auto rp = self->make_response_promise<model_info>();
        register_model(self, std::move(cfg), [=](caf::expected<model_info> r) mutable {
          if (r)
            rp.deliver(std::move(*r));
          else
            rp.deliver(std::move(r.error()));
        });
        return rp;
      },
      [=](unregister_atom, std::string& name) -> caf::result<model_info> {
        return unregister_model(self, name);
      },
      [=](lost_atom, std::vector<int32_t>& devs) {
        self->send(self->state.scheduler, lost_atom_v, std::move(devs));
      },
      [=](found_atom, std::vector<int32_t>& devs) {
        self->send(self->state.scheduler, found_atom_v, devs);
        rejoin_groups(self, devs);
      },
      [=](report_atom) -> caf::settings {
        auto& st = self->state;
        caf::settings out;
        out["registered"] = caf::config_value{static_cast<int64_t>(st.registered.size())};
        out["registering"] = caf::config_value{static_cast<int64_t>(st.registering.size())};
        out["failed"] = caf::config_value{static_cast<int64_t>(st.failed.size())};
        out["repository"] = caf::config_value{static_cast<bool>(st.opts.scan)};
        return out;
      },
      [=](list_atom) -> caf::result<std::vector<model_info>> {
        auto rp = self->make_response_promise<std::vector<model_info>>();
        self->request(self->state.manager, self->state.opts.timeout, list_atom_v)
            .then(
                [=](std::vector<model_info>& ms) mutable {
                  // Registered models (and failed registrations) as the manager has them;
                  // every other folder as it reads now.
                  scan(self, {}, [=](std::vector<repository_folder> folders) mutable {
                    std::map<std::string, model_info> all;
                    for (auto& m : ms) all.emplace(m.config.name, m);
                    for (auto& f : folders) {
                      if (all.count(f.name) > 0) continue;
                      all.emplace(f.name, folder_info(f));
                    }
                    std::vector<model_info> out;
                    for (auto& [name, i] : all) out.push_back(std::move(i));
                    rp.deliver(std::move(out));
                  });
                },
                [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](info_atom, std::string& name) -> caf::result<model_info> {
        auto rp = self->make_response_promise<model_info>();
        self->request(self->state.manager, self->state.opts.timeout, info_atom_v, name)
            .then([=](model_info& i) mutable { rp.deliver(std::move(i)); },
                  [=](caf::error& e) mutable {
                    if (!is(e, ec::unknown_model)) {
                      rp.deliver(std::move(e));
                      return;
                    }
                    // Not registered: its folder, if there is one, says why.
                    scan(self, name, [=](std::vector<repository_folder> folders) mutable {
                      if (folders.empty())
                        rp.deliver(e);
                      else
                        rp.deliver(folder_info(folders.front()));
                    });
                  });
        return rp;
      },
      [=](load_atom, std::string& name) -> caf::result<model_info> {
        auto& st = self->state;
        auto rp = self->make_response_promise<model_info>();
        if (st.registered.count(name) > 0 || st.registering.count(name) > 0) {
          // Registered: make it resident (the manager says why it cannot).
          self->request(st.manager, st.opts.timeout, load_atom_v, name)
              .then([=](model_info& r) mutable { rp.deliver(std::move(r)); },
                    [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        } else if (auto f = st.failed.find(name); f != st.failed.end()) {
          // A failed registration is tried again from its folder, read anew (the
          // operator may have fixed it).
          from_folder(self, name, rp,
                      make_error(f->second.code,
                                 "model " + name + " failed to register: " + f->second.reason));
        } else {
          // Not registered: a folder of that name (added after start, or unregistered
          // before) is read and registered.
          from_folder(self, name, rp,
                      make_error(ec::unknown_model,
                                 "no model named '" + name + "'" +
                                     (st.opts.scan ? " and no folder of that name in the repository"
                                                   : "")));
        }
        return rp;
      },
      [=](unload_atom, std::string& name, bool unregister) -> caf::result<model_info> {
        if (unregister) return unregister_model(self, name);
        auto rp = self->make_response_promise<model_info>();
        self->request(self->state.manager, self->state.opts.timeout, unload_atom_v, name)
            .then([=](model_info& i) mutable { rp.deliver(std::move(i)); },
                  [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
  };
}

}  // namespace registry_detail

caf::expected<registry_actor> spawn_registry(caf::actor_system& sys,
                                             std::vector<shard_worker_actor> workers,
                                             swap_scheduler_actor scheduler,
                                             model_manager_actor manager, engine_registry engines,
                                             registry_options opts) {
  if (workers.empty()) return make_error(ec::invalid_configuration, "a registry without workers");
  if (!scheduler || !manager)
    return make_error(ec::invalid_configuration, "the registry needs a scheduler and a manager");
  if (opts.prepare_timeout.count() <= 0 || opts.timeout.count() <= 0)
    return make_error(ec::invalid_configuration, "registry timeouts must be positive");
  if (opts.max_lora_rank < 1 || opts.max_lora_rank > 4096)
    return make_error(ec::invalid_configuration, "max_lora_rank must be from 1 to 4096, got " +
                                                     std::to_string(opts.max_lora_rank));
  registry_detail::registry_state init;
  init.opts = std::move(opts);
  init.engines = std::move(engines);
  init.workers = std::move(workers);
  init.scheduler = std::move(scheduler);
  init.manager = std::move(manager);
  // Detached where it has a repository, as registering a folder's model may read files;
  // the folder scans themselves run on readers of their own (scan), so that the registry
  // hears a node's loss while a slow read goes on.
  if (init.opts.scan) return sys.spawn<caf::detached>(registry_detail::registry, std::move(init));
  return sys.spawn(registry_detail::registry, std::move(init));
}

}  // namespace computron::actors
