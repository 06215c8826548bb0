#include "common/json_file.hpp"

#include <fstream>

#include "common/error.hpp"

namespace computron {

caf::expected<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in{path};
  if (!in) return make_error(ec::io_error, "cannot read " + path.string());
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded())
    return make_error(ec::invalid_configuration, path.string() + " is not valid JSON");
  return j;
}

}  // namespace computron
