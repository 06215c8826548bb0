#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "engine/torch/decoder_stage.hpp"
#include "gpu/weight_store.hpp"

/// The second model kind: a single-shard TorchScript module (torch::jit::load). Its
/// parameters and buffers move into one weight shard at registration, so it swaps like
/// any other shard; the forward pass binds them as views of the shard's device copy.
namespace computron::models {

class torchscript_model {
 public:
  /// Loads the module at `path` and lays its tensors out in a weight shard on `dev` (the
  /// host copy; call weights().load() to bring it to the device). Errors: a missing or
  /// corrupt file, tensors of a dtype the weight store has no name for.
  static caf::expected<std::unique_ptr<torchscript_model>> load(const std::string& path,
                                                                gpu::device_ptr dev);
  ~torchscript_model();

  gpu::weight_shard& weights();

  /// Runs forward(inputs...) and returns its tensor result. Errors: weights not loaded,
  /// inputs the module rejects (its message), a result that is not one tensor.
  caf::expected<host_tensor> forward(const std::vector<host_tensor>& inputs);

  /// Where forward reads parameter `name` from (tests: the shard's device copy).
  caf::expected<const void*> parameter_address(const std::string& name);

 private:
  struct impl;
  explicit torchscript_model(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Writes a small scripted module for examples and tests, y = relu(x @ fc.weight^T +
/// fc.bias) * scale, with fc.weight [out, in] and fc.bias [out] seeded like OPT weights
/// (seeded_value with init_kind weight and bias) and the buffer scale = 2.
caf::error write_demo_torchscript(const std::string& path, int64_t in, int64_t out, uint64_t seed);

}  // namespace computron::models
