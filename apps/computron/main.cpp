// `computron`: one binary, subcommands (`computron help` lists them): serve, node,
// console, demo, loadgen, sim, generate, bench and devices.
#include <dlfcn.h>
#include <execinfo.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/computron/bench_cli.hpp"
#include "apps/computron/console.hpp"
#include "apps/computron/loadgen.hpp"
#include "apps/computron/serve.hpp"
#include "apps/computron/sim_cli.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/backends.hpp"
#include "net/client/loadgen.hpp"
#include "serve/overrides.hpp"

namespace {

using namespace computron;

constexpr int exit_failure = 1;
constexpr int exit_usage = 2;

uint64_t mib_to_bytes(double mib) {
  return static_cast<uint64_t>(std::llround(mib * 1048576.0));
}

int run_devices(const gpu::device_options& opts, bool json) {
  auto devs = gpu::open_devices(opts);
  if (!devs) {
    std::cerr << "computron devices: " << render(devs.error()) << '\n';
    return exit_failure;
  }
  nlohmann::json list = nlohmann::json::array();
  for (auto& d : *devs) {
    auto& i = d->info();
    if (json) {
      list.push_back({{"name", i.name},
                      {"kind", gpu::to_string(i.kind)},
                      {"ordinal", i.ordinal},
                      {"capacity_bytes", i.capacity_bytes},
                      {"link_gbps", i.link_gbps}});
    } else {
      std::cout << fmt::format(
          "{:<32} {:>10.2f} GiB  link {}\n", i.name,
          static_cast<double>(i.capacity_bytes) / (1ull << 30),
          i.link_gbps > 0 ? fmt::format("{:.2f} GB/s", i.link_gbps) : std::string{"not measured"});
    }
  }
  if (json) std::cout << list.dump() << '\n';
  return 0;
}

}  // namespace

namespace {

/// A crash report on stderr before the process dies: where, not just "Segmentation
/// fault", so a crash on a machine without a debugger still says where it happened. It
/// runs on its own stack (a stack overflow still reports) and also names the faulting
/// address, the instruction pointer and the return addresses found on the stack: when
/// the crash jumped to a bad address, backtrace() stops at the signal frame and those
/// words are the only trace of the caller.
void report_crash(int sig, siginfo_t* info, void* context) {
  char line[256];
  auto say = [&](const char* text) { (void)!::write(2, text, std::strlen(text)); };
  auto name = [&](const char* what, const void* addr) {
    Dl_info di{};
    if (::dladdr(addr, &di) != 0 && di.dli_fname != nullptr) {
      auto off = static_cast<const char*>(addr) - static_cast<const char*>(di.dli_fbase);
      std::snprintf(line, sizeof line, "  %s %p %s+0x%tx (%s)\n", what, addr, di.dli_fname, off,
                    di.dli_sname != nullptr ? di.dli_sname : "?");
    } else {
      std::snprintf(line, sizeof line, "  %s %p\n", what, addr);
    }
    say(line);
  };
  std::snprintf(line, sizeof line, "computron: fatal signal %d (%s), address %p\n", sig,
                strsignal(sig), info != nullptr ? info->si_addr : nullptr);
  say(line);
#if defined(__x86_64__) && defined(__linux__)
  if (context != nullptr) {
    auto* uc = static_cast<ucontext_t*>(context);
    auto rip = reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
    auto* rsp = reinterpret_cast<void**>(uc->uc_mcontext.gregs[REG_RSP]);
    name("instruction", rip);
    // Words on the stack that point into loaded code are candidate return addresses.
    for (int i = 0; i < 64 && rsp != nullptr; ++i) {
      Dl_info di{};
      if (::dladdr(rsp[i], &di) != 0 && di.dli_fname != nullptr) name("stack word", rsp[i]);
    }
  }
#else
  (void)context;
#endif
  void* frames[64];
  int n = ::backtrace(frames, 64);
  say("backtrace:\n");
  ::backtrace_symbols_fd(frames, n, 2);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_crash_report() {
  static std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = report_crash;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::sigaction(sig, &sa, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  install_crash_report();
  CLI::App app{
      "Computron: serve many large models from limited GPU memory by swapping them, "
      "sharded, over every GPU's link at once."};
  app.set_version_flag("--version", "computron 0.1.0");
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "debug, info, warn, error or off (default: $COMPUTRON_LOG_LEVEL or info)")
      ->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}));

  app::bench_cli bench_commands{app};

  // devices
  auto devices_cmd = app.add_subcommand("devices", "list the devices this process would use");
  gpu::device_options dev_opts;
  bool devices_json = false;
  devices_cmd->add_option("--kind", dev_opts.kind, "auto, emulated or cuda")
      ->check(CLI::IsMember({"auto", "emulated", "cuda"}))
      ->capture_default_str();
  devices_cmd->add_option("--count", dev_opts.count, "number of devices (0: all GPUs / 1)")
      ->capture_default_str();
  devices_cmd->add_flag("--json", devices_json, "print a JSON array");

  // serve
  auto serve_cmd =
      app.add_subcommand("serve", "serve the models of a repository over HTTP (KServe v2)");
  serve::serve_overrides serve_flags;
  serve_cmd->add_option("--config", serve_flags.config_path,
                        "JSON serve config (default: built-in, see configs/)");
  serve_cmd->add_option("--repository", serve_flags.repository,
                        "model repository folder (one folder per model), or one model's "
                        "folder (it holds config.json); served instead of the config's "
                        "`repository`, beside its inline `models` (without --config, instead "
                        "of the built-in models)");
  serve_cmd->add_option("--host", serve_flags.host, "address to listen on (default 127.0.0.1)");
  serve_cmd
      ->add_option("--port", serve_flags.port,
                   "port to listen on (default 8000; 0 picks a free one)")
      ->check(CLI::Range(0, 65535));
  serve_cmd
      ->add_option("--devices", serve_flags.devices, "number of devices (overrides the config)")
      ->check(CLI::Range(1, 1024));
  serve_cmd
      ->add_option("--capacity-mb", serve_flags.capacity_mb,
                   "memory of each emulated device, MiB (the config's devices.capacity_mb; "
                   "refused unless devices.kind is emulated)")
      ->check(CLI::Range(1.0, 1024.0 * 1024 * 1024));
  serve_cmd->add_option("--trace", serve_flags.trace_file,
                        "write a Chrome trace of loads and batches here at exit");
  serve_cmd->add_option("--api-key", serve_flags.api_key,
                        "require `Authorization: Bearer KEY` on every route but /health, "
                        "/v2/health/* and /metrics (default: $COMPUTRON_API_KEY; none: open)");

  serve_cmd->add_option("--nodes", serve_flags.nodes,
                        "serve with these nodes, host:port,... (`computron node` on each)");
  auto add_tls = [](CLI::App* cmd, net::tls_options& tls) {
    cmd->add_option("--tls-certificate", tls.certificate, "PEM certificate (TLS to peers)");
    cmd->add_option("--tls-key", tls.key, "PEM private key of the certificate");
    cmd->add_option("--tls-cafile", tls.cafile, "PEM CA that signed the peers' certificates");
  };
  add_tls(serve_cmd, serve_flags.tls);

  // node
  auto node_cmd = app.add_subcommand(
      "node", "run this machine's devices and shard workers for a controller (serve --nodes)");
  app::node_options node;
  node.devices.kind = "auto";
  node.devices.count = 2;
  double node_capacity_mb = 256, node_link = 2.0;
  node_cmd->add_option("--host", node.host, "address to listen on")->capture_default_str();
  node_cmd->add_option("--port", node.port, "port to listen on (0 picks a free one)")
      ->capture_default_str();
  node_cmd->add_option("--kind", node.devices.kind, "auto, emulated or cuda")
      ->capture_default_str();
  node_cmd->add_option("--devices", node.devices.count, "number of devices")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  node_cmd->add_option("--capacity-mb", node_capacity_mb, "emulated: memory per device")
      ->capture_default_str();
  node_cmd->add_option("--link-gbps", node_link, "emulated: link rate per device")
      ->capture_default_str();
  node_cmd->add_flag("--insecure-public", node.insecure_public,
                     "allow a non-loopback address without TLS (anyone reaching the port "
                     "controls the node)");
  add_tls(node_cmd, node.tls);

  serve_cmd
      ->add_option("--console-port", serve_flags.console_port,
                   "console port on 127.0.0.1 (default 4242; 0 picks one; -1 turns it off)")
      ->check(CLI::Range(-1, 65535));

  // console
  auto console_cmd = app.add_subcommand(
      "console", "attach to a running controller (serve) and run commands; `help` lists them");
  app::console_options console;
  console_cmd->add_option("--connect", console.connect, "the controller's console port")
      ->capture_default_str();
  console_cmd->add_option("-c,--commands", console.commands,
                          "run these commands (separated by ';') and exit");
  add_tls(console_cmd, console.tls);

  // demo
  auto demo_cmd = app.add_subcommand(
      "demo", "send a short mixed workload to a running server; print a summary");
  app::demo_options demo;
  std::string demo_url = "http://127.0.0.1:8000";
  demo_cmd->add_option("--url", demo_url, "the server, http://HOST:PORT")->capture_default_str();
  demo_cmd->add_option("--requests", demo.requests, "requests in all")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  demo_cmd->add_option("--clients", demo.clients, "concurrent clients")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  demo_cmd->add_option("--max-tokens", demo.max_tokens, "tokens per request")
      ->capture_default_str();
  demo_cmd->add_option("--seed", demo.seed, "workload seed")->capture_default_str();

  // loadgen
  auto lg_cmd = app.add_subcommand(
      "loadgen",
      "open- or closed-loop workload against a running server; latency report (TTFT, TPOT, "
      "ITL and goodput for models with a tokenizer)");
  app::loadgen_cli lg;
  double lg_alpha = 0, lg_total = 0;
  lg_cmd->add_option("--url", lg.url, "server, http://HOST:PORT")->capture_default_str();
  lg_cmd->add_option("--models", lg.models, "comma list of models (default: all the server has)");
  lg_cmd->add_option("--rates", lg.rates, "requests/s per model, comma list (default 1 each)");
  lg_cmd->add_option("--cv", lg.cv, "coefficient of variation of the gaps (1 Poisson, 4 bursty)")
      ->capture_default_str();
  lg_cmd->add_option("--duration", lg.duration_s, "seconds of arrivals")->capture_default_str();
  lg_cmd->add_option("--seed", lg.seed, "seed of arrivals and prompts")->capture_default_str();
  lg_cmd->add_option("--trace", lg.trace,
                     "replay a CSV trace: time_s,model[,prompt_len[,max_tokens]]");
  auto lg_alpha_opt =
      lg_cmd->add_option("--power-law", lg_alpha, "skew rates as (i+1)^-ALPHA over the models");
  auto lg_total_opt =
      lg_cmd->add_option("--total-rate", lg_total, "requests/s over all models (uniform alone)");
  lg_cmd
      ->add_option("--prompt-len", lg.prompt_len,
                   "prompt tokens per request (the mean of --prompt-dist; completions: 32)")
      ->capture_default_str();
  lg_cmd
      ->add_option("--max-tokens", lg.max_tokens,
                   "tokens generated per request (the mean of --output-dist; completions: 16)")
      ->capture_default_str();
  lg_cmd->add_option("--slo", lg.slo_s,
                     "latency SLO in seconds for the attainment figure (and goodput's E2EL)");
  lg_cmd->add_flag("--drop-late", lg.drop_late,
                   "send the SLO as each request's deadline, asking to be refused rather than "
                   "answered late (needs --slo)");
  lg_cmd->add_flag("--json", lg.json, "print the summary as one JSON object");
  lg_cmd->add_option("--report", lg.report_dir,
                     "write summary.json, requests.csv and SVG plots into this folder");
  lg_cmd->add_option("--max-connections", lg.max_connections, "keep-alive connections at most")
      ->capture_default_str();
  lg_cmd->add_option("--wait-ready", lg.wait_ready_s, "seconds to wait for a ready server")
      ->capture_default_str();
  lg_cmd->add_option("--timeout", lg.timeout_s, "seconds before one request counts as failed")
      ->capture_default_str();
  bool lg_no_progress = false;
  lg_cmd->add_flag("--no-progress", lg_no_progress, "no progress bar on stderr");
  app::add_llm_flags(*lg_cmd, lg);

  // sim
  auto sim_cmd = app.add_subcommand(
      "sim", "simulate a serve config under a loadgen workload (no server, no weights)");
  app::sim_cli sim;
  double sim_alpha = 0, sim_total = 0;
  sim_cmd->add_option("--config", sim.config, "serve config (default: serve's built-in one)");
  sim_cmd->add_option("--repository", sim.repository, "model repository folder");
  sim_cmd->add_option("--models", sim.workload.models, "comma list of models (default: all)");
  sim_cmd->add_option("--rates", sim.workload.rates, "requests/s per model, comma list");
  sim_cmd->add_option("--cv", sim.workload.cv, "coefficient of variation of the gaps")
      ->capture_default_str();
  sim_cmd->add_option("--duration", sim.workload.duration_s, "seconds of arrivals")
      ->capture_default_str();
  sim_cmd->add_option("--seed", sim.workload.seed, "seed of arrivals")->capture_default_str();
  sim_cmd->add_option("--trace", sim.workload.trace, "replay a CSV trace");
  auto sim_alpha_opt =
      sim_cmd->add_option("--power-law", sim_alpha, "skew rates as (i+1)^-ALPHA over the models");
  auto sim_total_opt = sim_cmd->add_option("--total-rate", sim_total, "requests/s over all models");
  sim_cmd->add_option("--prompt-len", sim.workload.prompt_len, "prompt tokens per request")
      ->capture_default_str();
  sim_cmd->add_option("--max-tokens", sim.workload.max_tokens, "tokens generated per request")
      ->capture_default_str();
  sim_cmd->add_option("--slo", sim.workload.slo_s, "latency SLO in seconds");
  sim_cmd->add_flag("--drop-late", sim.workload.drop_late,
                    "the SLO is each request's deadline, refused rather than served late "
                    "(needs --slo)");
  sim_cmd->add_flag("--json", sim.workload.json, "print the summary as one JSON object");
  sim_cmd->add_option("--report", sim.workload.report_dir,
                      "write summary.json, requests.csv and SVG plots into this folder");
  sim_cmd->add_option("--profile", sim.profile, "cost model: emulated or a100")
      ->capture_default_str();
  sim_cmd->add_option("--cost", sim.cost_file, "JSON object of cost-model fields");
  sim_cmd->add_option("--calibrate", sim.calibrate,
                      "a running server's URL (its /metrics) or a bench exp1 --json file");
  sim_cmd->add_option("--tflops", sim.tflops, "OPT compute per device, TFLOP/s");
  sim_cmd->add_option("--capacity-gb", sim.capacity_gb, "GB per device (CUDA configs)");
  sim_cmd->add_option("--link-gbps", sim.link_gbps, "link GB/s per device (CUDA configs)");
  sim_cmd->add_flag("--warm-up", sim.warm_up,
                    "one request per model, in order, before the arrivals (as bench exp2)");

  // generate
  auto gen_cmd = app.add_subcommand(
      "generate", "generate directly from one model (no server): the reference output");
  std::string gen_model_dir, gen_prompts;
  int64_t gen_max_tokens = 1;
  actors::row_sampling gen_sampling;
  gpu::device_options gen_devices;
  gen_devices.kind = "emulated";
  gen_cmd->add_option("--model-dir", gen_model_dir, "a repository folder holding config.json")
      ->required();
  gen_cmd->add_option("--prompts", gen_prompts, "JSON array of token-id arrays")->required();
  gen_cmd->add_option("--max-tokens", gen_max_tokens, "tokens to generate")->capture_default_str();
  gen_cmd->add_option("--temperature", gen_sampling.temperature, "0 is greedy")
      ->capture_default_str();
  gen_cmd->add_option("--top-k", gen_sampling.top_k, "0 keeps all")->capture_default_str();
  gen_cmd->add_option("--top-p", gen_sampling.top_p, "1 keeps all")->capture_default_str();
  gen_cmd->add_option("--seed", gen_sampling.seed, "row i uses seed + i")->capture_default_str();
  gen_cmd->add_option("--devices", gen_devices.count, "emulated devices")->capture_default_str();

  // help [subcommand ...]: what --help prints, for the whole tool or one subcommand.
  auto help_cmd = app.add_subcommand("help", "show the subcommands, or one subcommand's flags");
  std::vector<std::string> help_path;
  help_cmd->add_option("subcommand", help_path, "e.g. serve, or bench swap");

  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    // A missing subcommand: show what there is to choose from, at the level reached.
    CLI::App* level = &app;
    while (!level->get_subcommands().empty()) level = level->get_subcommands().front();
    std::cerr << e.what() << "\n\n" << level->help();
    return exit_usage;
  } catch (const CLI::ParseError& e) {
    auto rc = app.exit(e);
    return rc == 0 ? 0 : exit_usage;
  }
  log::level lvl;
  if (!log_level.empty() && log::parse_level(log_level, lvl)) log::set_level(lvl);

  if (*help_cmd) {
    // Through the formatter: App::help() of a level whose subcommand was parsed shows that
    // subcommand's help, and at the top that is `help` itself, not the list of subcommands.
    auto help_of = [](CLI::App* a) {
      return a->get_formatter()->make_help(a, a->get_name(), CLI::AppFormatMode::Normal);
    };
    CLI::App* level = &app;
    for (auto& name : help_path) {
      CLI::App* next = nullptr;
      try {
        next = level->get_subcommand(name);
      } catch (const CLI::OptionNotFound&) {
      }
      if (!next || next == help_cmd) {
        std::cerr << "computron help: no subcommand '" << name << "'\n\n" << help_of(level);
        return exit_usage;
      }
      level = next;
    }
    std::cout << help_of(level);
    return 0;
  }

  if (auto code = bench_commands.run()) return *code;
  if (*devices_cmd) return run_devices(dev_opts, devices_json);
  if (*serve_cmd) {
    if (const char* k = std::getenv("COMPUTRON_API_KEY"); k && *k && serve_flags.api_key.empty())
      serve_flags.api_key = k;
    auto cfg = serve::base_serve_config(serve_flags);
    if (!cfg) {
      std::cerr << "computron serve: " << render(cfg.error()) << '\n';
      return exit_usage;
    }
    if (auto why = serve::apply_overrides(*cfg, serve_flags); !why.empty()) {
      std::cerr << "computron serve: " << why << '\n';
      return exit_usage;
    }
    return app::run_serve(std::move(*cfg));
  }
  if (*node_cmd) {
    if (!(node_capacity_mb > 0) || !(node_link > 0)) {
      std::cerr << "computron node: --capacity-mb and --link-gbps must be positive\n";
      return exit_usage;
    }
    node.devices.emulated_capacity_bytes = mib_to_bytes(node_capacity_mb);
    node.devices.emulated_link_gbps = node_link;
    return app::run_node(node);
  }
  if (*console_cmd) return app::run_console(console);
  if (*demo_cmd) {
    auto at = net::parse_url(demo_url);
    if (!at) {
      std::cerr << "computron demo: " << render(at.error()) << '\n';
      return 2;
    }
    demo.host = at->host;
    demo.port = at->port;
    return app::run_demo(demo);
  }
  if (*lg_cmd) {
    if (lg_alpha_opt->count() > 0) lg.power_law_alpha = lg_alpha;
    if (lg_total_opt->count() > 0) lg.total_rate = lg_total;
    lg.progress = !lg_no_progress;
    return app::run_loadgen_cli(lg);
  }
  if (*sim_cmd) {
    if (sim_alpha_opt->count() > 0) sim.workload.power_law_alpha = sim_alpha;
    if (sim_total_opt->count() > 0) sim.workload.total_rate = sim_total;
    return app::run_sim_cli(sim);
  }
  if (*gen_cmd) {
    // Only this folder is read (a model folder is a repository of itself): a broken
    // sibling is not this model's problem.
    auto name = std::filesystem::path{gen_model_dir}.filename().string();
    auto repo = app::is_model_folder(gen_model_dir)
                    ? app::read_repository(gen_model_dir)
                    : app::read_repository(
                          std::filesystem::path{gen_model_dir}.parent_path().string(), name);
    if (!repo) {
      std::cerr << "computron generate: " << render(repo.error()) << '\n';
      return exit_usage;
    }
    if (!repo->empty() && repo->front().error) {
      std::cerr << "computron generate: " << render(repo->front().error) << '\n';
      return exit_usage;
    }
    auto prompts = nlohmann::json::parse(gen_prompts, nullptr, false);
    std::vector<std::vector<int64_t>> rows;
    try {
      rows = prompts.get<std::vector<std::vector<int64_t>>>();
    } catch (const std::exception&) {
      std::cerr << "computron generate: --prompts must be a JSON array of integer arrays\n";
      return exit_usage;
    }
    if (repo->empty()) {
      std::cerr << "computron generate: no model in " << gen_model_dir << '\n';
      return exit_usage;
    }
    auto& model = repo->front().config;
    if (gen_devices.count == 0) {
      for (auto d : model.devices) gen_devices.count = std::max(gen_devices.count, d + 1);
    }
    return app::run_generate(model, gen_devices, rows, gen_max_tokens, gen_sampling);
  }
  return exit_usage;
}
