#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <caf/expected.hpp>

/// `computron bench colocate`: two copies of one catalogue model (different seeds) decoding
/// on one device at once, the ways a device can be shared between them: taking turns on
/// one lane (time sharing), two plain streams, and gpu-lets (green contexts on a GPU) of
/// each split asked for. Per way: aggregate tokens/s and each model's inter-token latency;
/// per split also each gpu-let's step time alone, against which the slowdown its busy
/// partner causes (the interference factor, `devices.gpulet_interference`) is measured.
/// On emulated devices the ways run as CPU threads: the bench works, its figures mean
/// little.
namespace computron::bench {

struct colocate_options {
  std::string model = "opt-125m";
  std::string dtype = "bf16";
  int64_t batch = 8;
  /// Prompt tokens per sequence, prefilled before the timed decode steps.
  int64_t seq = 128;
  /// Decode steps timed per model and way.
  int64_t steps = 64;
  /// Gpu-let splits, "A/B" percent (A + B <= 100).
  std::vector<std::string> splits{"50/50", "30/70"};
  std::string device_kind = "auto";
  /// libtorch intra-op threads (0: one per core).
  int threads = 0;
  uint64_t seed = 1;
};

/// One way of sharing the device.
struct colocate_way {
  /// "alone", "time-shared", "streams" or "gpulets A/B".
  std::string name;
  double tokens_per_second = 0;
  /// Per model (0, 1): median and 99th percentile time between its tokens, ms.
  double p50_ms[2] = {0, 0};
  double p99_ms[2] = {0, 0};
  /// Gpu-lets: each model's median step alone on its gpu-let (ms), and its median step
  /// beside its busy partner over that (the interference factor).
  double alone_ms[2] = {0, 0};
  double interference[2] = {0, 0};
};

struct colocate_result {
  std::string model;
  std::string dtype;
  std::string device_kind;
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t steps = 0;
  std::vector<colocate_way> ways;
};

caf::expected<colocate_result> run_colocate_bench(const colocate_options& opts);
std::string to_json(const colocate_result& r);
void print_table(std::ostream& out, const colocate_result& r);

}  // namespace computron::bench
