#include "gpu/device.hpp"

#include <algorithm>
#include <functional>
#include <limits>
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
    reserved_ = std::exchange(other.reserved_, 0);
    pages_ = std::move(other.pages_);
    other.pages_.clear();
  }
  return *this;
}

uint64_t device_allocation::mapped_bytes() const {
  return owner_ ? pages_.size() * owner_->page_bytes() : 0;
}

caf::error device_allocation::map() {
  if (ptr_ == nullptr) return make_error(ec::invalid_state, "mapping an empty device range");
  if (!pages_.empty())
    return make_error(
        ec::invalid_state,
        fmt::format("the range of {} bytes on {} is mapped already", size_, owner_->info().name));
  auto pages = owner_->take_pages(reserved_ / owner_->page_bytes());
  if (!pages) return std::move(pages.error());
  if (auto err = owner_->do_map(ptr_, *pages)) {
    owner_->give_pages(*pages);
    return err;
  }
  owner_->pages_mapped_ += pages->size();
  pages_ = std::move(*pages);
  return {};
}

void device_allocation::unmap() {
  if (pages_.empty()) return;
  owner_->do_unmap(ptr_, reserved_);
  owner_->pages_unmapped_ += pages_.size();
  owner_->give_pages(pages_);
  pages_.clear();
}

void device_allocation::reset() {
  if (ptr_ != nullptr) {
    unmap();
    owner_->do_unreserve(ptr_, reserved_);
  }
  owner_.reset();
  ptr_ = nullptr;
  size_ = 0;
  reserved_ = 0;
}

device_stats device::stats() const {
  device_stats s;
  s.bytes_to_device = bytes_to_device_.load();
  s.bytes_to_host = bytes_to_host_.load();
  s.copies_to_device = copies_to_device_.load();
  s.copies_to_host = copies_to_host_.load();
  s.native_allocations = native_allocations_.load();
  s.native_frees = native_frees_.load();
  s.pages_mapped = pages_mapped_.load();
  s.pages_unmapped = pages_unmapped_.load();
  return s;
}

void device::init_pages(uint64_t count) {
  std::lock_guard<std::mutex> guard{pages_mtx_};
  total_pages_ = count;
  free_pages_.clear();
  free_pages_.reserve(count);
  for (auto i = count; i-- > 0;) free_pages_.push_back(static_cast<uint32_t>(i));
}

uint64_t device::mapped_pages() const {
  std::lock_guard<std::mutex> guard{pages_mtx_};
  return total_pages_ - free_pages_.size();
}

caf::expected<std::vector<uint32_t>> device::take_pages(uint64_t count) {
  std::lock_guard<std::mutex> guard{pages_mtx_};
  if (count > free_pages_.size()) {
    const auto page = info_.page_bytes;
    return make_error(ec::out_of_device_memory,
                      fmt::format("{} bytes requested on {}, {} free of {}", count * page,
                                  info_.name, free_pages_.size() * page, total_pages_ * page));
  }
  std::vector<uint32_t> out(free_pages_.end() - static_cast<ptrdiff_t>(count), free_pages_.end());
  free_pages_.resize(free_pages_.size() - count);
  // Lowest index first: the emulated device then maps runs of consecutive pages at once.
  std::reverse(out.begin(), out.end());
  return out;
}

void device::give_pages(std::vector<uint32_t>& pages) {
  std::lock_guard<std::mutex> guard{pages_mtx_};
  // Kept sorted high to low, so that the next take gets low, mostly consecutive pages.
  free_pages_.insert(free_pages_.end(), pages.begin(), pages.end());
  std::sort(free_pages_.begin(), free_pages_.end(), std::greater<>{});
}

caf::expected<host_buffer> device::allocate_host(uint64_t bytes) {
  if (bytes == 0)
    return make_error(ec::invalid_request, "cannot allocate a host buffer of 0 bytes");
  return do_allocate_host(bytes);
}

caf::expected<device_allocation> device::reserve(uint64_t bytes) {
  if (bytes == 0)
    return make_error(ec::invalid_request,
                      fmt::format("cannot allocate 0 bytes on {}", info_.name));
  auto reserved = pages_of(bytes);
  if (reserved < bytes || reserved / info_.page_bytes > std::numeric_limits<uint32_t>::max())
    return make_error(
        ec::out_of_device_memory,
        fmt::format("{} bytes requested on {}: no range that large", bytes, info_.name));
  auto va = do_reserve(reserved);
  if (!va) return std::move(va.error());
  device_allocation result;
  result.owner_ = shared_from_this();
  result.ptr_ = *va;
  result.size_ = bytes;
  result.reserved_ = reserved;
  return result;
}

caf::expected<device_allocation> device::allocate(uint64_t bytes) {
  auto range = reserve(bytes);
  if (!range) return range;
  if (auto err = range->map()) return err;
  return range;
}

caf::error device::check_range(const device_allocation& a, uint64_t offset, uint64_t bytes,
                               const char* what) const {
  if (!a) return make_error(ec::invalid_request, fmt::format("{}: empty allocation", what));
  if (!a.mapped())
    return make_error(ec::invalid_state,
                      fmt::format("{}: the range on {} has no pages mapped", what, info_.name));
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
