#include "engine/torch/device_sampling.hpp"

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

namespace computron::models::detail {

namespace {

at::Tensor draw_group(const at::Tensor& logits_in, const std::vector<device_draw>& draws) {
  const auto n = logits_in.size(0), vocab = logits_in.size(1);
  const auto dev = logits_in.device();
  constexpr double neg_inf = -std::numeric_limits<double>::infinity();
  // A copy in f32 (the host sampler's logits are f32): the caller's tensor stays as it is.
  // (nan_to_num would turn the infinities into the largest finite numbers unless told not to.)
  auto logits = logits_in.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                    .nan_to_num_(neg_inf, -neg_inf, neg_inf);
  auto greedy = logits.argmax(1, /*keepdim=*/true);  // the first maximum
  auto greedy_logit = logits.gather(1, greedy);
  bool any_sampled = std::any_of(draws.begin(), draws.end(),
                                 [](const device_draw& d) { return d.temperature > 0; });
  if (!any_sampled) return at::stack({greedy_logit, greedy.to(at::kFloat)}, 2);

  // The rows' parameters, one small copy to the device per step.
  std::vector<double> given, temperature, top_p, min_p, uniform;
  std::vector<int64_t> top_k;
  for (const auto& d : draws) {
    given.push_back(d.temperature);
    // Greedy rows go through the draw with a temperature of 1; their result is dropped.
    temperature.push_back(d.temperature > 0 ? d.temperature : 1.0);
    top_k.push_back(d.top_k > 0 ? std::min(d.top_k, vocab) : vocab);
    top_p.push_back(d.top_p);
    min_p.push_back(d.min_p);
    uniform.push_back(d.uniform);
  }
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto column = [&](const std::vector<double>& v) {
    return at::tensor(v, f64).to(dev).view({n, 1});
  };
  auto t = column(temperature), p = column(top_p), mp = column(min_p), u = column(uniform);
  auto k = at::tensor(top_k, at::kLong).to(dev).view({n, 1});
  auto sampled_rows = column(given) > 0;

  // Most likely first; a stable sort keeps equal logits in id order, as the host's does.
  // Working tensors of [rows, vocab] are few and updated in place (the double ones cost 8
  // bytes a logit): the sorted values and ids, one in double, one more while the mass is
  // summed, and masks.
  auto sorted = logits.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
  logits = at::Tensor{};
  const auto& values = std::get<0>(sorted);
  const auto& ids = std::get<1>(sorted);
  auto probs = values.to(at::kDouble).div_(t);  // the scaled logits, then the host's probs
  auto top = probs.narrow(1, 0, 1).clone();
  probs.sub_(top).exp_();  // the host's probs before normalising
  auto rank = at::arange(vocab, at::TensorOptions().dtype(at::kLong).device(dev)).view({1, vocab});
  // min_p cuts a prefix within top_k (the sorted row's ratios only fall), keeping at least one.
  auto over_min = ((probs >= mp) & (rank < k)).sum(1, /*keepdim=*/true).clamp_min(1);
  auto keep = at::where(mp > 0, over_min, k);
  probs.masked_fill_(rank >= keep, 0.0);
  auto sum = probs.sum(1, /*keepdim=*/true);
  // Nucleus: the shortest prefix whose mass reaches top_p (all that is kept otherwise).
  at::Tensor nucleus;
  {
    auto mass = probs.div(sum).cumsum_(1);
    auto reached = mass.ge_(p).to(at::kBool) & (rank < keep);
    nucleus = at::where(reached.any(1, /*keepdim=*/true),
                        reached.to(at::kByte).argmax(1, /*keepdim=*/true) + 1, keep);
  }
  auto in_nucleus = rank < nucleus;
  probs.masked_fill_(in_nucleus.logical_not(), 0.0);
  // The last candidate that can be drawn at all (never a probability-0 one at the tail):
  // where rounding leaves r past every running sum.
  auto drawable = probs > 0;
  auto last_drawable =
      at::where(drawable.any(1, /*keepdim=*/true),
                (vocab - 1) - drawable.flip({1}).to(at::kByte).argmax(1, /*keepdim=*/true),
                at::zeros({n, 1}, at::TensorOptions().dtype(at::kLong).device(dev)));
  auto running = probs.cumsum_(1);
  auto total = running.gather(1, nucleus - 1);
  auto r = u * total;
  // The first candidate whose running sum passes r.
  auto hit = (running > r) & in_nucleus;
  auto pick = at::where(hit.any(1, /*keepdim=*/true), hit.to(at::kByte).argmax(1, /*keepdim=*/true),
                        last_drawable);
  // Everything at -inf: no distribution to draw from, the first id (and no number used).
  pick = at::where(top == neg_inf, at::zeros_like(pick), pick);
  auto token = at::where(sampled_rows, ids.gather(1, pick), greedy);
  auto logit = at::where(sampled_rows, values.gather(1, pick), greedy_logit);
  return at::stack({logit, token.to(at::kFloat)}, 2);
}

}  // namespace

at::Tensor draw_on_device(const at::Tensor& logits, const std::vector<device_draw>& draws) {
  const auto n = logits.size(0), vocab = std::max<int64_t>(logits.size(1), 1);
  // About 30 bytes a logit at the peak: 2M logits a group keeps a draw near 64 MB at any
  // batch (13 rows of a 152k vocabulary at a time).
  const int64_t group = std::max<int64_t>(1, (int64_t{1} << 21) / vocab);
  if (n <= group) return draw_group(logits, draws);
  std::vector<at::Tensor> parts;
  for (int64_t begin = 0; begin < n; begin += group) {
    auto rows = std::min(group, n - begin);
    std::vector<device_draw> some(draws.begin() + begin, draws.begin() + begin + rows);
    parts.push_back(draw_group(logits.narrow(0, begin, rows), some));
  }
  return at::cat(parts, 0);
}

}  // namespace computron::models::detail

namespace computron::models {

caf::expected<std::vector<std::pair<float, int64_t>>> draw_tokens(
    const std::vector<float>& logits, int64_t rows, int64_t vocab,
    const std::vector<device_draw>& draws, int cuda_ordinal) {
  if (rows < 1 || vocab < 1 || logits.size() != static_cast<size_t>(rows * vocab) ||
      draws.size() != static_cast<size_t>(rows))
    return make_error(ec::invalid_request,
                      "draw_tokens: logits must be rows x vocab, one draw a row");
  try {
    auto device = cuda_ordinal >= 0
                      ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_ordinal))
                      : at::Device(at::kCPU);
    auto t = at::from_blob(const_cast<float*>(logits.data()), {rows, vocab}, at::kFloat)
                 .to(device, /*non_blocking=*/false, /*copy=*/true);
    auto picked = detail::draw_on_device(t, draws);
    if (picked.device() != device)
      return make_error(ec::invalid_state, "draw_tokens: the draw left its device");
    // The caller's logits are not touched: the copy on the device must be as it was.
    auto host = picked.to(at::kCPU).contiguous();
    std::vector<std::pair<float, int64_t>> out;
    const float* p = host.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r)
      out.emplace_back(p[r * 2], static_cast<int64_t>(p[r * 2 + 1]));
    return out;
  } catch (const std::exception& e) {
    return make_error(ec::device_error, std::string{"draw_tokens: "} + e.what());
  }
}

}  // namespace computron::models
