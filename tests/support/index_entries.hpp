#pragma once

#include <string>

#include <nlohmann/json.hpp>

/// Pieces the model-control tests share: finding a model in the repository index and a
/// minimal KServe infer body.
namespace computron::test {

/// The index entry of `name` (null when the index does not list it).
inline nlohmann::json entry(const nlohmann::json& index, const std::string& name) {
  for (auto& e : index)
    if (e["name"] == name) return e;
  return nlohmann::json{};
}

/// A KServe infer body of one 3-token prompt and 2 new tokens.
inline nlohmann::json infer_body() {
  return {
      {"inputs",
       {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {1, 3}}, {"data", {1, 2, 3}}}}},
      {"parameters", {{"max_tokens", 2}}}};
}

}  // namespace computron::test
