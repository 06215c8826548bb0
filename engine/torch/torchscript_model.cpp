#include "engine/torch/torchscript_model.hpp"

#include <cstring>

#include <fmt/format.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "common/error.hpp"
#include "engine/torch/torch_interop.hpp"
#include "models/weights.hpp"

namespace computron::models {

using detail::from_torch;
using detail::to_torch;

struct torchscript_model::impl {
  torch::jit::Module module;
  std::unique_ptr<gpu::weight_shard> shard;
  at::Device device{at::kCPU};

  /// Points every parameter and buffer of the module at the shard's device copy.
  caf::error bind() {
    auto base = shard->device_data();
    if (!base) return with_context(base.error(), "TorchScript weights are not loaded");
    if (auto err = shard->wait_loaded(std::chrono::minutes{10})) return err;
    for (auto& e : shard->table().entries()) {
      auto view = detail::device_view(*base + e.offset_bytes, e.shape,
                                      at::TensorOptions().dtype(to_torch(e.type)).device(device));
      // "a.b.c": attribute c of submodule a.b.
      auto owner = module;
      std::string rest = e.name;
      for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
        owner = owner.attr(rest.substr(0, dot)).toModule();
        rest = rest.substr(dot + 1);
      }
      owner.setattr(rest, view);
    }
    return {};
  }
};

torchscript_model::torchscript_model(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
torchscript_model::~torchscript_model() = default;
gpu::weight_shard& torchscript_model::weights() {
  return *impl_->shard;
}

caf::expected<std::unique_ptr<torchscript_model>> torchscript_model::load(const std::string& path,
                                                                          gpu::device_ptr dev) {
  if (!dev) return make_error(ec::invalid_request, "TorchScript model without a device");
  auto p = std::make_unique<impl>();
  try {
    p->module = torch::jit::load(path, at::Device(at::kCPU));
    p->module.eval();
  } catch (const std::exception& e) {
    std::string what = e.what();
    return make_error(ec::invalid_request, fmt::format("cannot load TorchScript module {}: {}",
                                                       path, what.substr(0, what.find('\n'))));
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& np : p->module.named_parameters(true)) tensors.emplace_back(np.name, np.value);
  for (const auto& nb : p->module.named_buffers(true)) tensors.emplace_back(nb.name, nb.value);
  gpu::tensor_table table;
  for (auto& [name, t] : tensors) {
    auto type = from_torch(t.scalar_type(), name);
    if (!type) return std::move(type.error());
    if (auto err = table.add(name, *type, std::vector<int64_t>(t.sizes().begin(), t.sizes().end())))
      return err;
  }
  auto shard = gpu::weight_shard::create(dev, std::move(table));
  if (!shard) return std::move(shard.error());
  for (auto& [name, t] : tensors) {
    auto c = t.contiguous();
    std::memcpy((*shard)->host_tensor(name), c.data_ptr(), static_cast<size_t>(c.nbytes()));
  }
  p->shard = std::move(*shard);
  p->device = dev->info().kind == gpu::device_kind::cuda
                  ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(dev->info().ordinal))
                  : at::Device(at::kCPU);
  if (p->device.is_cuda()) p->module.to(p->device);
  return std::unique_ptr<torchscript_model>{new torchscript_model(std::move(p))};
}

caf::expected<host_tensor> torchscript_model::forward(const std::vector<host_tensor>& inputs) {
  auto& m = *impl_;
  if (auto err = m.bind()) return err;
  try {
    at::NoGradGuard no_grad;
    std::vector<c10::IValue> args;
    for (auto& in : inputs) {
      auto t = detail::from_host(in, m.device);
      if (!t) return std::move(t.error());
      args.emplace_back(std::move(*t));
    }
    auto out = m.module.forward(args);
    if (!out.isTensor())
      return make_error(ec::invalid_request, "the module did not return one tensor");
    return detail::to_host(out.toTensor());
  } catch (const std::exception& e) {
    std::string what = e.what();
    return make_error(ec::invalid_request, fmt::format("TorchScript forward failed: {}",
                                                       what.substr(0, what.find('\n'))));
  }
}

caf::expected<const void*> torchscript_model::parameter_address(const std::string& name) {
  if (auto err = impl_->bind()) return err;
  for (const auto& np : impl_->module.named_parameters(true))
    if (np.name == name) return static_cast<const void*>(np.value.data_ptr());
  for (const auto& nb : impl_->module.named_buffers(true))
    if (nb.name == name) return static_cast<const void*>(nb.value.data_ptr());
  return make_error(ec::invalid_request, fmt::format("no parameter '{}'", name));
}

caf::error write_demo_torchscript(const std::string& path, int64_t in, int64_t out, uint64_t seed) {
  if (in < 1 || out < 1) return make_error(ec::invalid_request, "demo module needs positive sizes");
  try {
    auto w = at::empty({out, in}, at::kFloat);
    auto b = at::empty({out}, at::kFloat);
    for (int64_t i = 0; i < out * in; ++i)
      w.data_ptr<float>()[i] =
          seeded_value(seed, "fc.weight", static_cast<uint64_t>(i), init_kind::weight);
    for (int64_t i = 0; i < out; ++i)
      b.data_ptr<float>()[i] =
          seeded_value(seed, "fc.bias", static_cast<uint64_t>(i), init_kind::bias);
    torch::jit::Module fc("fc");
    fc.register_parameter("weight", w, false);
    fc.register_parameter("bias", b, false);
    fc.define(R"(
def forward(self, x):
    return torch.matmul(x, self.weight.t()) + self.bias
)");
    torch::jit::Module top("demo");
    top.register_module("fc", fc);
    top.register_buffer("scale", at::full({1}, 2.0f));
    top.define(R"(
def forward(self, x):
    return torch.relu(self.fc.forward(x)) * self.scale
)");
    top.save(path);
    return {};
  } catch (const std::exception& e) {
    return make_error(ec::io_error, fmt::format("writing demo module {}: {}", path, e.what()));
  }
}

}  // namespace computron::models
