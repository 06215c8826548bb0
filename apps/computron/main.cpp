// `computron`: one binary, subcommands. For now `bench swap` (the model-parallel swap
// benchmark) and `devices` (what this machine offers); serving comes in later issues.
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

#include "apps/computron/console.hpp"
#include "apps/computron/experiments.hpp"
#include "apps/computron/loadgen.hpp"
#include "apps/computron/serve.hpp"
#include "apps/computron/sim_cli.hpp"
#include "bench/cluster_bench.hpp"
#include "bench/forward_bench.hpp"
#include "bench/runtime_bench.hpp"
#include "bench/startup_bench.hpp"
#include "bench/swap_bench.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/backends.hpp"
#include "net/loadgen.hpp"

namespace {

using namespace computron;

constexpr int exit_failure = 1;
constexpr int exit_usage = 2;

uint64_t mib_to_bytes(double mib) {
  return static_cast<uint64_t>(std::llround(mib * 1048576.0));
}

int run_bench_swap(const bench::swap_bench_options& opts, bool json) {
  auto r = bench::run_swap_bench(opts);
  if (!r) {
    std::cerr << "computron bench swap: " << render(r.error()) << '\n';
    return exit_failure;
  }
  if (json)
    std::cout << bench::to_json(*r) << '\n';
  else
    bench::print_table(std::cout, *r);
  return 0;
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

  // bench swap
  auto bench_cmd = app.add_subcommand("bench", "benchmarks (figures go to bench/RESULTS.md)");
  bench_cmd->require_subcommand(1);
  auto swap_cmd = bench_cmd->add_subcommand(
      "swap", "load one model split over N devices at once (the model-parallel swap)");
  bench::swap_bench_options swap;
  double size_mb = static_cast<double>(swap.size_bytes) / 1048576.0;
  double chunk_mb = static_cast<double>(swap.chunk_bytes) / 1048576.0;
  bool no_baseline = false;
  bool no_verify = false;
  bool swap_json = false;
  swap_cmd->add_option("--devices", swap.devices, "devices; the model is split evenly over them")
      ->capture_default_str();
  swap_cmd->add_option("--link-gbps", swap.link_gbps, "emulated link rate per device, GB/s")
      ->capture_default_str();
  swap_cmd->add_option("--size-mb", size_mb, "whole model size, MiB")->capture_default_str();
  swap_cmd->add_option("--chunk-mb", chunk_mb, "copy chunk size, MiB")->capture_default_str();
  swap_cmd->add_option("--repeats", swap.repeats, "timed rounds (median reported)")
      ->capture_default_str();
  swap_cmd->add_option("--device-kind", swap.device_kind, "auto, emulated or cuda")
      ->check(CLI::IsMember({"auto", "emulated", "cuda"}))
      ->capture_default_str();
  swap_cmd->add_option("--seed", swap.seed, "seed of the random weights")->capture_default_str();
  swap_cmd->add_flag("--no-baseline", no_baseline, "skip the one-device comparison");
  swap_cmd->add_flag("--no-verify", no_verify, "skip reading back and comparing bytes");
  swap_cmd->add_flag("--json", swap_json, "print one JSON object");

  // bench forward
  auto fwd_cmd = bench_cmd->add_subcommand(
      "forward", "prefill and decode latency of one decoder shard read from the weight store");
  bench::forward_bench_options fwd;
  bool fwd_json = false;
  fwd_cmd->add_option("--model", fwd.model,
                      "catalogue name (opt-tiny ... opt-175b, llama-3.2-1b, llama-3.1-8b, "
                      "qwen2.5-0.5b, qwen2.5-7b, qwen3-0.6b, mistral-7b, ...)")
      ->capture_default_str();
  fwd_cmd->add_option("--dtype", fwd.dtype, "f32, bf16 or f16 (CUDA only)")->capture_default_str();
  fwd_cmd->add_option("--batch", fwd.batch, "sequences per forward")->capture_default_str();
  fwd_cmd->add_option("--seq", fwd.seq, "prompt tokens per sequence")->capture_default_str();
  fwd_cmd->add_option("--decode-tokens", fwd.decode_tokens, "decode steps timed after the prefill")
      ->capture_default_str();
  fwd_cmd->add_option("--repeats", fwd.repeats, "timed rounds (median reported)")
      ->capture_default_str();
  fwd_cmd->add_option("--threads", fwd.threads, "compute threads (0: one per core)")
      ->capture_default_str();
  fwd_cmd->add_option("--device-kind", fwd.device_kind, "auto, emulated or cuda")
      ->check(CLI::IsMember({"auto", "emulated", "cuda"}))
      ->capture_default_str();
  fwd_cmd->add_flag("--json", fwd_json, "print one JSON object");

  // bench startup
  auto su_cmd = bench_cmd->add_subcommand(
      "startup", "GB/s of writing a model's host copy: seeded and from a safetensors folder");
  bench::startup_bench_options sub;
  bool su_json = false;
  su_cmd->add_option("--model", sub.model, "catalogue name")->capture_default_str();
  su_cmd->add_option("--dtype", sub.dtype, "f32, bf16 or f16")->capture_default_str();
  su_cmd->add_option("--threads", sub.threads, "fill threads (0: one per core)")
      ->capture_default_str();
  su_cmd->add_option("--files", sub.files, "safetensors files of the checkpoint")
      ->capture_default_str();
  su_cmd->add_option("--dir", sub.dir, "where to write the checkpoint (default: a temp folder)");
  su_cmd->add_flag("--json", su_json, "print one JSON object");

  // bench runtime
  auto rt_cmd = bench_cmd->add_subcommand(
      "runtime",
      "actor-path dispatch rate and added latency, HTTP requests/s, swap via the actors");
  bench::runtime_bench_options rtb;
  double rt_swap_mb = static_cast<double>(rtb.swap_bytes) / 1048576.0;
  bool rt_json = false;
  rt_cmd->add_option("--clients", rtb.clients, "closed-loop clients")->capture_default_str();
  rt_cmd->add_option("--seconds", rtb.seconds, "duration of each throughput part")
      ->capture_default_str();
  rt_cmd->add_option("--latency-requests", rtb.latency_requests, "sequential requests timed")
      ->capture_default_str();
  rt_cmd->add_option("--swap-mb", rt_swap_mb, "model size of the swap part, MiB")
      ->capture_default_str();
  rt_cmd->add_option("--link-gbps", rtb.link_gbps, "emulated link rate, GB/s")
      ->capture_default_str();
  rt_cmd->add_option("--repeats", rtb.swap_repeats, "timed swap rounds (median)")
      ->capture_default_str();
  rt_cmd->add_flag("--json", rt_json, "print one JSON object");

  // bench cluster
  auto cl_cmd = bench_cmd->add_subcommand(
      "cluster", "remote hop latency and a 4-shard swap over node processes vs in process");
  bench::cluster_bench_options clb;
  double cl_swap_mb = static_cast<double>(clb.swap_bytes) / 1048576.0;
  bool cl_json = false;
  cl_cmd->add_option("--hops", clb.hops, "sequential requests timed per hop kind")
      ->capture_default_str();
  cl_cmd->add_option("--steps", clb.steps, "sequential 2-stage steps timed")->capture_default_str();
  cl_cmd->add_option("--swap-mb", cl_swap_mb, "model size of the swap part, MiB")
      ->capture_default_str();
  cl_cmd->add_option("--link-gbps", clb.link_gbps, "emulated link rate, GB/s")
      ->capture_default_str();
  cl_cmd->add_option("--repeats", clb.swap_repeats, "timed loads (median)")->capture_default_str();
  cl_cmd->add_flag("--json", cl_json, "print one JSON object");

  // bench exp1 / exp2
  app::experiment_options exp;
  bool exp_no_overlap = false;
  auto exp1_cmd = bench_cmd->add_subcommand(
      "exp1", "the original's experiment 1 (swap scaling over TP x PP) against a real server");
  auto exp2_cmd = bench_cmd->add_subcommand(
      "exp2", "the original's experiment 2 (18 Gamma workloads) against a real server");
  auto simfid_cmd = bench_cmd->add_subcommand(
      "sim", "the simulator against the runtime: experiment 1 and every experiment-2 cell");
  for (auto* c : {exp1_cmd, exp2_cmd, simfid_cmd}) {
    c->add_option("--factor", exp.factor, "model bytes and link bandwidth divided by this")
        ->capture_default_str();
    c->add_option("--seed", exp.seed, "seed of weights, arrivals and prompts")
        ->capture_default_str();
    c->add_option("--out", exp.out_dir, "keep server configs and reports here");
    c->add_flag("--json", exp.json, "print one JSON object");
    c->add_flag("--no-overlap", exp_no_overlap,
                "servers wait for a whole load before computing (no compute while loading)");
  }
  for (auto* c : {exp2_cmd, simfid_cmd}) {
    c->add_option("--duration", exp.duration_s, "seconds of arrivals per cell")
        ->capture_default_str();
    c->add_option("--only", exp.only, "run only cells whose label contains this");
    c->add_option("--policy", exp.policy, "eviction policy of the server (lru, cost)")
        ->capture_default_str();
  }
  exp2_cmd->add_option("--batch-window-ms", exp.batch_window_ms, "server's batch window")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  exp2_cmd->add_option("--slo", exp.slo_s, "latency SLO in seconds: attainment per cell")
      ->check(CLI::Range(0.0, 3600.0));
  exp2_cmd->add_flag("--drop-late", exp.drop_late,
                     "requests carry the SLO as their deadline with drop_late (needs --slo)");

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
  std::string serve_config_path, serve_repository, serve_host, serve_trace;
  int serve_port = -1;
  int serve_devices = 0;
  serve_cmd->add_option("--config", serve_config_path,
                        "JSON serve config (default: built-in, see configs/)");
  serve_cmd->add_option("--repository", serve_repository,
                        "model repository folder (one folder per model)");
  serve_cmd->add_option("--host", serve_host, "address to listen on (default 127.0.0.1)");
  serve_cmd
      ->add_option("--port", serve_port, "port to listen on (default 8000; 0 picks a free one)")
      ->check(CLI::Range(0, 65535));
  serve_cmd->add_option("--devices", serve_devices, "number of devices (overrides the config)")
      ->check(CLI::Range(1, 1024));
  serve_cmd->add_option("--trace", serve_trace,
                        "write a Chrome trace of loads and batches here at exit");

  std::string serve_nodes;
  net::tls_options serve_tls;
  int serve_console_port = -2;
  serve_cmd->add_option("--nodes", serve_nodes,
                        "serve with these nodes, host:port,... (`computron node` on each)");
  auto add_tls = [](CLI::App* cmd, net::tls_options& tls) {
    cmd->add_option("--tls-certificate", tls.certificate, "PEM certificate (TLS to peers)");
    cmd->add_option("--tls-key", tls.key, "PEM private key of the certificate");
    cmd->add_option("--tls-cafile", tls.cafile, "PEM CA that signed the peers' certificates");
  };
  add_tls(serve_cmd, serve_tls);

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
      ->add_option("--console-port", serve_console_port,
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
      "loadgen", "open-loop Gamma or trace workload against a running server; latency report");
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
  lg_cmd->add_option("--prompt-len", lg.prompt_len, "prompt tokens per request")
      ->capture_default_str();
  lg_cmd->add_option("--max-tokens", lg.max_tokens, "tokens generated per request")
      ->capture_default_str();
  lg_cmd->add_option("--slo", lg.slo_s, "latency SLO in seconds for the attainment figure");
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
    CLI::App* level = &app;
    for (auto& name : help_path) {
      CLI::App* next = nullptr;
      try {
        next = level->get_subcommand(name);
      } catch (const CLI::OptionNotFound&) {
      }
      if (!next || next == help_cmd) {
        std::cerr << "computron help: no subcommand '" << name << "'\n\n" << level->help();
        return exit_usage;
      }
      level = next;
    }
    std::cout << level->help();
    return 0;
  }

  if (*swap_cmd) {
    if (!(size_mb > 0) || !(chunk_mb > 0) || !std::isfinite(size_mb) || !std::isfinite(chunk_mb)) {
      std::cerr << "computron bench swap: --size-mb and --chunk-mb must be positive\n";
      return exit_usage;
    }
    swap.size_bytes = mib_to_bytes(size_mb);
    swap.chunk_bytes = mib_to_bytes(chunk_mb);
    swap.baseline = !no_baseline;
    swap.verify = !no_verify;
    return run_bench_swap(swap, swap_json);
  }
  if (*fwd_cmd) {
    auto r = bench::run_forward_bench(fwd);
    if (!r) {
      std::cerr << "computron bench forward: " << render(r.error()) << '\n';
      return exit_failure;
    }
    if (fwd_json)
      std::cout << bench::to_json(*r) << '\n';
    else
      bench::print_table(std::cout, *r);
    return 0;
  }
  if (*su_cmd) {
    auto r = bench::run_startup_bench(sub);
    if (!r) {
      std::cerr << "computron bench startup: " << render(r.error()) << '\n';
      return exit_failure;
    }
    if (su_json)
      std::cout << bench::to_json(*r) << '\n';
    else
      bench::print_table(std::cout, *r);
    return 0;
  }
  if (*rt_cmd) {
    if (!(rt_swap_mb >= 4) || !std::isfinite(rt_swap_mb)) {
      std::cerr << "computron bench runtime: --swap-mb must be at least 4\n";
      return exit_usage;
    }
    rtb.swap_bytes = mib_to_bytes(rt_swap_mb);
    auto r = bench::run_runtime_bench(rtb);
    if (!r) {
      std::cerr << "computron bench runtime: " << render(r.error()) << '\n';
      return exit_failure;
    }
    std::cout << (rt_json ? bench::to_json(*r) + "\n" : bench::to_table(*r));
    return 0;
  }
  if (*cl_cmd) {
    if (!(cl_swap_mb >= 4) || !std::isfinite(cl_swap_mb)) {
      std::cerr << "computron bench cluster: --swap-mb must be at least 4\n";
      return exit_usage;
    }
    clb.swap_bytes = mib_to_bytes(cl_swap_mb);
    auto r = bench::run_cluster_bench(clb);
    if (!r) {
      std::cerr << "computron bench cluster: " << render(r.error()) << '\n';
      return exit_failure;
    }
    std::cout << (cl_json ? bench::to_json(*r) + "\n" : bench::to_table(*r));
    return 0;
  }
  exp.compute_while_loading = !exp_no_overlap;
  if (*exp1_cmd) return app::run_experiment1(exp);
  if (*exp2_cmd) return app::run_experiment2(exp);
  if (*simfid_cmd) return app::run_sim_fidelity(exp);
  if (*devices_cmd) return run_devices(dev_opts, devices_json);
  if (*serve_cmd) {
    auto cfg = serve_config_path.empty()
                   ? caf::expected<app::serve_config>{app::default_serve_config()}
                   : app::load_serve_config(serve_config_path);
    if (!cfg) {
      std::cerr << "computron serve: " << render(cfg.error()) << '\n';
      return exit_usage;
    }
    if (!serve_repository.empty()) {
      // The repository replaces the configured models.
      cfg->models.clear();
      if (auto err = app::add_repository(*cfg, serve_repository)) {
        std::cerr << "computron serve: " << render(err) << '\n';
        return exit_usage;
      }
    }
    if (!serve_host.empty()) cfg->http.host = serve_host;
    if (serve_port >= 0) cfg->http.port = static_cast<uint16_t>(serve_port);
    if (serve_devices > 0) cfg->runtime.devices.count = serve_devices;
    if (!serve_trace.empty()) cfg->trace_file = serve_trace;
    if (!serve_nodes.empty()) {
      auto nodes = net::parse_node_list(serve_nodes);
      if (!nodes) {
        std::cerr << "computron serve: " << render(nodes.error()) << '\n';
        return exit_usage;
      }
      cfg->cluster.nodes = std::move(*nodes);
    }
    if (serve_tls.enabled()) cfg->tls = serve_tls;
    if (serve_console_port >= -1) cfg->console_port = serve_console_port;
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
    // Only this folder is read: a broken sibling is not this model's problem.
    auto name = std::filesystem::path{gen_model_dir}.filename().string();
    auto repo =
        app::read_repository(std::filesystem::path{gen_model_dir}.parent_path().string(), name);
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
