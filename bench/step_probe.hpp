#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

/// What one forward step costs beyond its arithmetic, measured around a call: the libtorch
/// ops it dispatched, the bytes it allocated, and (with the profiler) where its device time
/// went. Torch-free header; bench/step_probe.cpp is the only torch translation unit of it.
namespace computron::bench {

/// Counts of one call.
struct step_counts {
  /// aten ops dispatched on any thread (RecordFunction, scope FUNCTION), nested ones included.
  uint64_t ops = 0;
  /// Bytes allocated while it ran: libtorch's CPU allocator on a CPU or emulated device, the
  /// CUDA caching allocator's cumulative allocated bytes on a GPU.
  uint64_t alloc_bytes = 0;
};

/// Runs `step` once and counts what it dispatched and allocated. `cuda_device` is the CUDA
/// device index the step runs on, or -1 for the CPU.
caf::expected<step_counts> count_step(int cuda_device, const std::function<caf::error()>& step);

/// One row of a step's profile: on a GPU a kernel (or copy) by name, on the CPU an aten op.
struct profile_row {
  std::string name;
  int64_t count = 0;
  /// Summed duration. On the CPU ops nest, so a row includes the ops it called.
  double micros = 0;
  /// Of the summed durations of every row (the device's busy time on a GPU).
  double share = 0;
};

/// A step's profile, rows by time, longest first.
struct step_profile {
  std::vector<profile_row> rows;
  /// The sum of the rows' durations: device busy time on a GPU.
  double busy_micros = 0;
  /// The call's wall time.
  double wall_micros = 0;
  /// "cuda kernels" or "cpu ops".
  std::string what;
};

/// Profiles one call of `step` with libtorch's Kineto profiler (CUPTI on a GPU).
caf::expected<step_profile> profile_step(int cuda_device, const std::function<caf::error()>& step);

}  // namespace computron::bench
