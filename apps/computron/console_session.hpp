#pragma once

// The console's session with a controller: the commands in one table (help prints it, the
// session dispatches through it, the prompt completes from it) and the request behind each
// (console_session.cpp). console.cpp is the prompt around it.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/interfaces.hpp"
#include "apps/computron/console.hpp"

namespace computron::app::console {

/// A line's words, split at white space.
std::vector<std::string> words(const std::string& line);

/// A command's outcome: what to print, and whether it failed.
struct outcome {
  std::string text;
  bool failed = false;
  bool quit = false;
};

class session;

/// One console command. This table is the only list of them: help prints it, the session
/// dispatches through it and the prompt completes from it.
struct console_command {
  /// The line's first word.
  std::string name;
  /// Its forms' arguments as help shows them: `trace start | trace stop F` is {"start",
  /// "stop F"}.
  std::vector<std::string> args;
  /// Its help, lines separated by '\n'; empty: it shares the line of the command before it
  /// (`load M | unload M`).
  std::string help;
  /// Whether it asks the controller (help and quit do not, so they work when it is gone).
  bool remote = true;
  /// What the word after the name completes to: the models' names, or these words.
  bool completes_models = false;
  std::vector<std::string> completes;
  /// Runs it with the line's words (the name first).
  std::function<outcome(session&, const std::vector<std::string>&)> run;
};

/// One console's connection to the controller and the commands run over it.
class session {
 public:
  session(caf::actor_system& sys, const console_options& opts);
  /// Connects (or reconnects); the error says why not.
  caf::error connect();
  /// One command line: the command the table names, with its words.
  outcome run(const std::string& line);
  /// Every command, in the order help lists them.
  static const std::vector<console_command>& commands();
  /// The command named `name`, or null.
  static const console_command* find_command(std::string name);
  /// At a terminal: watch clears the screen and stops at a key.
  bool interactive = false;
  /// Model names for completion (refreshed at start and by `models`).
  std::vector<std::string> model_names();

 private:
  /// Notices a controller that went away since the last command (its down message), and
  /// tries once to reconnect.
  caf::error alive();
  template <class T, class... Ts>
  caf::expected<T> ask(std::chrono::milliseconds timeout, Ts... xs);
  outcome models();
  outcome devices(bool by_node);
  outcome residency(bool load, const std::string& model);
  outcome pin(const std::string& model, bool on);
  outcome infer(const std::vector<std::string>& w);
  outcome stats();
  outcome policy(const std::string& name);
  outcome trace(bool start, const std::string& path);
  outcome watch(const std::vector<std::string>& w);
  /// Waits up to `seconds`; true when a key came (it is consumed). On a terminal the key
  /// needs no Enter; from a pipe this is only a wait.
  bool key_pressed_within(double seconds) const;

  caf::actor_system& sys_;
  const console_options& opts_;
  caf::scoped_actor self_;
  actors::controller_actor ctrl_;
  bool lost_ = false;
};

}  // namespace computron::app::console
