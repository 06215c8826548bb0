#include "apps/computron/console.hpp"

#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <editline/readline.h>
#include <fmt/format.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "actors/interfaces.hpp"
#include "common/error.hpp"

namespace computron::app {

namespace {

using namespace computron::actors;

constexpr double mib = 1048576.0;

const char* help_text =
    "commands:\n"
    "  help                         this list\n"
    "  nodes                        nodes and whether they answer\n"
    "  devices                      memory used/total, link GB/s, resident shards\n"
    "  models                       state, tp x pp, bytes (and over the checkpoint's), queue,\n"
    "                               served, idle, pinned\n"
    "  load M | unload M            make model M resident now, or evict it\n"
    "  pin M | unpin M              never evict M, or allow it again\n"
    "  infer M ID... [max_tokens=N] [temperature=T] [top_k=K] [top_p=P] [seed=S]\n"
    "                               generate; prints the tokens and the time split\n"
    "  stats                        req/s and latency (last minute); served, swaps, GB/s\n"
    "  policy [lru|cost]            show or switch the eviction policy\n"
    "  watch stats|models [S] [N]   refresh every S seconds (2) until a key is pressed,\n"
    "                               or N times (from a pipe: once unless N is given)\n"
    "  trace start | trace stop F   start a fresh timeline; write it to F (a Chrome\n"
    "                               trace, on the controller's machine)\n"
    "  quit                         leave\n";

std::vector<std::string> words(const std::string& line) {
  std::istringstream in{line};
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

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

/// A command's outcome: what to print, and whether it failed.
struct outcome {
  std::string text;
  bool failed = false;
  bool quit = false;
};

outcome fail(std::string why) {
  return {"error: " + std::move(why), true};
}

bool parse_int(const std::string& s, int64_t& out) {
  try {
    size_t used = 0;
    out = std::stoll(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_double(const std::string& s, double& out) {
  try {
    size_t used = 0;
    out = std::stod(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

class session {
 public:
  session(caf::actor_system& sys, const console_options& opts)
      : sys_(sys), opts_(opts), self_(sys) {}

  /// Connects (or reconnects); the error says why not.
  caf::error connect() {
    auto addr = net::parse_node_address(opts_.connect);
    if (!addr) return addr.error();
    auto r = opts_.tls.enabled()
                 ? caf::openssl::remote_actor<controller_actor>(sys_, addr->host, addr->port)
                 : caf::io::remote_actor<controller_actor>(sys_, addr->host, addr->port);
    if (!r)
      return make_error(ec::unavailable, "cannot reach the controller at " + opts_.connect + ": " +
                                             render(r.error()));
    ctrl_ = *r;
    self_->monitor(ctrl_);
    lost_ = false;
    return {};
  }

  outcome run(const std::string& line) {
    auto w = words(line);
    if (w.empty()) return {};
    const auto& cmd = w[0];
    if (cmd == "help") return {help_text};
    if (cmd == "quit" || cmd == "exit") return {"", false, true};
    if (auto err = alive()) return fail(render(err));
    auto one_model = [&](const char*) -> const std::string* {
      return w.size() == 2 ? &w[1] : nullptr;
    };
    if (cmd == "models" && w.size() == 1) return models();
    if ((cmd == "devices" || cmd == "nodes") && w.size() == 1) return devices(cmd == "nodes");
    if (cmd == "load" || cmd == "unload") {
      auto m = one_model("");
      if (!m) return fail("usage: " + cmd + " MODEL");
      return residency(cmd == "load", *m);
    }
    if (cmd == "pin" || cmd == "unpin") {
      auto m = one_model("");
      if (!m) return fail("usage: " + cmd + " MODEL");
      return pin(*m, cmd == "pin");
    }
    if (cmd == "infer") return infer(w);
    if (cmd == "stats" && w.size() == 1) return stats();
    if (cmd == "policy" && w.size() <= 2) return policy(w.size() == 2 ? w[1] : std::string{});
    if (cmd == "trace") {
      if (w.size() == 2 && w[1] == "start") return trace(true, {});
      if (w.size() == 3 && w[1] == "stop") return trace(false, w[2]);
      return fail("usage: trace start | trace stop FILE");
    }
    if (cmd == "watch") return watch(w);
    for (auto known : {"models", "devices", "nodes", "stats", "policy"})
      if (cmd == known) return fail("'" + cmd + "' takes no such arguments; see help");
    return fail("unknown command '" + cmd + "'; type help");
  }

 private:
  /// Notices a controller that went away since the last command (its down message), and
  /// tries once to reconnect.
  caf::error alive() {
    self_->receive([&](caf::down_msg& d) { lost_ = lost_ || d.source == ctrl_.address(); },
                   caf::after(std::chrono::seconds(0)) >> [] {});
    if (!lost_ && ctrl_) return {};
    if (auto err = connect())
      return make_error(ec::unavailable,
                        "the connection to the controller was lost (" + render(err) + ")");
    std::cout << "(reconnected to " << opts_.connect << ")\n";
    return {};
  }

  template <class T, class... Ts>
  caf::expected<T> ask(std::chrono::milliseconds timeout, Ts... xs) {
    caf::expected<T> out{caf::error{}};
    self_->request(ctrl_, caf::timespan{timeout}, xs...)
        .receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
    if (!out && (out.error() == caf::sec::request_timeout ||
                 out.error() == caf::sec::request_receiver_down))
      lost_ = true;  // try a reconnect before the next command
    return out;
  }

  outcome models() {
    auto ms = ask<std::vector<model_info>>(opts_.timeout, list_atom_v);
    if (!ms) return fail(render(ms.error()));
    // "x ckpt": bytes on the devices over the checkpoint's (what a swap moves per byte of
    // weights; above 1 only by what the ranks replicate).
    std::string out = fmt::format(
        "{:<20} {:<12} {:>5} {:>10} {:>7} {:>6} {:>6} {:>8} {:>9} {:>6}\n", "model", "state",
        "tp*pp", "MiB", "KV MiB", "x ckpt", "queued", "served", "idle s", "pinned");
    for (auto& m : *ms)
      out += fmt::format(
          "{:<20} {:<12} {:>5} {:>10.1f} {:>7.1f} {:>6} {:>6} {:>8} {:>9} {:>6}\n", m.config.name,
          to_string(m.state), fmt::format("{}x{}", m.config.tp, m.config.pp),
          static_cast<double>(m.bytes) / mib, static_cast<double>(m.kv_bytes) / mib,
          m.weight_bytes > 0 ? fmt::format("{:.3f}", static_cast<double>(m.bytes) / m.weight_bytes)
                             : std::string{"-"},
          m.queued, m.served, m.idle_s < 0 ? std::string{"never"} : fmt::format("{:.1f}", m.idle_s),
          m.config.pinned ? "yes" : "no");
    return {out};
  }

  outcome devices(bool by_node) {
    auto ds = ask<std::vector<device_report>>(opts_.timeout, devices_atom_v);
    if (!ds) return fail(render(ds.error()));
    std::string out;
    if (by_node) {
      std::map<std::string, std::pair<int, bool>> nodes;
      for (auto& d : *ds) {
        auto& n = nodes.try_emplace(d.node, 0, true).first->second;
        ++n.first;
        n.second = n.second && d.online;
      }
      out = fmt::format("{:<24} {:>7} {}\n", "node", "devices", "state");
      for (auto& [name, n] : nodes)
        out += fmt::format("{:<24} {:>7} {}\n", name, n.first, n.second ? "online" : "OFFLINE");
      return {out};
    }
    out = fmt::format("{:>3} {:<22} {:<14} {:>16} {:>7} {:>9} {}\n", "dev", "node", "name",
                      "used/total MiB", "KV MiB", "link GB/s", "resident");
    for (auto& d : *ds) {
      std::string resident;
      for (auto& r : d.resident) resident += (resident.empty() ? "" : ",") + r;
      out +=
          fmt::format("{:>3} {:<22} {:<14} {:>16} {:>7.1f} {:>9.2f} {}\n", d.device, d.node, d.name,
                      fmt::format("{:.0f}/{:.0f}", static_cast<double>(d.used_bytes) / mib,
                                  static_cast<double>(d.capacity_bytes) / mib),
                      static_cast<double>(d.kv_bytes) / mib, d.link_gbps,
                      d.online ? resident : std::string{"(offline)"});
    }
    return {out};
  }

  outcome residency(bool load, const std::string& model) {
    auto i = load ? ask<model_info>(opts_.infer_timeout, load_atom_v, model)
                  : ask<model_info>(opts_.infer_timeout, unload_atom_v, model);
    if (!i) return fail(render(i.error()));
    return {fmt::format("{}: {}\n", i->config.name, to_string(i->state))};
  }

  outcome pin(const std::string& model, bool on) {
    auto r = ask<residency_report>(opts_.timeout, pin_atom_v, model, on);
    if (!r) return fail(render(r.error()));
    return {fmt::format("{}: {} ({})\n", r->model, r->pinned ? "pinned" : "unpinned",
                        to_string(r->state))};
  }

  outcome infer(const std::vector<std::string>& w) {
    if (w.size() < 3) return fail("usage: infer MODEL ID... [max_tokens=N] [temperature=T] ...");
    infer_request req;
    req.model = w[1];
    for (size_t i = 2; i < w.size(); ++i) {
      auto eq = w[i].find('=');
      if (eq == std::string::npos) {
        int64_t id = 0;
        if (!parse_int(w[i], id)) return fail("'" + w[i] + "' is not a token id");
        req.tokens.push_back(id);
        continue;
      }
      auto key = w[i].substr(0, eq), value = w[i].substr(eq + 1);
      int64_t n = 0;
      double x = 0;
      if (key == "max_tokens" && parse_int(value, n)) {
        req.max_tokens = n;
      } else if (key == "top_k" && parse_int(value, n)) {
        req.sampling.top_k = n;
      } else if (key == "seed" && parse_int(value, n) && n >= 0) {
        req.sampling.seed = static_cast<uint64_t>(n);
      } else if (key == "temperature" && parse_double(value, x)) {
        req.sampling.temperature = x;
      } else if (key == "top_p" && parse_double(value, x)) {
        req.sampling.top_p = x;
      } else {
        return fail("bad argument '" + w[i] + "' (max_tokens, temperature, top_k, top_p, seed)");
      }
    }
    if (req.tokens.empty()) return fail("infer needs at least one token id");
    auto r = ask<infer_reply>(opts_.infer_timeout, infer_atom_v, req);
    if (!r) return fail(render(r.error()));
    std::string tokens;
    for (auto t : r->tokens) tokens += (tokens.empty() ? "" : " ") + std::to_string(t);
    return {fmt::format(
        "{}\nqueue {:.1f} ms, swap {:.1f} ms, compute {:.1f} ms, total {:.1f} ms{}\n", tokens,
        r->queue_ms, r->load_ms, r->compute_ms, r->total_ms, r->swapped ? " (swapped in)" : "")};
  }

  outcome stats() {
    auto ms = ask<std::vector<model_info>>(opts_.timeout, list_atom_v);
    if (!ms) return fail(render(ms.error()));
    auto ds = ask<std::vector<device_report>>(opts_.timeout, devices_atom_v);
    if (!ds) return fail(render(ds.error()));
    auto rep = ask<caf::settings>(opts_.timeout, report_atom_v);
    if (!rep) return fail(render(rep.error()));
    std::string out;
    if (auto recent = caf::get_if<caf::settings>(&*rep, "recent")) {
      auto num = [&](const char* key) {
        auto i = recent->find(key);
        if (i == recent->end()) return 0.0;
        auto& d = i->second.get_data();
        if (auto x = caf::get_if<double>(&d)) return *x;
        if (auto x = caf::get_if<int64_t>(&d)) return static_cast<double>(*x);
        return 0.0;
      };
      out += fmt::format(
          "last {:.0f} s: {:.0f} requests ({:.0f} ok, {:.0f} failed), {:.2f} req/s, latency p50 "
          "{:.1f} ms, p90 {:.1f} ms, p99 {:.1f} ms\n",
          num("window-s"), num("requests"), num("ok"), num("failed"), num("throughput-rps"),
          num("p50-ms"), num("p90-ms"), num("p99-ms"));
    }
    out += fmt::format("{:<20} {:>8} {:>6} {:>9}\n", "model", "served", "loads", "evictions");
    for (auto& m : *ms)
      out +=
          fmt::format("{:<20} {:>8} {:>6} {:>9}\n", m.config.name, m.served, m.loads, m.evictions);
    out += fmt::format("{:>3} {:>6} {:>10} {:>9}\n", "dev", "loads", "GiB moved", "load GB/s");
    for (auto& d : *ds)
      out += fmt::format(
          "{:>3} {:>6} {:>10.2f} {:>9.2f}\n", d.device, d.loads,
          static_cast<double>(d.bytes_loaded) / (1ull << 30),
          d.load_seconds > 0 ? static_cast<double>(d.bytes_loaded) / d.load_seconds / 1e9 : 0.0);
    return {out};
  }

  outcome policy(const std::string& name) {
    auto p = ask<std::string>(opts_.timeout, policy_atom_v, name);
    if (!p) return fail(render(p.error()));
    return {"eviction policy: " + *p + "\n"};
  }

  outcome trace(bool start, const std::string& path) {
    auto r = ask<std::string>(opts_.timeout, trace_atom_v, start, path);
    if (!r) return fail(render(r.error()));
    return {*r + "\n"};
  }

  outcome watch(const std::vector<std::string>& w) {
    if (w.size() < 2 || w.size() > 4 || (w[1] != "stats" && w[1] != "models"))
      return fail("usage: watch stats|models [SECONDS] [TIMES]");
    double seconds = 2;
    int64_t times = interactive ? 0 : 1;
    if (w.size() >= 3 && (!parse_double(w[2], seconds) || !(seconds >= 0.1) || seconds > 3600))
      return fail("watch: SECONDS must be 0.1..3600");
    if (w.size() == 4 && (!parse_int(w[3], times) || times < 1))
      return fail("watch: TIMES must be a positive count");
    for (int64_t i = 0; times == 0 || i < times; ++i) {
      auto o = w[1] == "stats" ? stats() : models();
      if (o.failed) return o;
      if (interactive) std::cout << "\x1b[H\x1b[2J";  // clear the screen
      std::cout << o.text;
      if (interactive) std::cout << "(every " << seconds << " s; press a key to stop)\n";
      std::cout << std::flush;
      if (i + 1 == times) break;
      if (key_pressed_within(seconds)) break;
    }
    return {};
  }

  /// Waits up to `seconds`; true when a key came (it is consumed). On a terminal the key
  /// needs no Enter; from a pipe this is only a wait.
  bool key_pressed_within(double seconds) const {
    auto ms = static_cast<int>(seconds * 1000);
    if (!interactive) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      return false;
    }
    termios saved{};
    tcgetattr(STDIN_FILENO, &saved);
    auto raw = saved;
    raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO));
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    pollfd p{STDIN_FILENO, POLLIN, 0};
    bool key = ::poll(&p, 1, ms) > 0;
    if (key) {
      char buf[16];
      (void)!::read(STDIN_FILENO, buf, sizeof(buf));
    }
    tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    return key;
  }

 public:
  bool interactive = false;

  /// Model names for completion (refreshed at start and by `models`).
  std::vector<std::string> model_names() {
    auto ms = ask<std::vector<model_info>>(opts_.timeout, list_atom_v);
    std::vector<std::string> out;
    if (ms)
      for (auto& m : *ms) out.push_back(m.config.name);
    return out;
  }

 private:
  caf::actor_system& sys_;
  const console_options& opts_;
  caf::scoped_actor self_;
  controller_actor ctrl_;
  bool lost_ = false;
};

// libedit calls back into plain functions: completion reads these.
std::vector<std::string> completion_words;
size_t completion_index = 0;

const std::vector<std::string> command_words{"help",   "nodes", "devices", "models", "load",
                                             "unload", "pin",   "unpin",   "infer",  "stats",
                                             "policy", "watch", "trace",   "quit"};

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

/// The first word completes to a command; the second to a model name after the
/// commands that take one, or to the sub-commands of watch, trace and policy.
char** complete(const char* text, int start, int) {
  rl_attempted_completion_over = 1;  // never fall back to file names
  auto before = words(std::string{rl_line_buffer, static_cast<size_t>(start)});
  if (before.empty()) {
    completion_words = command_words;
  } else if (before.size() == 1) {
    auto& c = before[0];
    if (c == "watch")
      completion_words = {"stats", "models"};
    else if (c == "trace")
      completion_words = {"start", "stop"};
    else if (c == "policy")
      completion_words = {"lru", "cost"};
    else if (c == "load" || c == "unload" || c == "pin" || c == "unpin" || c == "infer")
      completion_words = model_words;
    else
      completion_words.clear();
  } else {
    completion_words.clear();
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
