// `computron console`: the prompt around a session (console_session.hpp): commands from
// -c, from a pipe, or typed at a terminal with line editing, completion and history.
#include "apps/computron/console.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <editline/readline.h>
#include <caf/actor_system.hpp>

#include "apps/computron/console_session.hpp"
#include "common/error.hpp"
#include "net/cluster.hpp"

namespace computron::app {

namespace {

using console::session;
using console::words;

/// Splits "a; b;c" into commands, dropping empty ones.
std::vector<std::string> split_commands(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : text) {
    if (ch == ';' || ch == '\n') {
      if (!words(cur).empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!words(cur).empty()) out.push_back(cur);
  return out;
}

// libedit calls back into plain functions: completion reads these.
std::vector<std::string> completion_words;
size_t completion_index = 0;

std::vector<std::string> model_words;

char* next_completion(const char* text, int state) {
  if (state == 0) completion_index = 0;
  auto len = std::strlen(text);
  while (completion_index < completion_words.size()) {
    auto& w = completion_words[completion_index++];
    if (w.compare(0, len, text) == 0) return strdup(w.c_str());
  }
  return nullptr;
}

/// The first word completes to a command; the second to what the command's row in the
/// table says (model names, or its sub-commands: watch, trace and policy).
char** complete(const char* text, int start, int) {
  rl_attempted_completion_over = 1;  // never fall back to file names
  auto before = words(std::string{rl_line_buffer, static_cast<size_t>(start)});
  completion_words.clear();
  if (before.empty()) {
    for (auto& c : session::commands()) completion_words.push_back(c.name);
  } else if (before.size() == 1) {
    if (auto* c = session::find_command(before[0]))
      completion_words = c->completes_models ? model_words : c->completes;
  }
  return rl_completion_matches(text, next_completion);
}

std::string history_file() {
  const char* home = std::getenv("HOME");
  return std::string{home ? home : "."} + "/.computron_history";
}

}  // namespace

int run_console(const console_options& opts) {
  if (auto err = net::validate(opts.tls)) {
    std::cerr << "computron console: " << render(err) << '\n';
    return 2;
  }
  if (auto a = net::parse_node_address(opts.connect); !a) {
    std::cerr << "computron console: " << render(a.error()) << '\n';
    return 2;
  }
  net::cluster_config cfg{opts.tls};
  caf::actor_system sys{cfg};
  session s{sys, opts};
  if (auto err = s.connect()) {
    std::cerr << "computron console: " << render(err) << '\n';
    return 3;
  }
  bool any_failed = false;
  auto run = [&](const std::string& cmd) {
    auto o = s.run(cmd);
    if (o.failed) {
      any_failed = true;
      std::cout << o.text << std::endl;
    } else {
      std::cout << o.text << std::flush;
    }
    return !o.quit;
  };
  if (!opts.commands.empty()) {
    for (auto& c : split_commands(opts.commands))
      if (!run(c)) break;
  } else if (::isatty(STDIN_FILENO) && ::isatty(STDOUT_FILENO)) {
    // A person at a terminal: line editing, history kept across sessions, completion.
    s.interactive = true;
    model_words = s.model_names();
    rl_readline_name = "computron";
    rl_attempted_completion_function = complete;
    using_history();
    auto hist = history_file();
    read_history(hist.c_str());
    std::cout << "computron console: attached to " << opts.connect << " (help lists the commands)"
              << std::endl;
    for (;;) {
      char* raw = readline("computron> ");
      if (raw == nullptr) break;  // end of input (Ctrl-D)
      std::string line{raw};
      std::free(raw);
      if (!words(line).empty()) add_history(line.c_str());
      bool go = true;
      for (auto& c : split_commands(line)) go = go && run(c);
      if (words(line).size() == 1 && words(line)[0] == "models") model_words = s.model_names();
      if (!go) break;
    }
    write_history(hist.c_str());
  } else {
    for (std::string line; std::getline(std::cin, line);) {
      bool go = true;
      for (auto& c : split_commands(line)) go = go && run(c);
      if (!go) break;
    }
  }
  return any_failed ? 1 : 0;
}

}  // namespace computron::app
