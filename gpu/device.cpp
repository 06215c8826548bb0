#include "gpu/device.hpp"

#include <utility>

#include <fmt/format.h>

#include "common/error.hpp"

namespace computron::gpu {

const char* to_string(device_kind kind) {
  switch (kind) {
    case device_kind::emulated:
      return "emulated";
    case device_kind::cuda:
      return "cuda";
  }
  return "unknown";
}

device_allocation& device_allocation::operator=(device_allocation&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::move(other.owner_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
    accounted_ = std::exchange(other.accounted_, 0);
  }
  return *this;
}

void device_allocation::reset() {
  if (ptr_ != nullptr) {
    owner_->do_release(ptr_, size_);
    owner_->used_bytes_ -= accounted_;
  }
  owner_.reset();
  ptr_ = nullptr;
  size_ = 0;
  accounted_ = 0;
}

device_stats device::stats() const {
  return {bytes_to_device_.load(), bytes_to_host_.load(),      copies_to_device_.load(),
          copies_to_host_.load(),  native_allocations_.load(), native_frees_.load()};
}

caf::expected<host_buffer> device::allocate_host(uint64_t bytes) {
  if (bytes == 0)
    return make_error(ec::invalid_request, "cannot allocate a host buffer of 0 bytes");
  return do_allocate_host(bytes);
}

caf::expected<device_allocation> device::allocate(uint64_t bytes) {
  if (bytes == 0)
    return make_error(ec::invalid_request,
                      fmt::format("cannot allocate 0 bytes on {}", info_.name));
  auto accounted = align_up(bytes, granularity);
  {
    // Reserve the bytes first so that concurrent allocations cannot both pass the check.
    std::lock_guard<std::mutex> guard{alloc_mtx_};
    auto used = used_bytes_.load();
    if (accounted > info_.capacity_bytes || used + accounted > info_.capacity_bytes)
      return make_error(ec::out_of_device_memory,
                        fmt::format("{} bytes requested on {}, {} free of {}", bytes, info_.name,
                                    info_.capacity_bytes - used, info_.capacity_bytes));
    used_bytes_ += accounted;
  }
  auto ptr = do_allocate(bytes);
  if (!ptr) {
    used_bytes_ -= accounted;
    return std::move(ptr.error());
  }
  device_allocation result;
  result.owner_ = shared_from_this();
  result.ptr_ = *ptr;
  result.size_ = bytes;
  result.accounted_ = accounted;
  return result;
}

caf::error device::check_range(const device_allocation& a, uint64_t offset, uint64_t bytes,
                               const char* what) const {
  if (!a) return make_error(ec::invalid_request, fmt::format("{}: empty allocation", what));
  if (a.owner_.get() != this)
    return make_error(
        ec::invalid_request,
        fmt::format("{}: allocation belongs to another device than {}", what, info_.name));
  if (bytes == 0) return make_error(ec::invalid_request, fmt::format("{}: 0 bytes", what));
  if (offset > a.size() || bytes > a.size() - offset)
    return make_error(ec::invalid_request,
                      fmt::format("{}: range [{}, {}) outside allocation of {} bytes", what, offset,
                                  offset + bytes, a.size()));
  return {};
}

caf::expected<copy_event_ptr> device::copy_to_device_async(const device_allocation& dst,
                                                           uint64_t dst_offset, const void* src,
                                                           uint64_t bytes) {
  if (auto err = check_range(dst, dst_offset, bytes, "copy to device")) return err;
  if (src == nullptr) return make_error(ec::invalid_request, "copy to device: null source");
  auto ev = do_copy_to_device(static_cast<std::byte*>(dst.data()) + dst_offset, src, bytes);
  if (ev) {
    bytes_to_device_ += bytes;
    ++copies_to_device_;
  }
  return ev;
}

caf::error device::copy_to_host(void* dst, const device_allocation& src, uint64_t src_offset,
                                uint64_t bytes) {
  if (auto err = check_range(src, src_offset, bytes, "copy to host")) return err;
  if (dst == nullptr) return make_error(ec::invalid_request, "copy to host: null destination");
  auto err = do_copy_to_host(dst, static_cast<const std::byte*>(src.data()) + src_offset, bytes);
  if (!err) {
    bytes_to_host_ += bytes;
    ++copies_to_host_;
  }
  return err;
}

caf::error device::fill(const device_allocation& dst, uint8_t value) {
  if (auto err = check_range(dst, 0, dst.size(), "fill")) return err;
  return do_fill(dst.data(), value, dst.size());
}

}  // namespace computron::gpu
