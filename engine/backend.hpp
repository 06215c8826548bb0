#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "common/error.hpp"
#include "engine/step.hpp"
#include "gpu/weight_store.hpp"
#include "models/host_tensor.hpp"
#include "models/sampling.hpp"

/// A backend runs steps of one shard: its forward pass over the shard's weights and caches.
/// The runner (engine/runner.hpp) drives it. The backends are sibling folders: the decoder
/// over libtorch ops (engine/torch/decoder_backend.hpp, every device) and the toy
/// (engine/toy/). Another one, such as CUDA graphs over the kernels of engine/cuda/, is one
/// more sibling and changes no caller.
namespace computron::engine {

/// One shard's compute. Not thread-safe: its runner's caller (a worker's compute lane) is
/// the only one.
class backend {
 public:
  virtual ~backend() = default;

  /// Runs `in` on this shard. `keep` (decode steps) says which rows of the batch's previous
  /// step go on, by their positions in it, in order; empty: all of them (the runner derives
  /// it from the plan's row keys). `tables`: each row's KV block table after the step, in
  /// the plan's order, covering its positions then (the runner's, from the plans' ids).
  /// `hidden` is the previous stage's output (null on the first stage). Returns hidden
  /// states for the next stage, or on the last stage the logits of each row's next token,
  /// [rows, vocab] f32 (or candidates, [rows, k, 2]).
  /// `draws` (the last stage's sampling rank only; null elsewhere): one per row, in the
  /// plan's order, when every row's next token can be drawn where the logits lie
  /// (models::sampler::next_device_draw), else empty. A backend may then return each row's
  /// drawn token as its one candidate ([rows, 1, 2]); one that ignores them returns logits
  /// as before, and the samplers draw the same tokens from either.
  virtual caf::expected<models::host_tensor> run(
      const step_input& in, const std::vector<int32_t>& keep,
      const std::vector<std::vector<uint32_t>>& tables, const models::host_tensor* hidden,
      const std::vector<models::device_draw>* draws = nullptr) = 0;

  /// Work done once before the first step, off the request path (the shard worker calls
  /// it on the compute lane after registration's warm-up): the decoder captures its CUDA
  /// graphs. A backend that cannot prepare still serves (eagerly); the error is logged.
  virtual caf::error prepare() { return {}; }

  /// Forgets a batch's caches. Unknown and repeated ids are ignored: the runner ends a
  /// batch after its last step or an error whatever the backend did itself.
  virtual void end_batch(uint64_t batch) = 0;

  /// Bytes of device pages its KV pool holds now (0: none, or no pool).
  virtual uint64_t kv_device_bytes() const { return 0; }

  /// Appends batch `from`'s rows (just prefilled) after batch `into`'s, whose next step
  /// then runs them all; `from` is gone. Continuous batching: requests join a running
  /// batch at a step boundary. Stateless backends have nothing to join.
  virtual caf::error join_batch(uint64_t from, uint64_t into) { return {}; }

  /// Makes LoRA adapter `name` (its shard for this backend's shard, as the model kind laid
  /// it out and filled it) available to the rows that name it (step_input::adapters). The
  /// backend keeps `weights` alive while bound; the same shard again is a no-op, another
  /// one under the name replaces it (the old one's rows fail clearly, none reads freed
  /// memory). Errors: kinds without adapters, a shard that is not an adapter of this one.
  virtual caf::error bind_adapter(const std::string& name,
                                  std::shared_ptr<gpu::weight_shard> weights) {
    return make_error(ec::invalid_request, "this model kind runs no LoRA adapters (" + name + ")");
  }

  /// Forgets adapter `name` (unregistered); unknown names are ignored.
  virtual void unbind_adapter(const std::string& name) {}
};

}  // namespace computron::engine
