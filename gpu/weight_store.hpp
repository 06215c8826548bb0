#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpu/device.hpp"

/// The weight store: a model shard's parameters as one contiguous, aligned host buffer
/// plus a table of named tensors, loaded onto a device into one address range in chunks.
/// It knows nothing of models; models build their tensors as views over it.
namespace computron::gpu {

/// Element types of stored tensors.
enum class dtype : uint8_t { f32, f16, bf16, i64, i32, i8, u8 };

/// "f32", "bf16", ...
const char* to_string(dtype t);

/// A floating-point weight type by name: "f32"/"fp32", "bf16", "f16"/"fp16".
/// Errors: anything else (invalid_request, naming the accepted values).
caf::expected<dtype> parse_weight_dtype(std::string_view name);

/// Bytes per element.
uint64_t size_of(dtype t);

/// One named tensor inside a shard's buffer.
struct tensor_entry {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  /// Offset from the start of the shard buffer; a multiple of tensor_table::alignment,
  /// except for a tensor added `packed` (right after the one before it).
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
};

/// The layout of a shard: tensors packed in insertion order, each aligned.
class tensor_table {
 public:
  /// Every tensor starts on this boundary (vectorised device loads, from_blob views),
  /// except one added `packed`, which starts right after the one before it.
  static constexpr uint64_t alignment = 256;

  /// Appends a tensor. `packed`: right after the tensor before it, with no padding, so
  /// that both read as one tensor in place (a layer's q, k and v weights, fused into one
  /// product); it is aligned to its element only. Errors: empty or duplicate name,
  /// negative dimension, byte size overflowing 64 bits.
  caf::error add(std::string name, dtype type, std::vector<int64_t> shape, bool packed = false);

  /// The tensor called `name`, or null.
  const tensor_entry* find(std::string_view name) const;

  const std::vector<tensor_entry>& entries() const { return entries_; }

  /// Bytes of the whole buffer, padding included.
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  std::vector<tensor_entry> entries_;
  std::unordered_map<std::string, size_t> index_;
  uint64_t total_bytes_ = 0;
};

/// Where a shard's weights are (Triton's model lifecycle, per shard).
enum class residency : uint8_t { offloaded, loading, resident, evicting };

/// "offloaded", "loading", "resident" or "evicting".
const char* to_string(residency r);

/// How a load moves the bytes.
struct load_options {
  /// Bytes per copy (one event each); tens of MB keeps the link busy while letting a
  /// consumer start on early layers.
  uint64_t chunk_bytes = 32ull << 20;
};

/// Seconds this thread has spent blocked in weight_shard::wait_bytes (for every shard):
/// a forward step subtracts them, so its compute time is compute, not a load's tail.
double thread_wait_seconds();

/// One model shard on one device. The host buffer is written once at registration and
/// never rewritten: eviction frees the device copy and copies nothing back. Thread-safe.
class weight_shard {
 public:
  /// Allocates the host buffer (pinned where possible) for `table`. Errors: an empty
  /// table, host allocation failure.
  static caf::expected<std::unique_ptr<weight_shard>> create(device_ptr dev, tensor_table table);

  /// Waits (bounded) for copies still in flight, so no copy reads freed memory.
  ~weight_shard();

  weight_shard(const weight_shard&) = delete;
  weight_shard& operator=(const weight_shard&) = delete;

  const tensor_table& table() const { return table_; }
  device& dev() const { return *dev_; }
  uint64_t size_bytes() const { return table_.total_bytes(); }

  /// The host copy; write the weights here before the first load.
  std::byte* host_data() const { return host_.data(); }
  bool host_pinned() const { return host_.pinned(); }
  /// Host address of a tensor, or null for an unknown name.
  std::byte* host_tensor(std::string_view name) const;

  /// Starts the load: pages mapped into the shard's address range (the same addresses at
  /// every load), then chunked asynchronous copies.
  /// Returns once the copies are queued. Errors: not offloaded (already loading or
  /// resident), a bad chunk size, not enough device memory (nothing is copied then).
  caf::error load(const load_options& opts = {});

  /// Waits until every chunk arrived; then the shard is resident. Errors: not loading
  /// or resident, a failed copy (the shard is offloaded again), timeout.
  caf::error wait_loaded(std::chrono::milliseconds timeout);

  /// Waits until the first `bytes` bytes are on the device (pipelined use: layer i can
  /// start while later layers still arrive).
  caf::error wait_bytes(uint64_t bytes, std::chrono::milliseconds timeout);

  /// Length of the prefix already on the device; non-blocking.
  uint64_t ready_bytes();

  /// Chunks of the current load (0 when not loading or resident) and whether chunk i
  /// arrived; chunks arrive in order.
  size_t chunk_count() const;
  bool chunk_ready(size_t i);

  /// Unmaps the device copy's pages; copies nothing back and keeps the addresses. Errors:
  /// not resident (offloaded, or still loading: wait for the load first).
  caf::error evict();

  /// Current state; a load whose chunks all arrived counts as resident.
  residency state();

  /// Copies `bytes` of the device copy at `offset` back into `dst` (tests, benchmark
  /// verification; never part of eviction). Errors: not resident, a bad range.
  caf::error read_back(uint64_t offset, void* dst, uint64_t bytes);

  /// Device address of the shard (valid while loading or resident), else an error. The
  /// same at every load: the range is reserved once, at create.
  caf::expected<std::byte*> device_data();
  /// The device address the shard is loaded at, resident or not (reserved at create):
  /// what a captured CUDA graph holds, valid again at every load.
  std::byte* reserved_address() const { return static_cast<std::byte*>(device_copy_.data()); }

 private:
  weight_shard(device_ptr dev, tensor_table table, host_buffer host, device_allocation range);
  void refresh_locked();
  caf::error finish_locked();

  mutable std::mutex mtx_;
  device_ptr dev_;
  tensor_table table_;
  host_buffer host_;
  residency state_ = residency::offloaded;
  device_allocation device_copy_;
  std::vector<copy_event_ptr> chunks_;
  /// End offset of each chunk: chunk i covers [chunk_end_[i-1], chunk_end_[i]).
  std::vector<uint64_t> chunk_end_;
  /// Chunks known to have arrived (a prefix: copies complete in order).
  size_t ready_chunks_ = 0;
  /// Why the last load failed, for the waiter that finds the shard offloaded again.
  caf::error failure_;
};

}  // namespace computron::gpu
