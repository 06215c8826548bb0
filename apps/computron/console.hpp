#pragma once

#include <chrono>
#include <string>

#include "net/cluster.hpp"

/// `computron console`: an operator's prompt attached to a running controller over CAF
/// (the controller's typed actor, published on its console port).
namespace computron::app {

struct console_options {
  std::string connect = "127.0.0.1:4242";
  /// Commands separated by ';' (no prompt); empty: read stdin.
  std::string commands;
  net::tls_options tls;
  /// One command's reply at most (infer waits for generation; the others are quick).
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds infer_timeout{std::chrono::seconds(120)};
};

/// Runs the console: one result per command. Returns 0 when every command succeeded,
/// 1 when one failed, 2 for bad options, 3 when the controller is unreachable.
int run_console(const console_options& opts);

}  // namespace computron::app
