#include "gpu/emulated_device.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/error.hpp"

namespace computron::gpu {

namespace {

using clock_type = std::chrono::steady_clock;

/// Copies are cut into slices this big so that the throttle paces a long copy evenly
/// instead of copying everything and then sleeping.
constexpr uint64_t slice_bytes = 1ull << 20;

void free_host(void* ptr) {
  std::free(ptr);
}

}  // namespace

struct emulated_device::job {
  enum class kind { to_device, to_host, fill } what;
  std::byte* dst;
  const std::byte* src;
  uint64_t bytes;
  uint8_t value;
  std::shared_ptr<event> done;
  clock_type::time_point submitted{};
};

class emulated_device::event final : public copy_event {
 public:
  bool ready() override {
    std::lock_guard<std::mutex> guard{mtx_};
    return done_;
  }

  caf::error wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> guard{mtx_};
    if (!cv_.wait_for(guard, timeout, [this] { return done_; }))
      return make_error(ec::deadline_exceeded,
                        fmt::format("copy not finished after {} ms", timeout.count()));
    return err_;
  }

  void finish(caf::error err) {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      done_ = true;
      err_ = std::move(err);
    }
    cv_.notify_all();
  }

 private:
  std::mutex mtx_;
  std::condition_variable cv_;
  bool done_ = false;
  caf::error err_;
};

caf::expected<std::shared_ptr<emulated_device>> emulated_device::make(
    const emulated_device_options& opts) {
  if (opts.capacity_bytes == 0)
    return make_error(ec::invalid_configuration, "emulated device capacity must be > 0 bytes");
  if (!(opts.link_gbps > 0) || opts.link_gbps > 1e4)
    return make_error(
        ec::invalid_configuration,
        fmt::format("emulated link rate must be in (0, 10000] GB/s, got {}", opts.link_gbps));
  auto mapped = align_up(opts.capacity_bytes, 1ull << 21);
  // NORESERVE: only the pages that shards actually occupy ever take host memory.
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED)
    return make_error(ec::out_of_host_memory,
                      fmt::format("cannot map {} bytes for emulated device {}: {}", mapped,
                                  opts.ordinal, std::strerror(errno)));
  ::madvise(base, mapped, MADV_HUGEPAGE);  // best effort: fewer faults, faster copies
  device_info info;
  info.kind = device_kind::emulated;
  info.ordinal = opts.ordinal;
  info.name = fmt::format("emulated:{}", opts.ordinal);
  info.capacity_bytes = opts.capacity_bytes;
  info.link_gbps = opts.link_gbps;
  return std::shared_ptr<emulated_device>(
      new emulated_device(std::move(info), static_cast<std::byte*>(base), mapped));
}

emulated_device::emulated_device(device_info info, std::byte* base, uint64_t mapped_bytes)
    : device(std::move(info)),
      base_(base),
      mapped_bytes_(mapped_bytes),
      bytes_per_second_(info_.link_gbps * 1e9),
      arena_(info_.capacity_bytes, granularity) {
  count_native_allocation();  // the one mapping, made by make()
  engine_ = std::thread([this] { run_copy_engine(); });
}

emulated_device::~emulated_device() {
  {
    std::lock_guard<std::mutex> guard{queue_mtx_};
    stopping_ = true;
  }
  queue_cv_.notify_all();
  engine_.join();  // drains the queue: every event submitted gets its answer
  ::munmap(base_, mapped_bytes_);
}

uint64_t emulated_device::largest_free_block() const {
  std::lock_guard<std::mutex> guard{arena_mtx_};
  return arena_.largest_free_block();
}

caf::expected<host_buffer> emulated_device::do_allocate_host(uint64_t bytes) {
  // Page-aligned like cudaHostAlloc; emulated devices have no page-locked memory, so
  // the buffer reports itself as pageable.
  void* ptr = std::aligned_alloc(4096, align_up(bytes, 4096));
  if (ptr == nullptr)
    return make_error(ec::out_of_host_memory,
                      fmt::format("cannot allocate {} host bytes for {}", bytes, info_.name));
  return host_buffer{ptr, bytes, false, free_host};
}

caf::expected<void*> emulated_device::do_allocate(uint64_t bytes) {
  std::lock_guard<std::mutex> guard{arena_mtx_};
  auto offset = arena_.allocate(bytes);
  if (!offset)
    return make_error(
        ec::out_of_device_memory,
        fmt::format("{} bytes requested on {}: {} free but the largest free "
                    "block is {} bytes (fragmented)",
                    bytes, info_.name, arena_.free_bytes(), arena_.largest_free_block()));
  return static_cast<void*>(base_ + *offset);
}

void emulated_device::do_release(void* ptr, uint64_t) noexcept {
  std::lock_guard<std::mutex> guard{arena_mtx_};
  arena_.release(static_cast<uint64_t>(static_cast<std::byte*>(ptr) - base_));
}

std::shared_ptr<emulated_device::event> emulated_device::submit(std::unique_ptr<job> j) {
  auto ev = std::make_shared<event>();
  j->done = ev;
  j->submitted = clock_type::now();
  {
    std::lock_guard<std::mutex> guard{queue_mtx_};
    queue_.push_back(std::move(j));
  }
  queue_cv_.notify_one();
  return ev;
}

caf::expected<copy_event_ptr> emulated_device::do_copy_to_device(void* dst, const void* src,
                                                                 uint64_t bytes) {
  auto j = std::make_unique<job>(job{job::kind::to_device, static_cast<std::byte*>(dst),
                                     static_cast<const std::byte*>(src), bytes, 0, nullptr});
  return copy_event_ptr{submit(std::move(j))};
}

caf::error emulated_device::do_copy_to_host(void* dst, const void* src, uint64_t bytes) {
  auto j = std::make_unique<job>(job{job::kind::to_host, static_cast<std::byte*>(dst),
                                     static_cast<const std::byte*>(src), bytes, 0, nullptr});
  // A blocking call; generous deadline so that a wedged engine cannot hang a caller.
  auto seconds = 60 + static_cast<int64_t>(static_cast<double>(bytes) / bytes_per_second_);
  return submit(std::move(j))->wait(std::chrono::seconds{seconds});
}

caf::error emulated_device::do_fill(void* dst, uint8_t value, uint64_t bytes) {
  auto j = std::make_unique<job>(
      job{job::kind::fill, static_cast<std::byte*>(dst), nullptr, bytes, value, nullptr});
  return submit(std::move(j))->wait(std::chrono::seconds{60});
}

caf::error emulated_device::synchronize() {
  // The queue is FIFO: once an empty job behind everything completes, all did.
  auto j = std::make_unique<job>(job{job::kind::fill, nullptr, nullptr, 0, 0, nullptr});
  return submit(std::move(j))->wait(std::chrono::hours{1});
}

void emulated_device::run_copy_engine() {
  for (;;) {
    std::unique_ptr<job> j;
    {
      std::unique_lock<std::mutex> guard{queue_mtx_};
      queue_cv_.wait(guard, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything submitted was answered
      j = std::move(queue_.front());
      queue_.pop_front();
    }
    execute(*j);
    j->done->finish({});
  }
}

void emulated_device::execute(job& j) {
  if (j.what == job::kind::fill) {
    if (j.bytes > 0) std::memset(j.dst, j.value, j.bytes);
    return;
  }
  // A transfer starts once it was submitted and the link is free, and each slice then
  // takes slice / rate. Deadlines are absolute, so oversleeping a slice, or waking late
  // between back-to-back chunks, does not add up; a copy that fell behind catches up.
  auto t = std::max(j.submitted, link_free_at_);
  uint64_t done = 0;
  while (done < j.bytes) {
    auto n = std::min(slice_bytes, j.bytes - done);
    std::memcpy(j.dst + done, j.src + done, n);
    done += n;
    // Rounded up: the copy must never beat the link rate (tests rely on the bound).
    t += std::chrono::ceil<clock_type::duration>(
        std::chrono::duration<double>(static_cast<double>(n) / bytes_per_second_));
    if (clock_type::now() < t) std::this_thread::sleep_until(t);
  }
  link_free_at_ = t;
}

}  // namespace computron::gpu
