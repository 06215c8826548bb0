// POST /v1/load_lora_adapter and /v1/unload_lora_adapter, with vLLM's bodies and answers:
// an adapter's PEFT folder registered (or unregistered) at run time, as an adapter of the
// model its body or its adapter_config.json names. Registration checks the folder against
// its base (models/lora_adapter.hpp); this side only reads the bodies.
#include <filesystem>

#include "common/json_file.hpp"
#include "net/http/body_reader.hpp"
#include "net/http/http_server_impl.hpp"

namespace computron::net {

namespace {

struct lora_body {
  std::string name;
  std::string path;
  /// Ours (SGLang names it so too): the base, where the folder's base_model_name_or_path
  /// names none of the served models.
  std::string base;
  /// vLLM's load_inplace: an adapter of that name is replaced.
  bool inplace = false;
};

std::variant<lora_body, request_error> parse_lora_body(const json& body, bool load) {
  if (!body.is_object()) return request_error{"the body must be a JSON object", ""};
  detail::reader r{body};
  if (load)
    r.only({"lora_name", "lora_path", "load_inplace", "base_model_name"});
  else
    r.only({"lora_name", "lora_int_id"});
  lora_body out;
  auto string_field = [&](const char* key, std::string& into, bool required) {
    auto v = r.find(key);
    if (!v && !required) return;
    if (!v || !v->is_string() || v->get<std::string>().empty())
      return r.fail(key, std::string{"'"} + key + "' must be a non-empty string");
    into = v->get<std::string>();
  };
  string_field("lora_name", out.name, true);
  if (load) {
    string_field("lora_path", out.path, true);
    string_field("base_model_name", out.base, false);
    r.boolean("load_inplace", out.inplace);
  }
  if (r.error) return *r.error;
  return out;
}

response plain_ok(const std::string& text) {
  response res{http::status::ok, 11};
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  res.body() = text;
  res.prepare_payload();
  return res;
}

}  // namespace

void http_server::impl::lora_adapter(const std::string& body, bool load, responder reply) {
  auto j = parse_json_body(body);
  if (auto e = std::get_if<request_error>(&j)) return reply(openai_bad_request(*e));
  auto parsed = parse_lora_body(std::get<json>(j), load);
  if (auto e = std::get_if<request_error>(&parsed)) return reply(openai_bad_request(*e));
  auto b = std::get<lora_body>(parsed);
  if (!registry)
    return reply(openai_error_response(make_error(ec::invalid_request,
                                                  "this server has no model control (adapters are "
                                                  "registered through its registry)")));
  auto fail = [reply](const caf::error& e) { reply(openai_error_response(e)); };
  auto timeout = caf::timespan{opts.request_timeout};
  auto repo = registry;
  auto fe = frontend;
  if (!load) {
    // Only adapters: a whole model is unloaded through the repository's routes.
    auto name = b.name;
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(fe, timeout, actors::describe_atom_v, name)
          .then(
              [=](actors::model_info& i) {
                if (i.config.base.empty()) {
                  self->quit();
                  return fail(make_error(ec::invalid_request,
                                         "'" + name + "' is a model, not a LoRA adapter"));
                }
                self->request(repo, timeout, actors::unregister_atom_v, name)
                    .then(
                        [=](actors::model_info&) {
                          self->quit();
                          reply(plain_ok("Success: LoRA adapter '" + name +
                                         "' removed successfully."));
                        },
                        [=](caf::error& e) {
                          self->quit();
                          fail(e);
                        });
              },
              [=](caf::error& e) {
                self->quit();
                fail(is(e, ec::unknown_model)
                         ? make_error(ec::unknown_model,
                                      "the LoRA adapter '" + name + "' cannot be found")
                         : e);
              });
    });
    return;
  }
  // The folder's own word on its base, unless the body names one.
  std::error_code fs_err;
  auto folder = std::filesystem::absolute(b.path, fs_err).lexically_normal();
  auto config = read_json_file(folder / "adapter_config.json");
  if (!config)
    return fail(with_context(make_error(ec::invalid_request, render(config.error())),
                             "'lora_path' must be a PEFT adapter's folder"));
  actors::model_config a;
  a.name = b.name;
  a.weights_path = folder.string();
  a.base = b.base;
  if (a.base.empty())
    if (auto v = config->find("base_model_name_or_path"); v != config->end() && v->is_string())
      a.base = v->get<std::string>();
  if (a.base.empty())
    return fail(make_error(ec::invalid_request,
                           "the adapter names no base_model_name_or_path: give 'base_model_name'"));
  sys.spawn([=](caf::event_based_actor* self) {
    auto do_register = [=] {
      self->request(repo, timeout, actors::register_atom_v, a)
          .then(
              [=](actors::model_info&) {
                self->quit();
                reply(plain_ok("Success: LoRA adapter '" + a.name + "' added successfully."));
              },
              [=](caf::error& e) {
                self->quit();
                // vLLM answers a second load of a name with a 400.
                fail(is(e, ec::invalid_state) && !b.inplace
                         ? make_error(ec::invalid_request,
                                      "the LoRA adapter '" + a.name +
                                          "' has already been loaded (load_inplace replaces "
                                          "it): " +
                                          render(e))
                         : e);
              });
    };
    if (!b.inplace) return do_register();
    // In place: the old registration goes first (refused while requests of it run).
    self->request(fe, timeout, actors::describe_atom_v, a.name)
        .then(
            [=](actors::model_info& i) {
              if (i.config.base.empty()) {
                self->quit();
                return fail(make_error(ec::invalid_request,
                                       "'" + a.name + "' is a model, not a LoRA adapter"));
              }
              self->request(repo, timeout, actors::unregister_atom_v, a.name)
                  .then([=](actors::model_info&) { do_register(); },
                        [=](caf::error& e) {
                          self->quit();
                          fail(e);
                        });
            },
            [=](caf::error&) { do_register(); });
  });
}

}  // namespace computron::net
