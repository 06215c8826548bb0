// `computron`: one binary, subcommands. For now `bench swap` (the model-parallel swap
// benchmark) and `devices` (what this machine offers); serving comes in later issues.
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/forward_bench.hpp"
#include "bench/swap_bench.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/backends.hpp"

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

int main(int argc, char** argv) {
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
      "forward", "prefill and decode latency of one OPT shard read from the weight store");
  bench::forward_bench_options fwd;
  bool fwd_json = false;
  fwd_cmd->add_option("--model", fwd.model, "catalogue name (opt-tiny ... opt-175b)")
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
  if (*devices_cmd) return run_devices(dev_opts, devices_json);
  return exit_usage;
}
