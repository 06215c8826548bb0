#include "gpu/emulated_device.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <string>

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

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4  // linux/mman.h's; glibc's headers do not have it yet
#endif

/// Ranges and the park start on a huge-page boundary, so that mremap moves whole huge
/// pages (one page-table entry each) rather than splitting them.
constexpr uint64_t huge_bytes = 2ull << 20;

/// Of a mapping of `bytes` + huge_bytes at `base`, keeps the `bytes` that start on a huge
/// page boundary and unmaps the rest.
std::byte* trim_to_aligned(std::byte* base, uint64_t bytes) {
  auto addr = reinterpret_cast<uintptr_t>(base);
  auto aligned = (addr + huge_bytes - 1) & ~(uintptr_t{huge_bytes} - 1);
  auto head = aligned - addr;
  if (head > 0) ::munmap(base, head);
  auto tail = huge_bytes - head;
  if (tail > 0) ::munmap(reinterpret_cast<std::byte*>(aligned) + bytes, tail);
  return reinterpret_cast<std::byte*>(aligned);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14's; older glibc headers lack it
#endif

/// Makes [p, p + bytes) resident and writable: one call where the kernel has
/// MADV_POPULATE_WRITE, else (EINVAL: a kernel before 5.14) a write to every 4 KiB page;
/// the pages hold zeros either way. Any other failure (no memory for them) is an error, as
/// touching pages the machine cannot give would end the process instead.
caf::error prefault_pages(std::byte* p, uint64_t bytes, const std::string& name) {
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return {};
  if (errno != EINVAL)
    return make_error(ec::out_of_host_memory,
                      fmt::format("cannot make the {} bytes of {} resident (devices.prefault): {}",
                                  bytes, name, std::strerror(errno)));
  for (uint64_t at = 0; at < bytes; at += 4096) *reinterpret_cast<volatile std::byte*>(p + at) = {};
  return {};
}

/// Moves the pages at `from` to `to` (which they replace) in one call that leaves `from`
/// mapped, empty (MREMAP_DONTUNMAP, Linux 5.13 or later for these mappings): a plain mremap
/// left a hole there that another thread's mmap could take before a placeholder went in,
/// which corrupted the heap here (bench swap, 4 loaders at once). `from` is then PROT_NONE,
/// so that a range's addresses fault while no page is there.
caf::error move_pages(std::byte* from, std::byte* to, uint64_t bytes) {
  if (::mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) ==
      MAP_FAILED)
    return make_error(ec::device_error,
                      fmt::format("moving {} bytes of pages (mremap with MREMAP_DONTUNMAP, Linux "
                                  "5.13 or later): {}",
                                  bytes, std::strerror(errno)));
  ::mprotect(from, bytes, PROT_NONE);
  return {};
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
  auto page = opts.page_bytes;
  if (page == 0) {
    page = device::default_page_bytes;
    while (page > 4096 && opts.capacity_bytes / page < 32) page /= 2;
  }
  if (page < 4096 || (page & (page - 1)) != 0)
    return make_error(
        ec::invalid_configuration,
        fmt::format("emulated page size must be a power of two of at least 4096 bytes, got {}",
                    page));
  const auto pages = opts.capacity_bytes / page;
  if (pages == 0 || pages > std::numeric_limits<uint32_t>::max())
    return make_error(ec::invalid_configuration,
                      fmt::format("an emulated device of {} bytes in pages of {} bytes has {} "
                                  "pages (1 .. 2^32 - 1 allowed)",
                                  opts.capacity_bytes, page, pages));
  auto name = fmt::format("emulated:{}", opts.ordinal);
  // NORESERVE: only the pages that ranges map and touch ever take host memory.
  const auto park_bytes = pages * page;
  void* park = ::mmap(nullptr, park_bytes + huge_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (park == MAP_FAILED)
    return make_error(ec::out_of_host_memory, fmt::format("cannot map {} bytes of pages for {}: {}",
                                                          park_bytes, name, std::strerror(errno)));
  auto* aligned = trim_to_aligned(static_cast<std::byte*>(park), park_bytes);
  ::madvise(aligned, park_bytes, MADV_HUGEPAGE);  // best effort: fewer faults, faster copies
  if (opts.prefault)
    if (auto err = prefault_pages(aligned, park_bytes, name)) {
      ::munmap(aligned, park_bytes);
      return err;
    }
  device_info info;
  info.kind = device_kind::emulated;
  info.ordinal = opts.ordinal;
  info.name = std::move(name);
  info.capacity_bytes = park_bytes;
  info.link_gbps = opts.link_gbps;
  info.page_bytes = page;
  return std::shared_ptr<emulated_device>(
      new emulated_device(std::move(info), aligned, park_bytes));
}

emulated_device::emulated_device(device_info info, std::byte* park, uint64_t park_bytes)
    : device(std::move(info)),
      park_(park),
      park_bytes_(park_bytes),
      bytes_per_second_(info_.link_gbps * 1e9) {
  init_pages(info_.capacity_bytes / info_.page_bytes);
  at_.resize(info_.capacity_bytes / info_.page_bytes);
  for (uint32_t p = 0; p < at_.size(); ++p) at_[p] = home(p);
  count_native_allocation();  // the park, made by make()
  engine_ = std::thread([this] { run_copy_engine(); });
}

emulated_device::~emulated_device() {
  {
    std::lock_guard<std::mutex> guard{queue_mtx_};
    stopping_ = true;
  }
  queue_cv_.notify_all();
  engine_.join();  // drains the queue: every event submitted gets its answer
  // Every range is gone (each holds the device): all pages are back in the park.
  ::munmap(park_, park_bytes_);
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

caf::expected<void*> emulated_device::do_reserve(uint64_t bytes) {
  // NORESERVE and PROT_NONE: addresses only, no memory, until do_map moves pages there.
  void* va = ::mmap(nullptr, bytes + huge_bytes, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (va == MAP_FAILED)
    return make_error(ec::out_of_host_memory,
                      fmt::format("cannot reserve {} bytes of addresses on {}: {}", bytes,
                                  info_.name, std::strerror(errno)));
  return static_cast<void*>(trim_to_aligned(static_cast<std::byte*>(va), bytes));
}

void emulated_device::do_unreserve(void* va, uint64_t bytes) noexcept {
  {
    std::lock_guard<std::mutex> guard{mapped_mtx_};
    auto* at = static_cast<std::byte*>(va);
    send_home_locked(at, at + bytes);
  }
  ::munmap(va, bytes);
}

caf::error emulated_device::move_locked(const std::vector<std::pair<uint32_t, std::byte*>>& moves) {
  const auto page = info_.page_bytes;
  auto moved = [&](uint32_t p, std::byte* to) {
    occupant_.erase(at_[p]);  // no entry when it came from home
    at_[p] = to;
    if (to != home(p)) occupant_[to] = p;
  };
  caf::error first;
  for (size_t i = 0; i < moves.size();) {
    // A run: pages that lie one after another where they are and where they go.
    size_t run = 1;
    while (i + run < moves.size() &&
           at_[moves[i + run].first] == at_[moves[i].first] + run * page &&
           moves[i + run].second == moves[i].second + run * page)
      ++run;
    ++page_moves_;
    if (!move_pages(at_[moves[i].first], moves[i].second, run * page)) {
      for (size_t k = i; k < i + run; ++k) moved(moves[k].first, moves[k].second);
    } else {
      // Before Linux 6.17 one call cannot span several kernel mappings (EFAULT), and
      // pages that came from different places are such: then a page at a time.
      for (size_t k = i; k < i + run; ++k) {
        ++page_moves_;
        auto err = move_pages(at_[moves[k].first], moves[k].second, page);
        if (!err)
          moved(moves[k].first, moves[k].second);
        else if (!first)
          first = std::move(err);
      }
    }
    i += run;
  }
  return first;
}

void emulated_device::send_home_locked(std::byte* from, std::byte* to) noexcept {
  const auto page = info_.page_bytes;
  std::vector<std::pair<uint32_t, std::byte*>> moves;
  for (auto it = occupant_.lower_bound(from); it != occupant_.end() && it->first < to; ++it)
    moves.emplace_back(it->second, home(it->second));
  if (!move_locked(moves)) return;
  // A run failed: the rest a page at a time.
  for (auto& [p, dst] : moves) {
    if (at_[p] == dst) continue;  // gone home with an earlier run
    if (!move_locked({{p, dst}})) continue;
    // Fresh memory at home (its bytes are lost, which a free page may lose) and none in
    // the slot, so that no later move takes a PROT_NONE slot for a page.
    ::mmap(dst, page, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    ::mmap(at_[p], page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    occupant_.erase(at_[p]);
    at_[p] = dst;
  }
}

caf::error emulated_device::do_map(void* va, const std::vector<uint32_t>& pages) {
  const auto page = info_.page_bytes;
  auto* at = static_cast<std::byte*>(va);
  auto* end = at + pages.size() * page;
  std::lock_guard<std::mutex> guard{mapped_mtx_};
  // A page of the set that rests in one of this range's slots stays in it (a shard loaded
  // again after an eviction moves nothing); which page backs which slot is the backend's
  // choice. Pages resting here that are not in the set go home; the rest of the set fills
  // the free slots, from wherever each page rests.
  std::vector<uint32_t> order(pages.size(), std::numeric_limits<uint32_t>::max());
  std::vector<std::pair<uint32_t, std::byte*>> moves;
  {
    std::set<uint32_t> wanted(pages.begin(), pages.end());
    for (auto it = occupant_.lower_bound(at); it != occupant_.end() && it->first < end; ++it) {
      if (wanted.erase(it->second) > 0)
        order[static_cast<size_t>(it->first - at) / page] = it->second;
      else
        moves.emplace_back(it->second, home(it->second));
    }
    if (auto err = move_locked(moves)) return err;  // those that moved are home: nothing lost
    moves.clear();
    auto next = pages.begin();
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i] != std::numeric_limits<uint32_t>::max()) continue;
      while (wanted.count(*next) == 0) ++next;  // skips the pages kept in place
      order[i] = *next++;
      moves.emplace_back(order[i], at + i * page);
    }
  }
  if (auto err = move_locked(moves)) return err;  // what moved rests there, unmapped
  mapped_[va] = std::move(order);
  return {};
}

void emulated_device::do_unmap(void* va, uint64_t) noexcept {
  // The pages stay where they are until another range takes them or this one goes.
  std::lock_guard<std::mutex> guard{mapped_mtx_};
  mapped_.erase(va);
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
