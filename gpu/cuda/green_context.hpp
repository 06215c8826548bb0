#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <caf/error.hpp>
#include <caf/expected.hpp>

/// Gpu-lets on a GPU: CUDA green contexts, each holding a share of the GPU's SMs, and a
/// stream in each that a compute lane's forwards run on. The driver calls are looked up
/// through the runtime (cudaGetDriverEntryPointByVersion), not linked: a binary built
/// here must still start where there is no driver at all.
namespace computron::gpu::cuda {

/// Why green contexts cannot be used on this machine (the first driver call missing, or
/// the driver too old), or none.
caf::error green_contexts_available();

/// What one gpu-let got: its stream and the SMs it holds.
struct green_stream {
  void* stream = nullptr;  // a cudaStream_t
  unsigned sms = 0;
  unsigned first_sm = 0;
};

/// The green contexts of one GPU, created on first use and kept until it closes. A
/// gpu-let is named by where its SMs start and how many it holds, in percent of the
/// GPU's; the same pair always gives the same SMs, and gpu-lets side by side (offsets the
/// sums of the shares before them) get disjoint SMs. Thread-safe.
class green_partitions {
 public:
  explicit green_partitions(int ordinal);
  ~green_partitions();
  green_partitions(const green_partitions&) = delete;
  green_partitions& operator=(const green_partitions&) = delete;

  /// The stream of the gpu-let holding `share` percent of the SMs from `offset` percent
  /// on (rounded to the SM granularity the GPU allows). Errors: green contexts missing, a
  /// share too small for the GPU's smallest partition, a failed driver call (named).
  caf::expected<green_stream> stream(int32_t offset, int32_t share);

  /// The GPU's SMs (0 until the first stream was asked for).
  unsigned total_sms() const;

 private:
  struct entry;
  int ordinal_;
  mutable std::mutex mtx_;
  unsigned total_sms_ = 0;
  std::map<std::pair<unsigned, unsigned>, std::unique_ptr<entry>> entries_;
};

}  // namespace computron::gpu::cuda
