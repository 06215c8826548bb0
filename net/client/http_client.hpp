#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/expected.hpp>

/// A small blocking HTTP/1.1 client with keep-alive (Beast): the demo workload, the
/// benchmarks and the end-to-end tests talk to a live server through it.
namespace computron::net {

struct http_result {
  int status = 0;
  std::string body;
  /// The Retry-After header, empty when absent.
  std::string retry_after;
  std::string content_type;
};

class http_client {
 public:
  /// Connects to host:port. Errors: io_error with the reason.
  static caf::expected<std::unique_ptr<http_client>> connect(const std::string& host, uint16_t port,
                                                             std::chrono::milliseconds timeout);
  ~http_client();

  /// Sends one request and reads its response on this connection (reconnecting once
  /// when the server closed it). Errors: io_error, timeouts.
  /// `headers`: more request fields (name, value), e.g. Authorization.
  caf::expected<http_result> request(
      const std::string& method, const std::string& target, const std::string& body = {},
      std::chrono::milliseconds timeout = std::chrono::seconds(60),
      const std::vector<std::pair<std::string, std::string>>& headers = {});

  struct impl;

 private:
  explicit http_client(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace computron::net
