#pragma once

#include <filesystem>

#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

namespace computron {

/// Reads a JSON file that an operator or a model folder provides (configs, checkpoint
/// indexes, tokenizers). Errors: io_error when it cannot be read, invalid_configuration
/// when it is not JSON; both name the file.
caf::expected<nlohmann::json> read_json_file(const std::filesystem::path& path);

}  // namespace computron
