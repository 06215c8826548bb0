#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <caf/expected.hpp>

/// An open-loop HTTP client (Boost.Asio/Beast, one I/O thread): every request is sent at
/// its own time whether or not earlier ones have answered, over a pool of keep-alive
/// connections that grows as needed up to a cap. What `computron loadgen` and the
/// experiments drive a server with. Beast stays inside open_loop.cpp.
namespace computron::net {

struct timed_request {
  /// Seconds after the run's start at which to send.
  double at_s = 0;
  std::string method = "POST";
  std::string target;
  std::string body;
  /// Read a 200 text/event-stream answer as it comes: each event's data goes to
  /// open_loop_options::on_event, and the body is not kept.
  bool stream = false;
};

struct timed_result {
  /// Seconds after the start: written to a connection (later than at_s when every
  /// connection was busy), and answered or failed. -1 when never sent (cancelled).
  double sent_s = -1;
  double done_s = -1;
  /// HTTP status; 0 when no answer came (then `error` says why).
  int status = 0;
  std::string error;
  /// The response body (the error text of a failed request), at most 64 KiB kept.
  std::string body;
};

struct open_loop_progress {
  size_t total = 0;
  size_t sent = 0;
  size_t done = 0;
  size_t failed = 0;
  size_t open_connections = 0;
  double elapsed_s = 0;
  /// The run is over (the last call).
  bool final = false;
};

struct open_loop_options {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  /// Connections open at most; requests due while all are busy wait for the first free
  /// one (their latency still counts from their own time).
  size_t max_connections = 256;
  std::chrono::milliseconds connect_timeout{5000};
  /// A request with no answer after this fails with a timeout.
  std::chrono::milliseconds request_timeout{300000};
  /// Called on the I/O thread every progress_interval and once at the end.
  std::function<void(const open_loop_progress&)> on_progress;
  std::chrono::milliseconds progress_interval{250};
  /// Streamed requests: called on the I/O thread with the request's index, the time of
  /// arrival (seconds after the start) and the data of each Server-Sent Event, in order
  /// ("[DONE]" included).
  std::function<void(size_t, double, std::string_view)> on_event;
  /// Set from elsewhere to stop: nothing more is sent, requests in flight fail as
  /// "cancelled", the run returns.
  const std::atomic<bool>* cancel = nullptr;
};

/// Sends `requests` (sorted by at_s or not) at their times; returns one result per
/// request, in the same order. Errors only for options that cannot work (a host that
/// does not resolve, zero connections); an unreachable server gives failed results.
caf::expected<std::vector<timed_result>> run_open_loop(const std::vector<timed_request>& requests,
                                                       const open_loop_options& opts);

}  // namespace computron::net
