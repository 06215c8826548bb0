#pragma once

// A KServe v2 infer request with token ids, as the end-to-end tests send it to a real
// server: greedy, the one input `input_ids`.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/client/http_client.hpp"

namespace computron::test {

/// POSTs `prompt` to /v2/models/`model`/infer for `max_tokens` greedy tokens; requires the
/// status `expect`. Returns the output ids on 200, else the error body.
/// The request's body alone: what a thread other than the test's may send (Catch's
/// assertions and INFO are not thread-safe, so only the test's thread may use them).
inline std::string kserve_body(const std::vector<int64_t>& prompt, int64_t max_tokens) {
  nlohmann::json body{{"inputs",
                       {{{"name", "input_ids"},
                         {"datatype", "INT64"},
                         {"shape", {1, static_cast<int64_t>(prompt.size())}},
                         {"data", prompt}}}},
                      {"parameters", {{"max_tokens", max_tokens}, {"temperature", 0}}}};
  return body.dump();
}

inline nlohmann::json kserve_infer(net::http_client& c, const std::string& model,
                                   const std::vector<int64_t>& prompt, int64_t max_tokens,
                                   int expect = 200) {
  auto r =
      c.request("POST", "/v2/models/" + model + "/infer", kserve_body(prompt, max_tokens)).value();
  INFO(model << ": " << r.body);
  REQUIRE(r.status == expect);
  if (expect != 200) return nlohmann::json::parse(r.body, nullptr, false);
  return nlohmann::json::parse(r.body)["outputs"][0]["data"];
}

}  // namespace computron::test
