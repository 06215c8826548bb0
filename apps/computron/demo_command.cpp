// `computron demo`: its flags, then a short mixed workload against a running server
// (demo.cpp).
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/serve.hpp"
#include "common/error.hpp"
#include "net/client/loadgen.hpp"

namespace computron::app {

namespace {

struct demo_flags {
  demo_options demo;
  std::string url = "http://127.0.0.1:8000";
};

int run(demo_flags f) {
  auto at = net::parse_url(f.url);
  if (!at) {
    std::cerr << "computron demo: " << render(at.error()) << '\n';
    return exit_usage;
  }
  f.demo.host = at->host;
  f.demo.port = at->port;
  return run_demo(f.demo);
}

const registration demo_command{
    {"demo", "send a short mixed workload to a running server; print a summary", 60,
     [](CLI::App& cmd) -> command_run {
       auto f = std::make_shared<demo_flags>();
       auto& demo = f->demo;
       cmd.add_option("--url", f->url, "the server, http://HOST:PORT")->capture_default_str();
       cmd.add_option("--requests", demo.requests, "requests in all")
           ->capture_default_str()
           ->check(CLI::Range(1, 1000000));
       cmd.add_option("--clients", demo.clients, "concurrent clients")
           ->capture_default_str()
           ->check(CLI::Range(1, 256));
       cmd.add_option("--max-tokens", demo.max_tokens, "tokens per request")->capture_default_str();
       cmd.add_option("--seed", demo.seed, "workload seed")->capture_default_str();
       return [f] { return run(*f); };
     }}};

}  // namespace

}  // namespace computron::app
