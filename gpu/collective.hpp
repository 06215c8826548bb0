#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/error.hpp>
#include <caf/expected.hpp>

namespace computron::gpu {

/// A tensor-parallel group's collective: the sum of a buffer over every rank, left on
/// every rank. NCCL on GPUs (gpu/cuda), Gloo on CPUs (engine/torch/gloo_collective). Calls are
/// blocking and every rank must make the same calls in the same order.
class collective {
 public:
  virtual ~collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// In place: `data` (host memory for Gloo, device memory for NCCL) becomes the
  /// element-wise sum over the group.
  virtual caf::error all_reduce_sum(float* data, uint64_t count) = 0;
};

/// The group of one: all_reduce_sum leaves the data as it is (tp = 1).
std::unique_ptr<collective> make_solo_collective();

/// Joins the in-process group `name` as `rank` of `size`: ranks in different threads of
/// one process (shard workers of one node) sum through shared memory, no sockets. The
/// group exists while any rank holds it; a rank that waits longer than `timeout` for
/// the others breaks the group (every later call fails) instead of hanging forever.
/// Errors: a bad rank or size, a size or rank that disagrees with the group's.
caf::expected<std::unique_ptr<collective>> join_local_group(const std::string& name, int rank,
                                                            int size,
                                                            std::chrono::milliseconds timeout);

/// Groups whose ranks live in different processes: one rank's worker hosts a
/// rendezvous point, its address travels to the others in CAF messages, and each joins.
/// Implemented with Gloo (engine/torch/gloo_collective); processes built without it have none.
class group_provider {
 public:
  virtual ~group_provider() = default;
  /// Hosts the rendezvous of a group of `size` ranks on `host` (any free port); the
  /// provider keeps it alive. Returns the address the ranks meet at, "host:port".
  virtual caf::expected<std::string> host(const std::string& host, int size,
                                          std::chrono::milliseconds timeout) = 0;
  /// Joins group `name` at `address` as `rank` of `size`, the transport bound to
  /// `bind_host`. Blocks until every rank joined or `timeout` passed.
  virtual caf::expected<std::unique_ptr<collective>> join(const std::string& address,
                                                          const std::string& name, int rank,
                                                          int size, const std::string& bind_host,
                                                          std::chrono::milliseconds timeout) = 0;
};

/// NCCL group over GPUs. `unique_id` comes from rank 0's nccl_unique_id() and is handed
/// to every rank by the caller (later: in CAF messages). Errors: no CUDA in this build,
/// NCCL failures with NCCL's message.
caf::expected<std::string> nccl_unique_id();
caf::expected<std::unique_ptr<collective>> make_nccl_collective(const std::string& unique_id,
                                                                int rank, int size, int device);

}  // namespace computron::gpu
