#pragma once

// Fields of OpenAI's API and vLLM's that the /v1 routes do not implement (internal to
// net/): the ones whose absence leaves the answer the same are accepted and ignored, the
// others are refused with the reason. The README's table of request fields lists the same.
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/http/body_reader.hpp"

namespace computron::net::detail {

enum class field_status { ignored, refused };

struct field_rule {
  const char* name;
  field_status status;
  /// Why it may be ignored, or why it is refused (the 400's message says it).
  const char* why;
};

/// The table, the same for /v1/completions and /v1/chat/completions.
const std::vector<field_rule>& extra_fields();

/// Applies the table to the body `r` reads: an ignored field joins `allowed` and is named
/// in `ignored`; a refused one fails `r` with its reason. `modalities` is ignored when it
/// asks for text only.
void apply_field_rules(reader& r, const nlohmann::json& body, std::set<std::string>& allowed,
                       std::vector<std::string>& ignored);

}  // namespace computron::net::detail
