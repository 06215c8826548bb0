#include "actors/model_spec.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace computron::actors {

caf::expected<models::decoder_spec> decoder_spec_of(const model_config& cfg) {
  caf::expected<models::decoder_spec> s{models::decoder_spec{}};
  if (!cfg.arch.empty()) {
    auto j = nlohmann::json::parse(cfg.arch, nullptr, false);
    s = models::spec_from_json(j);
    if (s && s->name.empty()) s->name = cfg.spec.empty() ? cfg.name : cfg.spec;
  } else if (cfg.shape.empty()) {
    s = models::find_spec(cfg.spec);
  } else {
    if (cfg.shape.size() != 6)
      return make_error(ec::invalid_configuration,
                        "shape needs 6 numbers (hidden, layers, heads, ffn, vocab, max_positions)");
    s = models::decoder_spec{cfg.spec.empty() ? cfg.name : cfg.spec,
                             cfg.shape[0],
                             cfg.shape[1],
                             cfg.shape[2],
                             cfg.shape[3],
                             cfg.shape[4],
                             cfg.shape[5]};
  }
  if (!s) return s;
  if (cfg.kind != models::to_string(s->family))
    return make_error(
        ec::invalid_configuration,
        fmt::format("'{}' is a {} shape, but the model's kind is '{}' (make it "
                    "\"{}\")",
                    s->name, models::to_string(s->family), cfg.kind, models::to_string(s->family)));
  return s;
}

}  // namespace computron::actors
