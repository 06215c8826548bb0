// Fuzz target: one HTTP request as bytes off the socket, through the parser the server
// uses (Beast's request_parser with the server's body limit, eager) and then our routing
// and the control bodies (net/http/routes.cpp), the path every request takes before an actor
// sees it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "net/http/routes.hpp"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  http::request_parser<http::string_body> parser;
  parser.eager(true);
  parser.body_limit(1 << 20);
  boost::beast::error_code ec;
  // Fed in two pieces where the input allows, as a socket delivers it.
  auto put = [&](size_t from, size_t to) {
    while (!ec && from < to && !parser.is_done()) {
      auto n = parser.put(boost::asio::buffer(data + from, to - from), ec);
      if (ec == http::error::need_more) {
        ec = {};
        break;
      }
      if (n == 0) break;
      from += n;
    }
    return from;
  };
  auto from = put(0, size / 2);
  put(from, size);
  if (!ec && !parser.is_done()) parser.put_eof(ec);
  if (ec || !parser.is_done()) return 0;
  auto req = parser.release();
  auto method = req.method_string();
  auto target = req.target();
  auto matched = computron::net::match_route(std::string_view{method.data(), method.size()},
                                             std::string_view{target.data(), target.size()});
  if (auto m = std::get_if<computron::net::route_match>(&matched)) {
    using computron::net::route_id;
    if (m->id == route_id::repository_index) (void)computron::net::index_filter(req.body());
    if (m->id == route_id::repository_load)
      (void)computron::net::control_parameters(req.body(), {});
    if (m->id == route_id::repository_unload)
      (void)computron::net::control_parameters(req.body(), {"unregister", "unload_dependents"});
  }
  return 0;
}
