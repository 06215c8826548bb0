#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <caf/expected.hpp>

/// `computron bench swap`: the model-parallel swap. A model of `size_bytes` is split
/// into one equal shard per device; all shards load at once, each over its own link.
namespace computron::bench {

struct swap_bench_options {
  /// "auto", "emulated" or "cuda" (gpu::device_options::kind).
  std::string device_kind = "auto";
  int devices = 4;
  /// Emulated link rate per device, GB/s. Ignored on CUDA (the link is measured).
  double link_gbps = 2.0;
  /// Whole model; each device gets size / devices.
  uint64_t size_bytes = 2048ull << 20;
  uint64_t chunk_bytes = 32ull << 20;
  /// Timed load/evict rounds after one untimed warm-up; figures are medians.
  int repeats = 3;
  /// With several devices, also load the whole model onto one device for the speed-up.
  bool baseline = true;
  /// Read back samples of every shard after the last load and compare with the host.
  bool verify = true;
  uint64_t seed = 42;
};

/// One device's share of a swap.
struct device_result {
  std::string name;
  uint64_t bytes = 0;
  double load_seconds = 0;
  double achieved_gbps = 0;
};

struct swap_bench_result {
  std::string device_kind;
  int devices = 0;
  uint64_t bytes = 0;
  uint64_t chunk_bytes = 0;
  int repeats = 0;
  /// Reference rate of one link: configured (emulated) or one plain copy (CUDA).
  double link_gbps = 0;
  std::string link_source;
  /// Median over repeats of the time until every shard was resident.
  double load_seconds = 0;
  double achieved_gbps = 0;
  /// achieved / (devices x link_gbps).
  double efficiency = 0;
  /// Median over repeats of the slowest shard's eviction.
  double evict_ms = 0;
  /// Median of the slowest shard's load() call (allocation and queueing of the chunks).
  double submit_ms = 0;
  /// Device 0's native allocator calls over the run (see gpu::device_stats).
  uint64_t native_allocations = 0;
  uint64_t native_frees = 0;
  bool host_pinned = false;
  bool verified = false;
  std::vector<device_result> per_device;
  /// The whole model onto one device (0 when not measured), and the speed-up of the
  /// model-parallel swap over it, measured in the same run.
  double single_device_seconds = 0;
  double speedup = 0;
};

/// Runs the benchmark. Errors: bad options, not enough host memory for the host copies
/// and emulated device memory, device failures, a verification mismatch.
caf::expected<swap_bench_result> run_swap_bench(const swap_bench_options& opts);

/// One JSON object (fields named as in swap_bench_result).
std::string to_json(const swap_bench_result& r);

/// A table for people.
void print_table(std::ostream& out, const swap_bench_result& r);

}  // namespace computron::bench
