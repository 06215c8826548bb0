// The console's session: the command table, and each command's request to the controller
// and how its answer prints.
#include "apps/computron/console_session.hpp"

#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <iostream>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "common/error.hpp"
#include "net/cluster.hpp"

namespace computron::app::console {

using namespace computron::actors;

std::vector<std::string> words(const std::string& line) {
  std::istringstream in{line};
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

namespace {

constexpr double mib = 1048576.0;

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

/// "'CMD' takes no such arguments; see help".
outcome no_such_arguments(const std::string& cmd) {
  return fail("'" + cmd + "' takes no such arguments; see help");
}

/// The help text from the table: each line's forms, then its help from the 32nd column
/// (on a line of its own after forms too long for the column).
std::string help_text() {
  std::vector<std::pair<std::string, std::string>> lines;
  for (auto& c : session::commands()) {
    std::string forms;
    for (auto& a : c.args)
      forms += (forms.empty() ? "" : " | ") + c.name + (a.empty() ? "" : " " + a);
    if (c.help.empty() && !lines.empty())
      lines.back().first += " | " + forms;
    else
      lines.emplace_back(forms, c.help);
  }
  constexpr size_t column = 29;
  const std::string indent(column + 2, ' ');
  std::string out = "commands:\n";
  for (auto& [forms, help] : lines) {
    out += "  " + forms;
    out += forms.size() < column ? std::string(column - forms.size(), ' ') : "\n" + indent;
    std::istringstream text{help};
    bool first = true;
    for (std::string line; std::getline(text, line); first = false)
      out += (first ? "" : indent) + line + "\n";
  }
  return out;
}

/// Each device's gpu-lets from the status report's manager section ("gpulets": per device
/// the shares of its compute lanes): "whole" for a device not split, else its shares like
/// "50%,50%". Empty when the report holds none (the devices view then shows "-").
std::vector<std::string> gpulet_cells(const caf::settings& report) {
  std::vector<std::string> out;
  auto parts = caf::get_if(&report, "manager.gpulets");
  if (!parts) return out;
  auto devices = caf::get_if<caf::config_value::list>(&parts->get_data());
  if (!devices) return out;
  for (auto& d : *devices) {
    std::vector<int64_t> shares;
    if (auto lanes = caf::get_if<caf::config_value::list>(&d.get_data()))
      for (auto& l : *lanes)
        if (auto x = caf::get_if<int64_t>(&l.get_data())) shares.push_back(*x);
    std::string cell;
    for (auto x : shares) cell += fmt::format("{}{}%", cell.empty() ? "" : ",", x);
    out.push_back(shares == std::vector<int64_t>{100} ? "whole" : cell.empty() ? "-" : cell);
  }
  return out;
}

}  // namespace

session::session(caf::actor_system& sys, const console_options& opts)
    : sys_(sys), opts_(opts), self_(sys) {}

caf::error session::connect() {
  auto addr = net::parse_node_address(opts_.connect);
  if (!addr) return addr.error();
  auto r = opts_.tls.enabled()
               ? caf::openssl::remote_actor<controller_actor>(sys_, addr->host, addr->port)
               : caf::io::remote_actor<controller_actor>(sys_, addr->host, addr->port);
  if (!r)
    return make_error(ec::unavailable,
                      "cannot reach the controller at " + opts_.connect + ": " + render(r.error()));
  ctrl_ = *r;
  self_->monitor(ctrl_);
  lost_ = false;
  return {};
}

outcome session::run(const std::string& line) {
  auto w = words(line);
  if (w.empty()) return {};
  const auto* c = find_command(w[0]);
  if (c && !c->remote) return c->run(*this, w);
  if (auto err = alive()) return fail(render(err));
  if (!c) return fail("unknown command '" + w[0] + "'; type help");
  return c->run(*this, w);
}

const console_command* session::find_command(std::string name) {
  if (name == "exit") name = "quit";  // as shells take it; neither listed nor completed
  for (auto& c : commands())
    if (c.name == name) return &c;
  return nullptr;
}

caf::error session::alive() {
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
caf::expected<T> session::ask(std::chrono::milliseconds timeout, Ts... xs) {
  caf::expected<T> out{caf::error{}};
  self_->request(ctrl_, caf::timespan{timeout}, xs...)
      .receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
  if (!out &&
      (out.error() == caf::sec::request_timeout || out.error() == caf::sec::request_receiver_down))
    lost_ = true;  // try a reconnect before the next command
  return out;
}

outcome session::models() {
  auto ms = ask<std::vector<model_info>>(opts_.timeout, list_atom_v);
  if (!ms) return fail(render(ms.error()));
  // "x ckpt": bytes on the devices over the checkpoint's (what a swap moves per byte of
  // weights; above 1 only by what the ranks replicate).
  // "adapter of": a LoRA adapter's base (it loads after it and goes with it).
  std::string out = fmt::format(
      "{:<20} {:<12} {:>5} {:>10} {:>7} {:>6} {:>6} {:>8} {:>9} {:>6}  {}\n", "model", "state",
      "tp*pp", "MiB", "KV MiB", "x ckpt", "queued", "served", "idle s", "pinned", "adapter of");
  for (auto& m : *ms)
    out += fmt::format(
        "{:<20} {:<12} {:>5} {:>10.1f} {:>7.1f} {:>6} {:>6} {:>8} {:>9} {:>6}  {}\n", m.config.name,
        to_string(m.state), fmt::format("{}x{}", m.config.tp, m.config.pp),
        static_cast<double>(m.bytes) / mib, static_cast<double>(m.kv_bytes) / mib,
        m.weight_bytes > 0 ? fmt::format("{:.3f}", static_cast<double>(m.bytes) / m.weight_bytes)
                           : std::string{"-"},
        m.queued, m.served, m.idle_s < 0 ? std::string{"never"} : fmt::format("{:.1f}", m.idle_s),
        m.config.pinned ? "yes" : "no", m.config.base.empty() ? "-" : m.config.base);
  return {out};
}

outcome session::devices(bool by_node) {
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
  // The gpu-lets come from the manager's status report; without it the table still shows
  // (its column then reads "-").
  std::vector<std::string> lets;
  if (auto rep = ask<caf::settings>(opts_.timeout, report_atom_v)) lets = gpulet_cells(*rep);
  out = fmt::format("{:>3} {:<22} {:<14} {:>16} {:>7} {:>9} {:<12} {}\n", "dev", "node", "name",
                    "used/total MiB", "KV MiB", "link GB/s", "gpu-lets", "resident");
  for (auto& d : *ds) {
    std::string resident;
    for (auto& r : d.resident) resident += (resident.empty() ? "" : ",") + r;
    auto at = static_cast<size_t>(d.device);
    out += fmt::format("{:>3} {:<22} {:<14} {:>16} {:>7.1f} {:>9.2f} {:<12} {}\n", d.device, d.node,
                       d.name,
                       fmt::format("{:.0f}/{:.0f}", static_cast<double>(d.used_bytes) / mib,
                                   static_cast<double>(d.capacity_bytes) / mib),
                       static_cast<double>(d.kv_bytes) / mib, d.link_gbps,
                       d.device >= 0 && at < lets.size() ? lets[at] : std::string{"-"},
                       d.online ? resident : std::string{"(offline)"});
  }
  return {out};
}

outcome session::residency(bool load, const std::string& model) {
  auto i = load ? ask<model_info>(opts_.infer_timeout, load_atom_v, model)
                : ask<model_info>(opts_.infer_timeout, unload_atom_v, model);
  if (!i) return fail(render(i.error()));
  return {fmt::format("{}: {}\n", i->config.name, to_string(i->state))};
}

outcome session::pin(const std::string& model, bool on) {
  auto r = ask<residency_report>(opts_.timeout, pin_atom_v, model, on);
  if (!r) return fail(render(r.error()));
  return {fmt::format("{}: {} ({})\n", r->model, r->pinned ? "pinned" : "unpinned",
                      to_string(r->state))};
}

outcome session::infer(const std::vector<std::string>& w) {
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
  return {fmt::format("{}\nqueue {:.1f} ms, swap {:.1f} ms, compute {:.1f} ms, total {:.1f} ms{}\n",
                      tokens, r->queue_ms, r->load_ms, r->compute_ms, r->total_ms,
                      r->swapped ? " (swapped in)" : "")};
}

outcome session::stats() {
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
    out += fmt::format("{:<20} {:>8} {:>6} {:>9}\n", m.config.name, m.served, m.loads, m.evictions);
  out += fmt::format("{:>3} {:>6} {:>10} {:>9}\n", "dev", "loads", "GiB moved", "load GB/s");
  for (auto& d : *ds)
    out += fmt::format(
        "{:>3} {:>6} {:>10.2f} {:>9.2f}\n", d.device, d.loads,
        static_cast<double>(d.bytes_loaded) / (1ull << 30),
        d.load_seconds > 0 ? static_cast<double>(d.bytes_loaded) / d.load_seconds / 1e9 : 0.0);
  return {out};
}

outcome session::policy(const std::string& name) {
  auto p = ask<std::string>(opts_.timeout, policy_atom_v, name);
  if (!p) return fail(render(p.error()));
  return {"eviction policy: " + *p + "\n"};
}

outcome session::trace(bool start, const std::string& path) {
  auto r = ask<std::string>(opts_.timeout, trace_atom_v, start, path);
  if (!r) return fail(render(r.error()));
  return {*r + "\n"};
}

outcome session::watch(const std::vector<std::string>& w) {
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

bool session::key_pressed_within(double seconds) const {
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

std::vector<std::string> session::model_names() {
  auto ms = ask<std::vector<model_info>>(opts_.timeout, list_atom_v);
  std::vector<std::string> out;
  if (ms)
    for (auto& m : *ms) out.push_back(m.config.name);
  return out;
}

const std::vector<console_command>& session::commands() {
  using args = std::vector<std::string>;
  static const std::vector<console_command> table{
      {"help",
       {""},
       "this list",
       false,
       false,
       {},
       [](session&, const args&) { return outcome{help_text()}; }},
      {"nodes",
       {""},
       "nodes and whether they answer",
       true,
       false,
       {},
       [](session& s, const args& w) {
         return w.size() == 1 ? s.devices(true) : no_such_arguments(w[0]);
       }},
      {"devices",
       {""},
       "memory used/total, link GB/s, gpu-lets, resident shards",
       true,
       false,
       {},
       [](session& s, const args& w) {
         return w.size() == 1 ? s.devices(false) : no_such_arguments(w[0]);
       }},
      {"models",
       {""},
       "state, tp x pp, bytes (and over the checkpoint's), queue,\nserved, idle, pinned",
       true,
       false,
       {},
       [](session& s, const args& w) {
         return w.size() == 1 ? s.models() : no_such_arguments(w[0]);
       }},
      {"load",
       {"M"},
       "make model M resident now, or evict it",
       true,
       true,
       {},
       [](session& s, const args& w) {
         return w.size() == 2 ? s.residency(true, w[1]) : fail("usage: load MODEL");
       }},
      {"unload",
       {"M"},
       "",
       true,
       true,
       {},
       [](session& s, const args& w) {
         return w.size() == 2 ? s.residency(false, w[1]) : fail("usage: unload MODEL");
       }},
      {"pin",
       {"M"},
       "never evict M, or allow it again",
       true,
       true,
       {},
       [](session& s, const args& w) {
         return w.size() == 2 ? s.pin(w[1], true) : fail("usage: pin MODEL");
       }},
      {"unpin",
       {"M"},
       "",
       true,
       true,
       {},
       [](session& s, const args& w) {
         return w.size() == 2 ? s.pin(w[1], false) : fail("usage: unpin MODEL");
       }},
      {"infer",
       {"M ID... [max_tokens=N] [temperature=T] [top_k=K] [top_p=P] [seed=S]"},
       "generate; prints the tokens and the time split",
       true,
       true,
       {},
       [](session& s, const args& w) { return s.infer(w); }},
      {"stats",
       {""},
       "req/s and latency (last minute); served, swaps, GB/s",
       true,
       false,
       {},
       [](session& s, const args& w) {
         return w.size() == 1 ? s.stats() : no_such_arguments(w[0]);
       }},
      {"policy",
       {"[lru|cost]"},
       "show or switch the eviction policy",
       true,
       false,
       {"lru", "cost"},
       [](session& s, const args& w) {
         return w.size() <= 2 ? s.policy(w.size() == 2 ? w[1] : std::string{})
                              : no_such_arguments(w[0]);
       }},
      {"watch",
       {"stats|models [S] [N]"},
       "refresh every S seconds (2) until a key is pressed,\nor N times (from a pipe: once unless "
       "N is given)",
       true,
       false,
       {"stats", "models"},
       [](session& s, const args& w) { return s.watch(w); }},
      {"trace",
       {"start", "stop F"},
       "start a fresh timeline; write it to F (a Chrome\ntrace, on the controller's machine)",
       true,
       false,
       {"start", "stop"},
       [](session& s, const args& w) {
         if (w.size() == 2 && w[1] == "start") return s.trace(true, {});
         if (w.size() == 3 && w[1] == "stop") return s.trace(false, w[2]);
         return fail("usage: trace start | trace stop FILE");
       }},
      {"quit",
       {""},
       "leave",
       false,
       false,
       {},
       [](session&, const args&) {
         return outcome{"", false, true};
       }},
  };
  return table;
}

}  // namespace computron::app::console
