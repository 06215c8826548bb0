#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <caf/expected.hpp>

/// `computron bench swap`: the model-parallel swap. A model of `size_bytes` is split
/// into one equal shard per device; all shards load at once, each over its own link.
/// With `model`, the shards are that catalogue model's, tp x pp, with the bytes its
/// layout gives each rank, and the comparison is the layout before vocabulary-parallel
/// embeddings (every rank holding the whole embedding and head) in the same run.
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
  /// A catalogue model (e.g. llama-3.1-8b): devices = tp x pp, device i holding shard
  /// (i % tp, i / tp) in `dtype`; empty: size_bytes in equal shards.
  std::string model;
  int tp = 1;
  int pp = 1;
  std::string dtype = "bf16";
  /// Every shard's bytes divided by this, so a model larger than this host's memory (the
  /// emulated devices keep their copies in it) keeps its proportions; the link is not.
  int divide = 1;
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
  /// Device 0's page size, and the median time to map pages into a range of the
  /// largest shard's size and to unmap them (no copies), per GiB: what a load and an
  /// eviction pay for device memory in pages (cuMemMap/cuMemUnmap on a GPU, mmap here).
  uint64_t page_bytes = 0;
  double map_ms_per_gib = 0;
  double unmap_ms_per_gib = 0;
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
  /// With a model: its checkpoint's bytes, and the bytes and swap time of the layout
  /// with the vocabulary replicated on every rank (divided as the shards are), and how
  /// much faster the vocabulary-parallel layout swaps.
  std::string model;
  std::string split;
  int divide = 1;
  uint64_t weight_bytes = 0;
  uint64_t replicated_vocab_bytes = 0;
  double replicated_vocab_seconds = 0;
  double vocab_speedup = 0;
};

/// Runs the benchmark. Errors: bad options, not enough host memory for the host copies
/// and emulated device memory, device failures, a verification mismatch.
caf::expected<swap_bench_result> run_swap_bench(const swap_bench_options& opts);

/// One JSON object (fields named as in swap_bench_result).
std::string to_json(const swap_bench_result& r);

/// A table for people.
void print_table(std::ostream& out, const swap_bench_result& r);

/// `computron bench layout`: for every catalogue model (test shapes aside) and split
/// tp 1/2/4 x pp 1/2 it can take, the bytes on its devices over its checkpoint's in
/// `dtype`, and the same with the vocabulary replicated (the layout before). Arithmetic
/// over the layouts; nothing is allocated. Errors: an unknown dtype.
caf::error print_layout_table(std::ostream& out, const std::string& dtype);

}  // namespace computron::bench
