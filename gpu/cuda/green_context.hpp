#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

/// Gpu-lets on a GPU: CUDA green contexts, each holding a share of the GPU's SMs, and a
/// stream in each that a compute lane's forwards run on. The driver calls are looked up
/// through the runtime (cudaGetDriverEntryPointByVersion), not linked: a binary built
/// here must still start where there is no driver at all.
namespace computron::gpu::cuda {

/// Why green contexts cannot be used on this machine (no GPU, a driver older than CUDA
/// 12.4, a driver call missing), or none. Checked once.
caf::error green_contexts_available();

/// What one gpu-let got: its stream and the SMs it holds.
struct green_stream {
  void* stream = nullptr;  // a cudaStream_t; null: the whole GPU's default stream
  unsigned sms = 0;
  unsigned first_sm = 0;
};

/// The green contexts of one GPU, per partition (the shares of its lanes, percent, lane
/// 0 first), created on first use and kept until it closes. A partition is split in one
/// chain: lane 0's SMs split off the whole GPU, lane 1's off what that split left, and so
/// on; a partition summing to 100 gives its last lane all that is left. So the lanes of
/// one partition hold disjoint SMs (separate splits of the whole GPU promise no such
/// thing). Thread-safe.
class green_partitions {
 public:
  explicit green_partitions(int ordinal);
  ~green_partitions();
  green_partitions(const green_partitions&) = delete;
  green_partitions& operator=(const green_partitions&) = delete;

  /// The stream of lane `lane` of `partition`. Errors: green contexts missing, shares
  /// outside 1..100 or summing past 100, a share too small for the GPU's smallest green
  /// context, a failed driver call (named).
  caf::expected<green_stream> stream(const std::vector<int32_t>& partition, size_t lane);

 private:
  struct chain;
  caf::expected<std::unique_ptr<chain>> split(const std::vector<int32_t>& partition);

  int ordinal_;
  std::mutex mtx_;
  std::map<std::vector<int32_t>, std::unique_ptr<chain>> chains_;
};

}  // namespace computron::gpu::cuda
