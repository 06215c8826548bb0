#pragma once

// The HTTP server's transport (internal to net/; the only code besides the server that
// sees Beast's sockets): accepting connections, reading requests with their limits,
// writing answers whole or as Server-Sent Events, lingering after an early refusal, and
// noticing a client that left while its answer is worked on.
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio.hpp>
#include <boost/beast/http.hpp>

#include "net/http/http_server.hpp"
#include "net/http/replies.hpp"

namespace computron::net {

using replies::responder;
using replies::response;

/// A response written in pieces: Server-Sent Events over chunked encoding. Any thread.
class sse_channel {
 public:
  virtual ~sse_channel() = default;
  /// Sends one event, "data: <payload>\n\n".
  virtual void send(std::string payload) = 0;
  /// Ends the response; the connection closes after it.
  virtual void end() = 0;
};

/// Starts a streamed response (200, text/event-stream) on the request's connection.
using sse_opener = std::function<std::shared_ptr<sse_channel>()>;
/// Registers what to do if the client goes away before its answer is written (called
/// at most once, from an I/O thread; at once if it is already gone). Work that takes a
/// while registers one, so nobody keeps computing an answer nobody will read.
using gone_hook = std::function<void(std::function<void()>)>;

namespace transport {

using request = boost::beast::http::request<boost::beast::http::string_body>;

/// What a connection hands each request to (called on an I/O thread; must not block).
using request_handler = std::function<void(const request&, responder, sse_opener, gone_hook)>;

/// The server's accepting side. Outlives every connection (the server stops its I/O
/// threads before it goes, then waits a bounded while for `held` to reach 0).
struct listener {
  boost::asio::io_context& ioc;
  boost::asio::ip::tcp::acceptor& acceptor;
  const std::atomic<bool>& stopped;
  const http_options& opts;
  request_handler handle;
  /// Requests whose answer paths (responder, stream, gone hook) something outside the I/O
  /// threads still holds, such as an actor being cleaned up after it answered. Each holds
  /// its connection, whose socket closes through the I/O context when it goes.
  std::atomic<int64_t> held{0};
};

/// Accepts connections until the acceptor closes, each served on its own strand.
void accept(listener& srv);

/// A request's answer paths, guarded: it gets one answer (a later one is dropped; a
/// stream opened counts as the answer), and that answer is logged (the access log, at
/// info: method, target, status, milliseconds) and handed to `answered` (its status).
struct guarded_answer {
  responder reply;
  sse_opener open_sse;
  /// Whether the request has its answer already.
  std::shared_ptr<std::atomic<bool>> done;
};
guarded_answer guard_answer(const request& req, responder reply, sse_opener open_sse,
                            std::function<void(int status)> answered);

}  // namespace transport
}  // namespace computron::net
