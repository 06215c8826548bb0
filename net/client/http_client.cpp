#include "net/client/http_client.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/error.hpp"

namespace computron::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct http_client::impl {
  std::string host;
  uint16_t port = 0;
  std::chrono::milliseconds connect_timeout;
  asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  caf::error open() {
    stream.emplace(ioc);
    beast::error_code ec;
    auto addr = asio::ip::make_address(host, ec);
    if (ec) return make_error(ec::invalid_request, "bad address '" + host + "'");
    stream->expires_after(connect_timeout);
    stream->connect(tcp::endpoint{addr, port}, ec);
    if (ec)
      return make_error(ec::io_error, "cannot connect to " + host + ":" + std::to_string(port) +
                                          ": " + ec.message());
    buffer.clear();
    return {};
  }

  caf::expected<http_result> once(const std::string& method, const std::string& target,
                                  const std::string& body, std::chrono::milliseconds timeout,
                                  const std::vector<std::pair<std::string, std::string>>& headers) {
    http::request<http::string_body> req{http::string_to_verb(method), target, 11};
    req.set(http::field::host, host);
    for (auto& [name, value] : headers) req.set(name, value);
    req.keep_alive(true);
    if (!body.empty()) req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    beast::error_code ec;
    stream->expires_after(timeout);
    http::write(*stream, req, ec);
    if (ec) return make_error(ec::io_error, "write: " + ec.message());
    http::response_parser<http::string_body> parser;
    parser.body_limit(256ull << 20);
    http::read(*stream, buffer, parser, ec);
    if (ec) return make_error(ec::io_error, "read: " + ec.message());
    auto& res = parser.get();
    http_result r;
    r.status = static_cast<int>(res.result_int());
    r.body = res.body();
    if (auto it = res.find(http::field::retry_after); it != res.end())
      r.retry_after = std::string{it->value()};
    if (auto it = res.find(http::field::content_type); it != res.end())
      r.content_type = std::string{it->value()};
    if (!res.keep_alive()) stream.reset();
    return r;
  }
};

http_client::http_client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

http_client::~http_client() = default;

caf::expected<std::unique_ptr<http_client>> http_client::connect(
    const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  auto p = std::make_unique<impl>();
  p->host = host;
  p->port = port;
  p->connect_timeout = timeout;
  if (auto err = p->open()) return err;
  return std::unique_ptr<http_client>{new http_client(std::move(p))};
}

caf::expected<http_result> http_client::request(
    const std::string& method, const std::string& target, const std::string& body,
    std::chrono::milliseconds timeout,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!impl_->stream)
      if (auto err = impl_->open()) return err;
    const bool reused = attempt == 0;
    auto r = impl_->once(method, target, body, timeout, headers);
    if (r || attempt == 1) return r;
    impl_->stream.reset();
    // Retry only when a kept-alive connection turned out closed before any answer (the
    // server's idle timeout); never after a timeout, which could run a request twice.
    auto why = render(r.error());
    bool closed = why.find("end of stream") != std::string::npos ||
                  why.find("reset by peer") != std::string::npos ||
                  why.find("Broken pipe") != std::string::npos;
    if (!reused || !closed) return r;
  }
  return make_error(ec::io_error, "unreachable");
}

}  // namespace computron::net
