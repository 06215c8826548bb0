#pragma once

#include <string>
#include <vector>

#include <catch2/catch.hpp>

/// Server-Sent Events as the tests read them.
namespace computron::test {

/// The data payloads of a Server-Sent Events body, in order.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    auto end = body.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end + 2;
  }
  return out;
}

}  // namespace computron::test
