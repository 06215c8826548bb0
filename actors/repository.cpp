#include "actors/repository.hpp"

#include <algorithm>
#include <map>

#include <caf/all.hpp>

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::actors {

namespace {

struct repository_state {
  static constexpr const char* name = "repository";
  model_manager_actor manager;
  repository_options opts;
};

using repository_pointer = repository_actor::stateful_pointer<repository_state>;

/// Folders from the scan, never throwing (a scan that throws is one unreadable folder).
std::vector<repository_folder> scan(repository_pointer self, const std::string& only) {
  if (!self->state.opts.scan) return {};
  try {
    return self->state.opts.scan(only);
  } catch (const std::exception& e) {
    repository_folder f;
    f.name = only.empty() ? "?" : only;
    f.error = make_error(ec::io_error, std::string{"cannot read the repository: "} + e.what());
    return {f};
  }
}

/// A folder that is not registered, as the index lists it.
model_info folder_info(const repository_folder& f) {
  model_info i;
  i.config = f.config;
  i.config.name = f.name;
  i.state = f.error ? model_lifecycle::failed : model_lifecycle::unloaded;
  i.reason = f.error ? render(f.error) : "unloaded";
  // The folder cannot be read: an operator must fix it; requests get 503 with the reason.
  if (f.error) i.reason_code = static_cast<uint8_t>(ec::unavailable);
  return i;
}

/// Registers `cfg` with the manager, then makes it resident.
void register_and_load(repository_pointer self, model_config cfg,
                       caf::typed_response_promise<model_info> rp) {
  auto& st = self->state;
  auto name = cfg.name;
  log::info("registering {} from its repository folder", name);
  self->request(st.manager, caf::timespan{st.opts.register_timeout}, register_atom_v,
                std::move(cfg))
      .then(
          [=](model_info&) mutable {
            self->request(self->state.manager, caf::timespan{self->state.opts.timeout}, load_atom_v,
                          name)
                .then([=](model_info& i) mutable { rp.deliver(std::move(i)); },
                      [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
          },
          [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
}

/// Reads the folder `name` and registers and loads its model; `missing` when there is
/// no such folder, the read error when it cannot be read.
void from_folder(repository_pointer self, const std::string& name,
                 caf::typed_response_promise<model_info> rp, caf::error missing) {
  auto folders = scan(self, name);
  if (folders.empty())
    rp.deliver(std::move(missing));
  else if (folders.front().error)
    rp.deliver(folders.front().error);
  else
    register_and_load(self, folders.front().config, std::move(rp));
}

repository_actor::behavior_type repository(repository_pointer self, model_manager_actor manager,
                                           repository_options opts) {
  self->state.manager = std::move(manager);
  self->state.opts = std::move(opts);
  return {
      [=](list_atom) -> caf::result<std::vector<model_info>> {
        auto rp = self->make_response_promise<std::vector<model_info>>();
        self->request(self->state.manager, caf::timespan{self->state.opts.timeout}, list_atom_v)
            .then(
                [=](std::vector<model_info>& ms) mutable {
                  // Registered models (and failed registrations) as the manager has them;
                  // every other folder as it reads now.
                  std::map<std::string, model_info> all;
                  for (auto& m : ms) all.emplace(m.config.name, std::move(m));
                  for (auto& f : scan(self, {})) {
                    if (all.count(f.name) > 0) continue;
                    all.emplace(f.name, folder_info(f));
                  }
                  std::vector<model_info> out;
                  for (auto& [name, i] : all) out.push_back(std::move(i));
                  rp.deliver(std::move(out));
                },
                [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](info_atom, std::string& name) -> caf::result<model_info> {
        auto rp = self->make_response_promise<model_info>();
        self->request(self->state.manager, caf::timespan{self->state.opts.timeout}, info_atom_v,
                      name)
            .then([=](model_info& i) mutable { rp.deliver(std::move(i)); },
                  [=](caf::error& e) mutable {
                    if (!is(e, ec::unknown_model)) {
                      rp.deliver(std::move(e));
                      return;
                    }
                    // Not registered: its folder, if there is one, says why.
                    auto folders = scan(self, name);
                    if (folders.empty())
                      rp.deliver(std::move(e));
                    else
                      rp.deliver(folder_info(folders.front()));
                  });
        return rp;
      },
      [=](load_atom, std::string& name) -> caf::result<model_info> {
        auto rp = self->make_response_promise<model_info>();
        auto timeout = caf::timespan{self->state.opts.timeout};
        self->request(self->state.manager, timeout, info_atom_v, name)
            .then(
                [=](model_info& i) mutable {
                  if (i.state != model_lifecycle::failed) {
                    // Registered: make it resident (the manager says why it cannot).
                    self->request(self->state.manager, timeout, load_atom_v, name)
                        .then([=](model_info& r) mutable { rp.deliver(std::move(r)); },
                              [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
                    return;
                  }
                  // A failed registration is tried again from its folder, read anew
                  // (the operator may have fixed it).
                  from_folder(self, name, rp,
                              make_error(ec::unavailable,
                                         "model " + name + " failed to register: " + i.reason));
                },
                [=](caf::error& e) mutable {
                  if (!is(e, ec::unknown_model)) {
                    rp.deliver(std::move(e));
                    return;
                  }
                  // Not registered: a folder of that name (added after start, or
                  // unregistered before) is read and registered.
                  from_folder(self, name, rp,
                              make_error(ec::unknown_model,
                                         "no model named '" + name + "'" +
                                             (self->state.opts.scan
                                                  ? " and no folder of that name in the repository"
                                                  : "")));
                });
        return rp;
      },
      [=](unload_atom, std::string& name, bool unregister) -> caf::result<model_info> {
        auto rp = self->make_response_promise<model_info>();
        auto timeout = caf::timespan{self->state.opts.timeout};
        auto deliver = [=](model_info& i) mutable { rp.deliver(std::move(i)); };
        auto fail = [=](caf::error& e) mutable { rp.deliver(std::move(e)); };
        if (unregister)
          self->request(self->state.manager, timeout, unregister_atom_v, name).then(deliver, fail);
        else
          self->request(self->state.manager, timeout, unload_atom_v, name).then(deliver, fail);
        return rp;
      },
  };
}

}  // namespace

caf::expected<repository_actor> spawn_repository(caf::actor_system& sys,
                                                 model_manager_actor manager,
                                                 repository_options opts) {
  if (!manager) return make_error(ec::invalid_configuration, "the repository needs a manager");
  if (opts.register_timeout.count() <= 0 || opts.timeout.count() <= 0)
    return make_error(ec::invalid_configuration, "repository timeouts must be positive");
  // Detached: folder reads block, and must not hold one of CAF's scheduler threads.
  return sys.spawn<caf::detached>(repository, std::move(manager), std::move(opts));
}

}  // namespace computron::actors
