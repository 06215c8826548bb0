#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <caf/expected.hpp>

/// generation_config.json's sampling defaults: what a model's authors set for a request
/// that leaves a setting out, applied as vLLM applies them (the keys it reads, do_sample not among
/// them). Torch-free.
namespace computron::text {

struct generation_defaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  /// max_new_tokens: the default length of a request that gives none.
  std::optional<int64_t> max_new_tokens;
};

/// Reads `folder`/generation_config.json (or `folder` itself when it names a file). No
/// file: no defaults. A setting of the wrong type or out of its range is refused naming
/// the file and the key (ec::invalid_configuration), never applied wrong.
caf::expected<generation_defaults> read_generation_defaults(const std::string& folder);

}  // namespace computron::text
