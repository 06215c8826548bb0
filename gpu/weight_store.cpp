#include "gpu/weight_store.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::gpu {

caf::expected<dtype> parse_weight_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32") return dtype::f32;
  if (name == "bf16") return dtype::bf16;
  if (name == "f16" || name == "fp16") return dtype::f16;
  return make_error(ec::invalid_request,
                    "dtype must be f32, bf16 or f16, got '" + std::string{name} + "'");
}

const char* to_string(dtype t) {
  switch (t) {
    case dtype::f32:
      return "f32";
    case dtype::f16:
      return "f16";
    case dtype::bf16:
      return "bf16";
    case dtype::i64:
      return "i64";
    case dtype::i32:
      return "i32";
    case dtype::i8:
      return "i8";
    case dtype::u8:
      return "u8";
  }
  return "unknown";
}

uint64_t size_of(dtype t) {
  switch (t) {
    case dtype::f32:
      return 4;
    case dtype::f16:
      return 2;
    case dtype::bf16:
      return 2;
    case dtype::i64:
      return 8;
    case dtype::i32:
      return 4;
    case dtype::i8:
      return 1;
    case dtype::u8:
      return 1;
  }
  return 1;
}

const char* to_string(residency r) {
  switch (r) {
    case residency::offloaded:
      return "offloaded";
    case residency::loading:
      return "loading";
    case residency::resident:
      return "resident";
    case residency::evicting:
      return "evicting";
  }
  return "unknown";
}

caf::error tensor_table::add(std::string name, dtype type, std::vector<int64_t> shape,
                             bool packed) {
  if (name.empty()) return make_error(ec::invalid_request, "tensor name is empty");
  if (index_.count(name) > 0)
    return make_error(ec::invalid_request, fmt::format("duplicate tensor '{}'", name));
  constexpr auto max = std::numeric_limits<uint64_t>::max();
  uint64_t bytes = size_of(type);
  for (auto d : shape) {
    if (d < 0)
      return make_error(ec::invalid_request, fmt::format("tensor '{}' has a negative dimension "
                                                         "in shape [{}]",
                                                         name, fmt::join(shape, ", ")));
    if (d > 0 && bytes > max / static_cast<uint64_t>(d))
      return make_error(ec::invalid_request, fmt::format("tensor '{}' is too large", name));
    bytes *= static_cast<uint64_t>(d);
  }
  auto offset = packed ? align_up(total_bytes_, size_of(type)) : align_up(total_bytes_, alignment);
  if (offset < total_bytes_ || bytes > max - offset - alignment)
    return make_error(ec::invalid_request, fmt::format("tensor '{}' overflows the shard", name));
  index_.emplace(name, entries_.size());
  entries_.push_back(tensor_entry{std::move(name), type, std::move(shape), offset, bytes});
  total_bytes_ = offset + bytes;
  return {};
}

const tensor_entry* tensor_table::find(std::string_view name) const {
  auto i = index_.find(std::string{name});
  return i == index_.end() ? nullptr : &entries_[i->second];
}

caf::expected<std::unique_ptr<weight_shard>> weight_shard::create(device_ptr dev,
                                                                  tensor_table table) {
  if (!dev) return make_error(ec::invalid_request, "weight shard without a device");
  if (table.total_bytes() == 0)
    return make_error(ec::invalid_request, "a weight shard needs at least one byte of tensors");
  auto host = dev->allocate_host(table.total_bytes());
  if (!host) return std::move(host.error());
  // The shard's device addresses, for its lifetime: loads map pages into them.
  auto range = dev->reserve(table.total_bytes());
  if (!range) return std::move(range.error());
  return std::unique_ptr<weight_shard>{
      new weight_shard(std::move(dev), std::move(table), std::move(*host), std::move(*range))};
}

weight_shard::weight_shard(device_ptr dev, tensor_table table, host_buffer host,
                           device_allocation range)
    : dev_(std::move(dev)),
      table_(std::move(table)),
      host_(std::move(host)),
      device_copy_(std::move(range)) {}

weight_shard::~weight_shard() {
  // Copies still queued read host_ and write device_copy_: let them finish first.
  std::vector<copy_event_ptr> pending;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    pending = chunks_;
  }
  for (auto& ev : pending) {
    if (auto err = ev->wait(std::chrono::minutes{5}))
      log::error("weight shard on {} destroyed during a load: {}", dev_->info().name, render(err));
  }
}

std::byte* weight_shard::host_tensor(std::string_view name) const {
  auto e = table_.find(name);
  return e == nullptr ? nullptr : host_.data() + e->offset_bytes;
}

caf::error weight_shard::load(const load_options& opts) {
  std::lock_guard<std::mutex> guard{mtx_};
  refresh_locked();
  if (state_ != residency::offloaded)
    return make_error(ec::invalid_state,
                      fmt::format("cannot load a shard of {} bytes on {}: it is {}", size_bytes(),
                                  dev_->info().name, to_string(state_)));
  if (opts.chunk_bytes == 0)
    return make_error(ec::invalid_request, "chunk size must be at least 1 byte");
  // Capacity is checked here, before a single byte moves.
  if (auto err = device_copy_.map()) return err;
  failure_ = caf::error{};
  chunks_.clear();
  chunk_end_.clear();
  ready_chunks_ = 0;
  for (uint64_t off = 0; off < size_bytes(); off += opts.chunk_bytes) {
    auto n = std::min(opts.chunk_bytes, size_bytes() - off);
    auto ev = dev_->copy_to_device_async(device_copy_, off, host_.data() + off, n);
    if (!ev) {
      // Let the chunks already queued drain before the memory they target goes away.
      for (auto& queued : chunks_) queued->wait(std::chrono::minutes{5});
      chunks_.clear();
      chunk_end_.clear();
      device_copy_.unmap();
      return std::move(ev.error());
    }
    chunks_.push_back(std::move(*ev));
    chunk_end_.push_back(off + n);
  }
  state_ = residency::loading;
  return {};
}

void weight_shard::refresh_locked() {
  if (state_ != residency::loading) return;
  while (ready_chunks_ < chunks_.size() && chunks_[ready_chunks_]->ready()) ++ready_chunks_;
  if (ready_chunks_ == chunks_.size()) finish_locked();
}

caf::error weight_shard::finish_locked() {
  // All events fired; any of them may carry an error.
  for (auto& ev : chunks_) {
    if (auto err = ev->wait(std::chrono::milliseconds{0})) {
      failure_ = err;
      break;
    }
  }
  chunks_.clear();
  chunk_end_.clear();
  ready_chunks_ = 0;
  if (failure_) {
    device_copy_.unmap();
    state_ = residency::offloaded;
    return failure_;
  }
  state_ = residency::resident;
  return {};
}

caf::error weight_shard::wait_loaded(std::chrono::milliseconds timeout) {
  return wait_bytes(size_bytes(), timeout);
}

namespace {
thread_local double waited_s = 0;
}  // namespace

double thread_wait_seconds() {
  return waited_s;
}

caf::error weight_shard::wait_bytes(uint64_t bytes, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<copy_event_ptr> waits;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (bytes > size_bytes())
      return make_error(ec::invalid_request, fmt::format("waiting for {} bytes of a {}-byte shard",
                                                         bytes, size_bytes()));
    refresh_locked();
    if (state_ == residency::resident || (bytes == 0 && state_ == residency::loading)) return {};
    if (state_ != residency::loading)
      return failure_
                 ? failure_
                 : make_error(ec::not_resident, fmt::format("shard on {} is {}, not loading",
                                                            dev_->info().name, to_string(state_)));
    auto last = std::lower_bound(chunk_end_.begin(), chunk_end_.end(), bytes) - chunk_end_.begin();
    waits.assign(chunks_.begin() + static_cast<ptrdiff_t>(ready_chunks_),
                 chunks_.begin() + std::max<ptrdiff_t>(last + 1, ready_chunks_));
  }
  auto t0 = std::chrono::steady_clock::now();
  for (auto& ev : waits) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (auto err = ev->wait(std::max(left, std::chrono::milliseconds{0}))) return err;
  }
  waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> guard{mtx_};
  refresh_locked();
  if (state_ == residency::offloaded && failure_) return failure_;
  return {};
}

uint64_t weight_shard::ready_bytes() {
  std::lock_guard<std::mutex> guard{mtx_};
  refresh_locked();
  if (state_ == residency::resident) return size_bytes();
  if (state_ != residency::loading || ready_chunks_ == 0) return 0;
  return chunk_end_[ready_chunks_ - 1];
}

size_t weight_shard::chunk_count() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return chunks_.size();
}

bool weight_shard::chunk_ready(size_t i) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (state_ == residency::resident) return true;
  if (i >= chunks_.size()) return false;
  while (ready_chunks_ < chunks_.size() && chunks_[ready_chunks_]->ready()) ++ready_chunks_;
  return i < ready_chunks_;
}

caf::error weight_shard::evict() {
  std::lock_guard<std::mutex> guard{mtx_};
  refresh_locked();
  if (state_ == residency::loading)
    return make_error(ec::invalid_state, fmt::format("cannot evict the shard on {} while it is "
                                                     "loading: wait for the load first",
                                                     dev_->info().name));
  if (state_ != residency::resident)
    return make_error(ec::not_resident, fmt::format("cannot evict the shard on {}: it is {}",
                                                    dev_->info().name, to_string(state_)));
  state_ = residency::evicting;
  device_copy_.unmap();  // gives the pages back; the host copy is still current
  state_ = residency::offloaded;
  return {};
}

residency weight_shard::state() {
  std::lock_guard<std::mutex> guard{mtx_};
  refresh_locked();
  return state_;
}

caf::error weight_shard::read_back(uint64_t offset, void* dst, uint64_t bytes) {
  std::lock_guard<std::mutex> guard{mtx_};
  refresh_locked();
  if (state_ != residency::resident)
    return make_error(ec::not_resident, fmt::format("cannot read back the shard on {}: it is {}",
                                                    dev_->info().name, to_string(state_)));
  return dev_->copy_to_host(dst, device_copy_, offset, bytes);
}

caf::expected<std::byte*> weight_shard::device_data() {
  std::lock_guard<std::mutex> guard{mtx_};
  refresh_locked();
  if (state_ != residency::loading && state_ != residency::resident)
    return make_error(ec::not_resident,
                      fmt::format("shard on {} is {}", dev_->info().name, to_string(state_)));
  return static_cast<std::byte*>(device_copy_.data());
}

}  // namespace computron::gpu
