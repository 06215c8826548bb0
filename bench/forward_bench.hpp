#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include <caf/expected.hpp>

#include "bench/step_probe.hpp"

/// `computron bench forward`: one OPT shard (tp = pp = 1) loaded through the weight
/// store, then prefill and decode latency on its device.
namespace computron::bench {

struct forward_bench_options {
  std::string model = "opt-125m";
  std::string dtype = "bf16";
  int64_t batch = 8;
  int64_t seq = 128;
  /// Decode steps timed after the prefill (per-token latency).
  int64_t decode_tokens = 16;
  int repeats = 3;
  /// libtorch intra-op threads (0: one per core).
  int threads = 0;
  std::string device_kind = "auto";
  uint64_t seed = 1;
  /// Also profile one decode step (Kineto: kernels on a GPU, aten ops on the CPU).
  bool profile = false;
  /// Rows of the profile kept (longest first).
  int profile_rows = 30;
  /// What a decode step does with its logits: "none" (whole rows to the host, no token
  /// drawn: the figures before sampling was timed), "host" (whole rows to the host, each
  /// row's sampler draws), or "device" (drawn where the logits lie, only ids come back).
  /// Both samplers draw with temperature 0.8 and top_p 0.95, a seed per row.
  std::string sampling = "none";
  /// The fused residual-add + RMSNorm and rotary calls (engine/norms.hpp, engine/rope.hpp;
  /// the Llama family); false: the same layers as libtorch ops.
  bool fused = true;
  /// Decode steps of up to this many rows through a CUDA graph per batch bucket
  /// (compute_options::graph_max_batch; the server's default, 32, on CUDA); -1: that
  /// default on CUDA and none elsewhere; 0: every step eagerly.
  int graphs = -1;
};

struct forward_bench_result {
  std::string model;
  std::string dtype;
  std::string device_kind;
  std::string sampling;
  bool fused = true;
  /// The largest graph bucket captured (0: none), the decode steps that replayed one, and
  /// why none was, where graphs were asked for and are off.
  int graph_max_batch = 0;
  uint64_t graph_replays = 0;
  std::string graphs_off_because;
  int64_t batch = 0;
  int64_t seq = 0;
  int threads = 0;
  uint64_t weight_bytes = 0;
  double load_seconds = 0;
  /// Median prefill of batch x seq tokens.
  double prefill_seconds = 0;
  double prefill_tokens_per_second = 0;
  /// Median time of one decode step (one new token for each of the batch).
  double decode_seconds_per_token = 0;
  /// Parameters read in place from the weight store's device copy (no per-request copy).
  bool zero_copy = false;
  /// Bytes one decode step allocates (after `seq` prompt tokens and the timed steps): the
  /// figure that shows whether a step copies the KV history.
  uint64_t decode_alloc_bytes_per_step = 0;
  /// libtorch ops one decode step dispatches, per layer and in all.
  double decode_ops_per_layer = 0;
  uint64_t decode_ops_per_step = 0;
  /// One decode step's profile, when asked for.
  std::optional<step_profile> decode_profile;
};

caf::expected<forward_bench_result> run_forward_bench(const forward_bench_options& opts);
std::string to_json(const forward_bench_result& r);
void print_table(std::ostream& out, const forward_bench_result& r);

}  // namespace computron::bench
