#include <set>
#include <string>

#include "common/error.hpp"
#include "net/cluster.hpp"

// Node addresses as operators write them (config files, --nodes). Its own translation
// unit, apart from the cluster code, so the config reader links without CAF's middleman.
namespace computron::net {

caf::expected<node_address> parse_node_address(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return make_error(ec::invalid_configuration, "node address '" + text + "': " + why);
  };
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("expected host:port");
  node_address a;
  a.host = text.substr(0, colon);
  if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']')
    a.host = a.host.substr(1, a.host.size() - 2);
  auto port = text.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return bad("the port must be a number");
  auto p = std::stoi(port);
  if (p < 1 || p > 65535) return bad("the port must be 1..65535");
  a.port = static_cast<uint16_t>(p);
  return a;
}

caf::expected<std::vector<node_address>> parse_node_list(const std::string& text) {
  std::vector<node_address> out;
  std::set<std::string> seen;
  size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    auto item = text.substr(start, end - start);
    auto a = parse_node_address(item);
    if (!a) return a.error();
    if (!seen.insert(a->str()).second)
      return make_error(ec::invalid_configuration, "node " + a->str() + " is listed twice");
    out.push_back(*a);
    start = end + 1;
  }
  if (out.empty()) return make_error(ec::invalid_configuration, "no nodes listed");
  return out;
}

}  // namespace computron::net
