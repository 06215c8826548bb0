#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include <caf/expected.hpp>

/// `computron bench startup`: how fast a model's host copy is written at registration,
/// from seeded weights and from a Hugging Face safetensors folder, against the per-element
/// reference (seeded_value) in the same run.
namespace computron::bench {

struct startup_bench_options {
  std::string model = "opt-1.3b";
  std::string dtype = "bf16";
  /// Threads of the parallel figures (0: one per core).
  int threads = 0;
  /// Safetensors files the checkpoint is written as.
  int files = 2;
  /// Elements the per-element reference is timed on (it is slow).
  uint64_t reference_elements = 32ull << 20;
  /// Folder for the checkpoint (a temporary one when empty; removed afterwards).
  std::string dir;
};

struct startup_bench_result {
  std::string model;
  std::string dtype;
  uint64_t bytes = 0;
  int threads = 0;
  /// Seeded fill, one thread and `threads` threads, GB/s (1e9 bytes).
  double seeded_gbps_one_thread = 0;
  double seeded_gbps = 0;
  /// The per-element reference (what registration did before), one thread, GB/s.
  double reference_gbps_one_thread = 0;
  /// Filling the shard from the mapped checkpoint (page cache warm), GB/s, and the same
  /// with a dtype conversion (an f32 checkpoint served in `dtype`).
  double checkpoint_gbps = 0;
  double checkpoint_convert_gbps = 0;
  /// Plain memcpy of the same bytes, one thread and `threads`: the ceiling.
  double memcpy_gbps_one_thread = 0;
  double memcpy_gbps = 0;
};

caf::expected<startup_bench_result> run_startup_bench(const startup_bench_options& opts);
std::string to_json(const startup_bench_result& r);
void print_table(std::ostream& out, const startup_bench_result& r);

}  // namespace computron::bench
