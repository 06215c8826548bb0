#pragma once

// The subcommands' registry: each subcommand's file (*_command.cpp, bench_cli.cpp)
// registers its name, its help line and how it adds its flags and runs; main.cpp builds
// the command line from the registry and dispatches to the one parsed.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace computron::net {
struct tls_options;
}

namespace computron::app {

/// The exit codes every subcommand shares (some add their own above these).
constexpr int exit_failure = 1;
constexpr int exit_usage = 2;

/// Runs a parsed subcommand; returns the process exit code.
using command_run = std::function<int()>;

/// One subcommand of `computron`.
struct command {
  /// `computron NAME`.
  std::string name;
  /// Its line in `computron help`.
  std::string help;
  /// Where `computron help` lists it, lowest first.
  int rank = 0;
  /// Adds the flags (and subcommands) to `cmd`, which main created with the name and help,
  /// and returns how to run once they are parsed (it owns what the flags write into).
  std::function<command_run(CLI::App& cmd)> add;
};

/// Registers a subcommand at static initialisation: one namespace-scope
/// `const registration` in the subcommand's file. The files are compiled into the
/// executable itself: in a static library the linker would drop these unreferenced objects.
struct registration {
  explicit registration(command c);
};

/// Every registered subcommand, in help order.
std::vector<command> registered_commands();

/// A size in MiB as bytes, rounded: the flags give sizes in MiB.
uint64_t mib_to_bytes(double mib);

/// --tls-certificate, --tls-key and --tls-cafile, into `tls` (serve, node and console).
void add_tls_flags(CLI::App& cmd, net::tls_options& tls);

}  // namespace computron::app
