// `computron console` as an operator scripts it: the real binary attached over CAF to a
// real `computron serve` on 127.0.0.1, its output and exit status.
#include <catch2/catch.hpp>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "net/client/http_client.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// A serve process with two toy models that do not fit together, its console on a free
/// port; `gpulets`, when given, splits its devices (the config's devices.gpulets).
struct controller {
  std::string dir = test::temp_path("console-" + std::to_string(reinterpret_cast<uintptr_t>(this)));
  std::unique_ptr<child_process> proc;
  uint16_t http_port = 0;
  uint16_t console_port = 0;

  /// `adapter`: alpha also serves a LoRA adapter, alpha-lora (toy: a byte of its own per row).
  explicit controller(const json& gpulets = nullptr, bool adapter = false) {
    fs::create_directories(dir);
    auto toy = [](const std::string& name, int seed) {
      return json{{"name", name},      {"kind", "toy"}, {"tp", 2},
                  {"devices", {0, 1}}, {"seed", seed},  {"toy_shard_bytes", 3 << 20}};
    };
    json cfg{{"devices", {{"kind", "emulated"}, {"count", 2}, {"capacity_mb", 4}}},
             {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
             {"console_port", 0},
             {"batching", {{"batch_window_ms", 1}}},
             {"models", {toy("alpha", 1), toy("beta", 2)}}};
    if (adapter)
      cfg["models"].push_back(
          {{"name", "alpha-lora"}, {"base", "alpha"}, {"seed", 3}, {"toy_shard_bytes", 1 << 16}});
    if (!gpulets.is_null()) cfg["devices"]["gpulets"] = gpulets;
    std::ofstream{dir + "/config.json"} << cfg.dump();
    proc = std::make_unique<child_process>(std::vector<std::string>{
        "/usr/bin/timeout", "300", COMPUTRON_BINARY, "serve", "--config", dir + "/config.json"});
    http_port = test::wait_for_port(*proc);
    console_port = test::wait_for_port(*proc);
  }

  ~controller() {
    proc.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  std::string console(const std::string& args) const {
    return "console --connect 127.0.0.1:" + std::to_string(console_port) + " " + args;
  }
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("a scripted console session runs every command against the controller",
          "[apps][console]") {
  controller c;
  auto r = test::run(c.console("-c 'models; devices; nodes; load alpha; pin alpha; models; "
                               "infer alpha 1 2 3 max_tokens=3; unpin alpha; load beta; stats; "
                               "policy; policy cost; policy; unload beta; help'"),
                     true);
  INFO(r.all);
  CHECK(r.exit_code == 0);
  CHECK(count(r.all, "alpha") >= 4);
  CHECK(r.all.find("2x1") != std::string::npos);         // models: tp x pp
  CHECK(r.all.find("emulated:0") != std::string::npos);  // devices
  CHECK(r.all.find("gpu-lets") != std::string::npos);    // devices: none split
  CHECK(count(r.all, " whole ") == 2);
  CHECK(r.all.find("local") != std::string::npos);  // nodes
  CHECK(r.all.find("online") != std::string::npos);
  CHECK(r.all.find("alpha: resident") != std::string::npos);  // load
  CHECK(r.all.find("alpha: pinned") != std::string::npos);    // pin
  CHECK(r.all.find("alpha: unpinned") != std::string::npos);  // unpin
  CHECK(r.all.find("beta: resident") != std::string::npos);   // loaded once alpha unpinned
  CHECK(r.all.find("beta: offloaded") != std::string::npos);  // unload
  CHECK(r.all.find("eviction policy: lru") != std::string::npos);
  CHECK(count(r.all, "eviction policy: cost") == 2);
  CHECK(r.all.find("load GB/s") != std::string::npos);  // stats
  CHECK(r.all.find("req/s, latency p50") != std::string::npos);
  CHECK(r.all.find("(1 ok, 0 failed)") != std::string::npos);  // the one infer so far
  CHECK(r.all.find("idle s") != std::string::npos);
  CHECK(r.all.find("x ckpt") != std::string::npos);     // models: bytes over the checkpoint's
  CHECK(r.all.find("never") != std::string::npos);      // beta, before its load
  CHECK(r.all.find("commands:") != std::string::npos);  // help
  // trace and watch: a fresh timeline holding the next load, a table refreshed twice.
  auto trace_file = c.dir + "/trace.json";
  auto t = test::run(c.console("-c 'trace start; load alpha; trace stop " + trace_file +
                               "; watch models 0.1 2; trace; watch'"),
                     true);
  INFO(t.all);
  CHECK(t.exit_code == 1);  // the last two lack their arguments
  CHECK(t.all.find("tracing from now on") != std::string::npos);
  CHECK(t.all.find("trace written to " + trace_file) != std::string::npos);
  CHECK(count(t.all, "tp*pp") == 2);
  CHECK(t.all.find("usage: trace start | trace stop FILE") != std::string::npos);
  CHECK(t.all.find("usage: watch stats|models") != std::string::npos);
  std::ifstream tf{trace_file};
  auto tj = json::parse(tf, nullptr, false);
  REQUIRE(tj.is_object());
  bool alpha_load = false;
  for (auto& e : tj["traceEvents"])
    alpha_load =
        alpha_load || (e.value("cat", "") == "load" && e.dump().find("alpha") != std::string::npos);
  CHECK(alpha_load);
  // infer prints the tokens the HTTP API gives for the same request, then the split.
  auto http = std::move(net::http_client::connect("127.0.0.1", c.http_port, 5s).value());
  auto body = json{
      {"inputs",
       {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {1, 3}}, {"data", {1, 2, 3}}}}},
      {"parameters", {{"max_tokens", 3}}}};
  auto h = http->request("POST", "/v2/models/alpha/infer", body.dump()).value();
  REQUIRE(h.status == 200);
  auto data = json::parse(h.body)["outputs"][0]["data"];
  auto tokens = std::to_string(data[0].get<int64_t>()) + " " +
                std::to_string(data[1].get<int64_t>()) + " " +
                std::to_string(data[2].get<int64_t>());
  CHECK(r.all.find(tokens + "\nqueue ") != std::string::npos);
  CHECK(r.all.find("compute") != std::string::npos);
}

TEST_CASE("the console loads, serves and unloads a LoRA adapter beside its base",
          "[apps][console][adapters]") {
  controller c{nullptr, true};
  auto r = test::run(c.console("-c 'models; load alpha-lora; models; infer alpha-lora 1 2 3 "
                               "max_tokens=2; infer alpha 1 2 3 max_tokens=2; unload alpha; "
                               "models'"),
                     true);
  INFO(r.all);
  CHECK(r.exit_code == 0);
  // Its base is listed beside it; loading it brings the base; evicting the base takes it.
  CHECK(r.all.find("adapter of") != std::string::npos);
  CHECK(r.all.find("alpha-lora: resident") != std::string::npos);
  CHECK(r.all.find("alpha: offloaded") != std::string::npos);
  auto last = r.all.rfind("alpha-lora ");
  REQUIRE(last != std::string::npos);
  auto line = r.all.substr(last, r.all.find('\n', last) - last);
  CHECK(line.find("offloaded") != std::string::npos);
  CHECK(line.find(" alpha") != std::string::npos);
  // The adapter's tokens differ from its base's for the same prompt.
  auto first = r.all.find("\nqueue ");
  auto second = r.all.find("\nqueue ", first + 1);
  REQUIRE(second != std::string::npos);
  auto tokens_before = [&](size_t at) {
    auto start = r.all.rfind('\n', at - 1);
    return r.all.substr(start + 1, at - start - 1);
  };
  CHECK(tokens_before(first) != tokens_before(second));
}

TEST_CASE("the console's devices view shows each device's gpu-lets", "[apps][console]") {
  controller c{json::parse("[[50, 50], [100]]")};
  auto r = test::run(c.console("-c 'devices'"), true);
  INFO(r.all);
  CHECK(r.exit_code == 0);
  // The row of each device (the table right-aligns its index in 3 columns).
  auto row = [&](const std::string& dev) {
    std::istringstream in{r.all};
    for (std::string line; std::getline(in, line);)
      if (line.rfind(dev + " ", 0) == 0) return line;
    return std::string{};
  };
  CHECK(row("dev").find("gpu-lets") != std::string::npos);
  CHECK(row("  0").find(" 50%,50% ") != std::string::npos);
  CHECK(row("  1").find(" whole ") != std::string::npos);
}

TEST_CASE("console failures are clear and make the exit status non-zero", "[apps][console]") {
  controller c;
  auto bad = test::run(c.console("-c 'models; bogus; load; load nope; infer alpha x; "
                                 "infer alpha 1 max_tokens=zero; policy fifo; models'"),
                       true);
  INFO(bad.all);
  CHECK(bad.exit_code == 1);
  CHECK(bad.all.find("error: unknown command 'bogus'") != std::string::npos);
  CHECK(bad.all.find("error: usage: load MODEL") != std::string::npos);
  CHECK(bad.all.find("nope") != std::string::npos);
  CHECK(bad.all.find("'x' is not a token id") != std::string::npos);
  CHECK(bad.all.find("bad argument 'max_tokens=zero'") != std::string::npos);
  CHECK(bad.all.find("fifo") != std::string::npos);
  CHECK(count(bad.all, "beta") == 2);  // the session went on after each failure
  auto unreachable = test::run("console --connect 127.0.0.1:1 -c models", true);
  CHECK(unreachable.exit_code == 3);
  CHECK(unreachable.all.find("cannot reach the controller at 127.0.0.1:1") != std::string::npos);
  auto garbled = test::run("console --connect nowhere -c models", true);
  CHECK(garbled.exit_code == 2);
}

TEST_CASE("console commands from a pipe stop at quit", "[apps][console]") {
  controller c;
  auto out = c.dir + "/out.txt";
  auto cmd = std::string{"printf 'models\\nquit\\nmodels\\n' | timeout 60 "} + COMPUTRON_BINARY +
             " " + c.console("") + " > " + out + " 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in{out};
  std::stringstream text;
  text << in.rdbuf();
  INFO(text.str());
  CHECK(count(text.str(), "alpha") == 1);
}

TEST_CASE("the console reports a controller that died and stays usable", "[apps][console]") {
  auto c = std::make_unique<controller>();
  auto out = c->dir + "-died.txt";
  auto cmd =
      std::string{"timeout 60 "} + COMPUTRON_BINARY + " " + c->console("") + " > " + out + " 2>&1";
  FILE* console = ::popen(cmd.c_str(), "w");
  REQUIRE(console != nullptr);
  std::fputs("models\n", console);
  std::fflush(console);
  // Kill the controller once the console has answered the first command (it attaches
  // first; under the sanitizers that takes a while).
  auto read_out = [&] {
    std::ifstream in{out};
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  auto until = std::chrono::steady_clock::now() + 60s;
  while (read_out().find("alpha") == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(100ms);
  REQUIRE(read_out().find("alpha") != std::string::npos);
  c->proc->signal(SIGKILL);
  std::this_thread::sleep_for(500ms);
  std::fputs("models\nhelp\n", console);
  std::fflush(console);
  int status = ::pclose(console);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  std::ifstream in{out};
  std::stringstream text;
  text << in.rdbuf();
  INFO(text.str());
  CHECK(count(text.str(), "alpha") == 1);
  CHECK(text.str().find("connection to the controller was lost") != std::string::npos);
  CHECK(text.str().find("commands:") != std::string::npos);
  std::error_code ec;
  fs::remove(out, ec);
}

TEST_CASE("the interactive console completes commands and model names and keeps history",
          "[apps][console]") {
  controller c;
  auto home = c.dir + "/home";
  fs::create_directories(home);
  int master = -1;
  pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("TERM", "xterm", 1);
    ::setenv("HOME", home.c_str(), 1);
    ::setenv("COMPUTRON_LOG_LEVEL", "warn", 1);
    auto connect = "127.0.0.1:" + std::to_string(c.console_port);
    ::execl(COMPUTRON_BINARY, COMPUTRON_BINARY, "console", "--connect", connect.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string seen;
  // Reads what the console printed until `what` appears or 20 s passed.
  auto wait_for = [&](const std::string& what) {
    auto until = std::chrono::steady_clock::now() + 20s;
    while (seen.find(what) == std::string::npos && std::chrono::steady_clock::now() < until) {
      pollfd p{master, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      auto n = ::read(master, buf, sizeof(buf));
      if (n <= 0) break;
      seen.append(buf, static_cast<size_t>(n));
    }
    return seen.find(what) != std::string::npos;
  };
  auto type = [&](const std::string& keys) {
    REQUIRE(::write(master, keys.data(), keys.size()) == static_cast<ssize_t>(keys.size()));
  };
  REQUIRE(wait_for("computron> "));
  // "mod<TAB>" completes to models.
  type("mod\t\r");
  REQUIRE(wait_for("tp*pp"));
  CHECK(wait_for("beta"));
  // "load al<TAB>" completes the model name.
  seen.clear();
  type("load al\t\r");
  CHECK(wait_for("alpha: resident"));
  // Up arrow twice brings back "models" from the history.
  seen.clear();
  type("\x1b[A\x1b[A\r");
  CHECK(wait_for("tp*pp"));
  type("quit\r");
  int status = 0;
  auto until = std::chrono::steady_clock::now() + 20s;
  while (::waitpid(pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < until) {
    // Drain the pty so the console never blocks writing to it.
    pollfd p{master, POLLIN, 0};
    char buf[4096];
    if (::poll(&p, 1, 100) > 0 && ::read(master, buf, sizeof(buf)) <= 0)
      std::this_thread::sleep_for(50ms);
  }
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  ::close(master);
  CHECK(WIFEXITED(status));
  // History is kept in the home folder for the next session.
  std::ifstream hist{home + "/.computron_history"};
  std::stringstream h;
  h << hist.rdbuf();
  // (libedit's format writes a space as \040.)
  CHECK(h.str().find("load") != std::string::npos);
  CHECK(h.str().find("alpha") != std::string::npos);
  CHECK(h.str().find("models") != std::string::npos);
}
