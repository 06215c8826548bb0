// `computron bench ...`: the benchmarks' subcommands, their flags and how each runs (the
// figures go to bench/RESULTS.md). The benchmarks themselves are in bench/ (computron_bench)
// and bench/experiments/ (exp1 and exp2); `bench sim` in sim_fidelity.cpp.
#include <cmath>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>

#include "apps/computron/command.hpp"
#include "apps/computron/sim_fidelity.hpp"
#include "bench/cluster_bench.hpp"
#include "bench/colocate_bench.hpp"
#include "bench/experiments/experiments.hpp"
#include "bench/forward_bench.hpp"
#include "bench/runtime_bench.hpp"
#include "bench/startup_bench.hpp"
#include "bench/swap_bench.hpp"
#include "common/error.hpp"

namespace computron::app {

namespace {

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

/// `computron bench ...` as one piece of the CLI: its subcommands and flags, and running
/// the one chosen.
class bench_cli {
 public:
  /// Adds bench's subcommands to `bench_cmd` (`computron bench`).
  explicit bench_cli(CLI::App& bench_cmd);
  /// Runs the bench subcommand that was parsed and returns the exit code.
  int run();

 private:
  CLI::App* swap_cmd = nullptr;
  bench::swap_bench_options swap;
  double size_mb = 0;
  double chunk_mb = 0;
  bool no_baseline = false;
  bool no_verify = false;
  bool swap_json = false;
  CLI::App* layout_cmd = nullptr;
  std::string layout_dtype = "bf16";
  CLI::App* fwd_cmd = nullptr;
  bench::forward_bench_options fwd;
  bool fwd_json = false;
  CLI::App* co_cmd = nullptr;
  bench::colocate_options co;
  bool co_json = false;
  CLI::App* su_cmd = nullptr;
  bench::startup_bench_options sub;
  bool su_json = false;
  CLI::App* rt_cmd = nullptr;
  bench::runtime_bench_options rtb;
  double rt_swap_mb = 0;
  bool rt_json = false;
  CLI::App* cl_cmd = nullptr;
  bench::cluster_bench_options clb;
  double cl_swap_mb = 0;
  bool cl_json = false;
  bench::experiment_options exp;
  bool exp_no_overlap = false;
  CLI::App* exp1_cmd = nullptr;
  CLI::App* exp2_cmd = nullptr;
  CLI::App* simfid_cmd = nullptr;
};

bench_cli::bench_cli(CLI::App& bench_cmd) {
  // bench swap
  bench_cmd.require_subcommand(1);
  swap_cmd = bench_cmd.add_subcommand(
      "swap", "load one model split over N devices at once (the model-parallel swap)");
  size_mb = static_cast<double>(swap.size_bytes) / 1048576.0;
  chunk_mb = static_cast<double>(swap.chunk_bytes) / 1048576.0;
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
  swap_cmd->add_option("--model", swap.model,
                       "a catalogue model (llama-3.1-8b, ...): its shards' bytes, tp x pp, "
                       "against the layout with the vocabulary replicated (instead of the "
                       "one-device baseline)");
  swap_cmd->add_option("--tp", swap.tp, "with --model: tensor-parallel ranks")
      ->capture_default_str();
  swap_cmd->add_option("--pp", swap.pp, "with --model: pipeline stages")->capture_default_str();
  swap_cmd->add_option("--dtype", swap.dtype, "with --model: f32, bf16 or f16")
      ->capture_default_str();
  swap_cmd
      ->add_option("--divide", swap.divide,
                   "with --model: every shard's bytes divided by this (to fit host memory)")
      ->capture_default_str();
  swap_cmd->add_flag("--no-baseline", no_baseline, "skip the one-device comparison");
  swap_cmd->add_flag("--no-verify", no_verify, "skip reading back and comparing bytes");
  swap_cmd->add_flag("--json", swap_json, "print one JSON object");

  // bench layout
  layout_cmd = bench_cmd.add_subcommand(
      "layout",
      "every catalogue model's bytes on its devices over its checkpoint's, tp 1/2/4 x "
      "pp 1/2, now and with the vocabulary replicated (no device needed)");
  layout_cmd->add_option("--dtype", layout_dtype, "f32, bf16 or f16")->capture_default_str();

  // bench forward
  fwd_cmd = bench_cmd.add_subcommand(
      "forward", "prefill and decode latency of one decoder shard read from the weight store");
  fwd_cmd
      ->add_option("--model", fwd.model,
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
  fwd_cmd->add_flag("--profile", fwd.profile,
                    "also profile one decode step: kernels on a GPU, aten ops on the CPU (Kineto)");
  fwd_cmd
      ->add_option("--profile-rows", fwd.profile_rows, "rows of the profile shown (longest first)")
      ->capture_default_str();
  fwd_cmd
      ->add_option("--sampling", fwd.sampling,
                   "what a decode step does with its logits: none (whole rows to the host), "
                   "host (whole rows, sampled there) or device (drawn on the device, ids back); "
                   "temperature 0.8, top_p 0.95")
      ->check(CLI::IsMember({"none", "host", "device"}))
      ->capture_default_str();
  fwd_cmd->add_flag("--fused,!--no-fused", fwd.fused,
                    "residual add + RMSNorm and the rotary embedding each in one call (default), "
                    "or as libtorch ops");
  fwd_cmd
      ->add_option("--graphs", fwd.graphs,
                   "decode steps of up to this many rows replay a CUDA graph per batch bucket "
                   "(0: eagerly; -1: 32 on CUDA, as the server)")
      ->check(CLI::Range(-1, 256))
      ->capture_default_str();
  fwd_cmd->add_flag("--json", fwd_json, "print one JSON object");

  // bench colocate
  co_cmd = bench_cmd.add_subcommand(
      "colocate",
      "two models decoding on one device: time-shared, two streams, and gpu-lets (green "
      "contexts) of each split, with the interference factor they measure");
  co_cmd->add_option("--model", co.model, "catalogue name (as bench forward)")
      ->capture_default_str();
  co_cmd->add_option("--dtype", co.dtype, "f32, bf16 or f16 (CUDA only)")->capture_default_str();
  co_cmd->add_option("--batch", co.batch, "sequences per model")->capture_default_str();
  co_cmd->add_option("--seq", co.seq, "prompt tokens per sequence")->capture_default_str();
  co_cmd->add_option("--steps", co.steps, "decode steps timed per model and way")
      ->capture_default_str();
  co_cmd->add_option("--splits", co.splits, "gpu-let splits, A/B percent")->capture_default_str();
  co_cmd->add_option("--threads", co.threads, "compute threads (0: one per core)")
      ->capture_default_str();
  co_cmd->add_option("--device-kind", co.device_kind, "auto, emulated or cuda")
      ->check(CLI::IsMember({"auto", "emulated", "cuda"}))
      ->capture_default_str();
  co_cmd->add_flag("--json", co_json, "print one JSON object");

  // bench startup
  su_cmd = bench_cmd.add_subcommand(
      "startup", "GB/s of writing a model's host copy: seeded and from a safetensors folder");
  su_cmd->add_option("--model", sub.model, "catalogue name")->capture_default_str();
  su_cmd->add_option("--dtype", sub.dtype, "f32, bf16 or f16")->capture_default_str();
  su_cmd->add_option("--threads", sub.threads, "fill threads (0: one per core)")
      ->capture_default_str();
  su_cmd->add_option("--files", sub.files, "safetensors files of the checkpoint")
      ->capture_default_str();
  su_cmd->add_option("--dir", sub.dir, "where to write the checkpoint (default: a temp folder)");
  su_cmd->add_flag("--json", su_json, "print one JSON object");

  // bench runtime
  rt_cmd = bench_cmd.add_subcommand(
      "runtime",
      "actor-path dispatch rate and added latency, HTTP requests/s, swap via the actors");
  rt_swap_mb = static_cast<double>(rtb.swap_bytes) / 1048576.0;
  rt_cmd->add_option("--clients", rtb.clients, "closed-loop clients")->capture_default_str();
  rt_cmd->add_option("--seconds", rtb.seconds, "duration of each throughput part")
      ->capture_default_str();
  rt_cmd->add_option("--latency-requests", rtb.latency_requests, "sequential requests timed")
      ->capture_default_str();
  rt_cmd->add_option("--decode-tokens", rtb.decode_tokens, "tokens each decode request generates")
      ->capture_default_str();
  rt_cmd->add_option("--decode-rows", rtb.decode_rows, "rows of the decode part's larger batch")
      ->capture_default_str();
  rt_cmd->add_option("--decode-repeats", rtb.decode_repeats, "decode rounds (median)")
      ->capture_default_str();
  rt_cmd->add_flag("--caf-polling", rtb.caf_polling,
                   "CAF's own idle polling instead of the default prompt one (a comparison)");
  rt_cmd->add_option("--swap-mb", rt_swap_mb, "model size of the swap part, MiB")
      ->capture_default_str();
  rt_cmd->add_option("--link-gbps", rtb.link_gbps, "emulated link rate, GB/s")
      ->capture_default_str();
  rt_cmd->add_option("--repeats", rtb.swap_repeats, "timed swap rounds (median)")
      ->capture_default_str();
  rt_cmd->add_flag("--json", rt_json, "print one JSON object");

  // bench cluster
  cl_cmd = bench_cmd.add_subcommand(
      "cluster", "remote hop latency and a 4-shard swap over node processes vs in process");
  cl_swap_mb = static_cast<double>(clb.swap_bytes) / 1048576.0;
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
  exp1_cmd = bench_cmd.add_subcommand(
      "exp1", "the original's experiment 1 (swap scaling over TP x PP) against a real server");
  exp2_cmd = bench_cmd.add_subcommand(
      "exp2", "the original's experiment 2 (18 Gamma workloads) against a real server");
  simfid_cmd = bench_cmd.add_subcommand(
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
}

int bench_cli::run() {
  if (*swap_cmd) {
    if (!(size_mb > 0) || !(chunk_mb > 0) || !std::isfinite(size_mb) || !std::isfinite(chunk_mb)) {
      std::cerr << "computron bench swap: --size-mb and --chunk-mb must be positive\n";
      return exit_usage;
    }
    swap.size_bytes = mib_to_bytes(size_mb);
    swap.chunk_bytes = mib_to_bytes(chunk_mb);
    swap.baseline = !no_baseline;
    // A model puts one shard on each of its tp x pp devices.
    if (!swap.model.empty() && swap_cmd->count("--devices") == 0) swap.devices = swap.tp * swap.pp;
    swap.verify = !no_verify;
    return run_bench_swap(swap, swap_json);
  }
  if (*layout_cmd) {
    if (auto err = bench::print_layout_table(std::cout, layout_dtype)) {
      std::cerr << "computron bench layout: " << render(err) << '\n';
      return exit_failure;
    }
    return 0;
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
  if (*co_cmd) {
    auto r = bench::run_colocate_bench(co);
    if (!r) {
      std::cerr << "computron bench colocate: " << render(r.error()) << '\n';
      return exit_failure;
    }
    if (co_json)
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
  if (*exp1_cmd) return bench::run_experiment1(exp);
  if (*exp2_cmd) return bench::run_experiment2(exp);
  if (*simfid_cmd) return run_sim_fidelity(exp);
  return exit_usage;
}

const registration bench_command{
    {"bench", "benchmarks (figures go to bench/RESULTS.md)", 10, [](CLI::App& cmd) -> command_run {
       auto cli = std::make_shared<bench_cli>(cmd);
       return [cli] { return cli->run(); };
     }}};

}  // namespace

}  // namespace computron::app
