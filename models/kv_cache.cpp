// The KV cache of one stage for one batch: rows leave (keep_rows) and join (append) at
// step boundaries, and padding every row has outgrown is dropped. The forward that fills
// and reads it is decoder_stage.cpp's.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "common/error.hpp"
#include "models/decoder_block.hpp"
#include "models/decoder_stage.hpp"

namespace computron::models {

kv_cache::kv_cache() : impl_(std::make_unique<impl>()) {}
kv_cache::~kv_cache() = default;
kv_cache::kv_cache(kv_cache&&) noexcept = default;
kv_cache& kv_cache::operator=(kv_cache&&) noexcept = default;
int64_t kv_cache::length() const {
  return impl_->key_valid.defined() ? impl_->key_valid.size(1) : 0;
}

namespace {

/// Drops the leading positions no sequence holds a key at (left padding every row has
/// outgrown): a batch that lives on as rows leave and join (continuous batching) keeps
/// a cache as long as its longest row, not as old as the batch.
void trim_padding(detail::kv_cache_tensors& c) {
  if (!c.key_valid.defined() || c.key_valid.size(1) == 0) return;
  auto held = c.key_valid.any(0).to(at::kCPU);
  const auto len = held.size(0);
  auto* p = held.data_ptr<bool>();
  int64_t first = 0;
  while (first < len && !p[first]) ++first;
  if (first == 0) return;
  c.key_valid = c.key_valid.narrow(1, first, len - first).contiguous();
  for (auto& k : c.keys)
    if (k.defined()) k = k.narrow(2, first, len - first).contiguous();
  for (auto& v : c.values)
    if (v.defined()) v = v.narrow(2, first, len - first).contiguous();
}

}  // namespace

caf::error kv_cache::keep_rows(const std::vector<int64_t>& rows) {
  auto& c = *impl_;
  if (!c.key_valid.defined()) return {};
  const auto b = c.key_valid.size(0);
  for (auto r : rows)
    if (r < 0 || r >= b)
      return make_error(ec::invalid_request,
                        fmt::format("keep row {} is outside the batch of {}", r, b));
  try {
    auto index = at::tensor(rows, at::kLong).to(c.key_valid.device());
    c.key_valid = c.key_valid.index_select(0, index);
    for (auto& k : c.keys)
      if (k.defined()) k = k.index_select(0, index);
    for (auto& v : c.values)
      if (v.defined()) v = v.index_select(0, index);
    std::vector<int64_t> next;
    for (auto r : rows) next.push_back(c.next_position[static_cast<size_t>(r)]);
    c.next_position = std::move(next);
    trim_padding(c);
  } catch (const std::exception& e) {
    return make_error(ec::device_error, std::string{"dropping finished rows: "} + e.what());
  }
  return {};
}

caf::error kv_cache::append(kv_cache&& other) {
  auto& c = *impl_;
  auto& o = *other.impl_;
  if (!o.key_valid.defined()) return {};
  if (!c.key_valid.defined()) {
    std::swap(c, o);
    return {};
  }
  if (c.keys.size() != o.keys.size())
    return make_error(ec::invalid_request, fmt::format("joining caches of {} and {} layers",
                                                       c.keys.size(), o.keys.size()));
  try {
    const auto len = std::max(c.key_valid.size(1), o.key_valid.size(1));
    // Left padding: the last cached position of every row stays the last.
    auto pad = [len](const at::Tensor& t, int64_t dim) {
      auto missing = len - t.size(dim);
      if (missing == 0) return t;
      auto shape = t.sizes().vec();
      shape[static_cast<size_t>(dim)] = missing;
      return at::cat({at::zeros(shape, t.options()), t}, dim);
    };
    for (size_t l = 0; l < c.keys.size(); ++l) {
      if (c.keys[l].defined() != o.keys[l].defined())
        return make_error(ec::invalid_request, fmt::format("joining caches: layer {} is cached "
                                                           "in one of them only",
                                                           l));
      if (!c.keys[l].defined()) continue;
      c.keys[l] = at::cat({pad(c.keys[l], 2), pad(o.keys[l], 2)}, 0);
      c.values[l] = at::cat({pad(c.values[l], 2), pad(o.values[l], 2)}, 0);
    }
    c.key_valid = at::cat({pad(c.key_valid, 1), pad(o.key_valid, 1)}, 0);
    c.next_position.insert(c.next_position.end(), o.next_position.begin(), o.next_position.end());
    trim_padding(c);
  } catch (const std::exception& e) {
    return make_error(ec::device_error, std::string{"joining caches: "} + e.what());
  }
  other = kv_cache{};
  return {};
}

}  // namespace computron::models
