// The subcommands' registry, and the flags several subcommands share.
#include "apps/computron/command.hpp"

#include <algorithm>
#include <cmath>

#include <CLI/CLI.hpp>

#include "net/cluster.hpp"

namespace computron::app {

namespace {

/// Filled during static initialisation, in whatever order the files' objects run: a
/// function-local static is constructed before its first use.
std::vector<command>& registry() {
  static std::vector<command> commands;
  return commands;
}

}  // namespace

registration::registration(command c) {
  registry().push_back(std::move(c));
}

std::vector<command> registered_commands() {
  auto out = registry();
  std::stable_sort(out.begin(), out.end(),
                   [](const command& a, const command& b) { return a.rank < b.rank; });
  return out;
}

uint64_t mib_to_bytes(double mib) {
  return static_cast<uint64_t>(std::llround(mib * 1048576.0));
}

void add_tls_flags(CLI::App& cmd, net::tls_options& tls) {
  cmd.add_option("--tls-certificate", tls.certificate, "PEM certificate (TLS to peers)");
  cmd.add_option("--tls-key", tls.key, "PEM private key of the certificate");
  cmd.add_option("--tls-cafile", tls.cafile, "PEM CA that signed the peers' certificates");
}

}  // namespace computron::app
