// What only the emulated device promises: its throttle, its pages, its options.
#include <sys/mman.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.hpp"
#include "gpu/emulated_device.hpp"
#include "gpu/weight_store.hpp"
#include "tests/support/devices.hpp"

using namespace computron;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::shared_ptr<gpu::emulated_device> make_device(double gbps, uint64_t capacity = 256ull << 20) {
  gpu::emulated_device_options o;
  o.capacity_bytes = capacity;
  o.link_gbps = gbps;
  auto dev = gpu::emulated_device::make(o);
  REQUIRE(dev);
  return *dev;
}

double seconds(clock_type::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

TEST_CASE("an emulated copy of X bytes at B GB/s never finishes before X/B",
          "[emulated][throttle]") {
  // A lower bound only: a busy machine can make the copy slower, never faster.
  auto dev = make_device(1.0);
  const uint64_t n = 32ull << 20;
  auto src = test::random_bytes(n, 1);
  auto mem = dev->allocate(n);
  REQUIRE(mem);
  auto t0 = clock_type::now();
  auto ev = dev->copy_to_device_async(*mem, 0, src.data(), n);
  REQUIRE(ev);
  REQUIRE_FALSE((*ev)->wait(30s));
  CHECK(seconds(clock_type::now() - t0) >= static_cast<double>(n) / 1e9);

  SECTION("back-to-back copies share the link: two take at least 2X/B") {
    auto t1 = clock_type::now();
    auto e1 = dev->copy_to_device_async(*mem, 0, src.data(), n / 2);
    auto e2 = dev->copy_to_device_async(*mem, n / 2, src.data() + n / 2, n / 2);
    REQUIRE(e1);
    REQUIRE(e2);
    REQUIRE_FALSE((*e2)->wait(30s));
    CHECK((*e1)->ready());  // in order: the earlier one is done too
    CHECK(seconds(clock_type::now() - t1) >= static_cast<double>(n) / 1e9);
  }
}

TEST_CASE("a shard load on the emulated link takes at least size / rate", "[emulated][throttle]") {
  // 16 MiB at 0.2 GB/s is 84 ms: far above what memcpy and first-touch page faults
  // take, so only the throttle can make the bound hold.
  auto dev = make_device(0.2);
  gpu::tensor_table t;
  REQUIRE_FALSE(t.add("w", gpu::dtype::f32, {4 << 20}));  // 16 MiB
  auto shard = gpu::weight_shard::create(dev, std::move(t));
  REQUIRE(shard);
  auto t0 = clock_type::now();
  REQUIRE_FALSE((*shard)->load({1ull << 20}));
  REQUIRE_FALSE((*shard)->wait_loaded(30s));
  CHECK(seconds(clock_type::now() - t0) >= static_cast<double>((*shard)->size_bytes()) / 0.2e9);
}

TEST_CASE("a shard that is loading refuses a second load and an eviction",
          "[emulated][weight_store]") {
  // 8 MiB at 0.05 GB/s is 168 ms: the shard is certainly still loading below.
  auto dev = make_device(0.05);
  gpu::tensor_table t;
  REQUIRE_FALSE(t.add("w", gpu::dtype::u8, {8 << 20}));
  auto shard = gpu::weight_shard::create(dev, std::move(t));
  REQUIRE(shard);
  auto& s = **shard;
  REQUIRE_FALSE(s.load({1ull << 20}));
  REQUIRE(s.state() == gpu::residency::loading);
  auto again = s.load({1ull << 20});
  CHECK(is(again, ec::invalid_state));
  CHECK_THAT(render(again), Catch::Contains("loading"));
  auto evict = s.evict();
  CHECK(is(evict, ec::invalid_state));
  CHECK_THAT(render(evict), Catch::Contains("wait for the load"));
  // A short wait times out with a clear error and leaves the load going.
  auto early = s.wait_loaded(1ms);
  CHECK(is(early, ec::deadline_exceeded));
  // Nothing is needed for zero bytes: no wait, no timeout.
  CHECK_FALSE(s.wait_bytes(0, 1ms));
  // The first megabyte arrives before the whole shard does.
  REQUIRE_FALSE(s.wait_bytes(1, 30s));
  CHECK(s.ready_bytes() >= (1u << 20));
  CHECK(is(s.wait_bytes(s.size_bytes() + 1, 1s), ec::invalid_request));
  REQUIRE_FALSE(s.wait_loaded(30s));
  CHECK(s.state() == gpu::residency::resident);
  CHECK(dev->stats().bytes_to_device == s.size_bytes());  // the refused load copied nothing
}

TEST_CASE("destroying a shard mid-load waits for its copies", "[emulated][weight_store]") {
  auto dev = make_device(0.5);
  {
    gpu::tensor_table t;
    REQUIRE_FALSE(t.add("w", gpu::dtype::u8, {8 << 20}));
    auto shard = gpu::weight_shard::create(dev, std::move(t));
    REQUIRE(shard);
    REQUIRE_FALSE((*shard)->load({1ull << 20}));
  }  // ASan would flag a copy into freed memory here
  CHECK(dev->used_bytes() == 0);
  CHECK(dev->stats().bytes_to_device == (8u << 20));
}

TEST_CASE("emulated device options are validated", "[emulated]") {
  gpu::emulated_device_options o;
  o.capacity_bytes = 0;
  auto zero = gpu::emulated_device::make(o);
  REQUIRE_FALSE(zero);
  CHECK(is(zero.error(), ec::invalid_configuration));
  for (double rate : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    o = {};
    o.link_gbps = rate;
    auto bad = gpu::emulated_device::make(o);
    REQUIRE_FALSE(bad);
    CHECK(is(bad.error(), ec::invalid_configuration));
  }
}

TEST_CASE("eviction on the emulated device takes no time proportional to size",
          "[emulated][weight_store]") {
  // Eviction unmaps the pages: one mmap call over the range, whatever its size.
  auto dev = make_device(16.0, 1ull << 30);
  gpu::tensor_table t;
  REQUIRE_FALSE(t.add("w", gpu::dtype::u8, {256 << 20}));
  auto shard = gpu::weight_shard::create(dev, std::move(t));
  REQUIRE(shard);
  REQUIRE_FALSE((*shard)->load());
  REQUIRE_FALSE((*shard)->wait_loaded(60s));
  auto t0 = clock_type::now();
  REQUIRE_FALSE((*shard)->evict());
  // Only a loose bound: the benchmark measures the real figure (evict_ms). This catches
  // an eviction that copies the shard back (at 16 GB/s, 256 MiB would take 17 ms and
  // the device would count bytes to the host) or waits on the link, without flaking
  // on a loaded machine or a sanitizer build.
  CHECK(seconds(clock_type::now() - t0) < 0.5);
  CHECK(dev->stats().bytes_to_host == 0);
  CHECK(dev->used_bytes() == 0);
}

TEST_CASE("emulated pages: the default size, a small device's, and bad sizes",
          "[emulated][pages]") {
  auto big = make_device(4.0, 192ull << 20);
  CHECK(big->page_bytes() == gpu::device::default_page_bytes);
  CHECK(big->capacity_bytes() == 192ull << 20);
  auto small = make_device(4.0, (5ull << 20) / 2);  // 2.5 MiB: 32 pages of 64 KiB, rounded down
  CHECK(small->page_bytes() == 64ull << 10);
  CHECK(small->capacity_bytes() == 40 * (64ull << 10));
  gpu::emulated_device_options o;
  o.capacity_bytes = 1ull << 20;
  for (uint64_t page : {uint64_t{1000}, uint64_t{2048}, uint64_t{3} << 20, uint64_t{2} << 20}) {
    o.page_bytes = page;
    auto bad = gpu::emulated_device::make(o);
    REQUIRE_FALSE(bad);  // not a power of two, under 4 KiB, or more than the capacity
    CHECK(is(bad.error(), ec::invalid_configuration));
  }
}

TEST_CASE("an emulated range unmapped keeps its addresses and maps other pages again",
          "[emulated][pages]") {
  auto dev = make_device(4.0, 64ull << 20);
  const auto page = dev->page_bytes();
  auto r = dev->reserve(3 * page);
  REQUIRE(r);
  CHECK_FALSE(r->mapped());
  CHECK(dev->used_bytes() == 0);
  std::vector<std::byte> x(page, std::byte{1});
  CHECK(is(dev->copy_to_device_async(*r, 0, x.data(), page).error(), ec::invalid_state));
  REQUIRE_FALSE(r->map());
  CHECK(is(r->map(), ec::invalid_state));  // twice
  auto* at = static_cast<std::byte*>(r->data());
  std::memset(at, 0x5a, 3 * page);  // host memory on this device: writable where mapped
  r->unmap();
  CHECK(dev->used_bytes() == 0);
  auto hog = dev->allocate(page);  // takes the lowest free page, the range's first before
  REQUIRE(hog);
  REQUIRE_FALSE(r->map());
  CHECK(r->data() == at);
  CHECK(dev->used_bytes() == 4 * page);
  // The hog's page was the range's first: the range's first page is another page now.
  std::memset(hog->data(), 0x11, page);
  CHECK(at[0] != std::byte{0x11});
  auto stats = dev->stats();
  CHECK(stats.native_allocations == 1);  // the memfd
  CHECK(stats.pages_mapped == 3 + 1 + 3);
  CHECK(stats.pages_unmapped == 3);
}

TEST_CASE("an emulated page stays in its range after an unmap until another range takes it",
          "[emulated][pages]") {
  auto dev = make_device(4.0, 64ull << 20);
  const auto page = dev->page_bytes();
  auto r = dev->reserve(4 * page);
  REQUIRE(r);
  REQUIRE_FALSE(r->map());
  CHECK(dev->page_moves() == 1);  // four consecutive free pages: one run
  auto* at = static_cast<std::byte*>(r->data());
  std::memset(at, 0x3c, 4 * page);
  // Evicted and loaded again with the same pages: nothing moves either way.
  r->unmap();
  CHECK(dev->used_bytes() == 0);
  REQUIRE_FALSE(r->map());
  CHECK(dev->page_moves() == 1);
  CHECK(at[0] == std::byte{0x3c});
  CHECK(at[4 * page - 1] == std::byte{0x3c});
  // Another range takes pages that rest in the first: they move there, bytes and all.
  r->unmap();
  auto other = dev->allocate(2 * page);  // the two lowest free pages: r's first two
  REQUIRE(other);
  CHECK(dev->page_moves() == 2);
  auto* o = static_cast<std::byte*>(other->data());
  CHECK(o[0] == std::byte{0x3c});
  std::memset(o, 0x77, 2 * page);
  // r maps again with pages 2..5: 2 and 3 stay in the slots where they rest, and 4 and 5
  // come from home into the two slots the other range emptied (one run).
  REQUIRE_FALSE(r->map());
  CHECK(dev->page_moves() == 3);
  CHECK(dev->used_bytes() == 6 * page);
  CHECK(at[2 * page] == std::byte{0x3c});
  CHECK(at[4 * page - 1] == std::byte{0x3c});
  std::memset(at, 0x11, 4 * page);
  CHECK(o[0] == std::byte{0x77});  // the ranges share no page
  CHECK(o[2 * page - 1] == std::byte{0x77});
  // A range that goes sends its resting pages home; they map elsewhere, writable.
  other->unmap();
  other->reset();
  r->unmap();
  r->reset();
  CHECK(dev->used_bytes() == 0);
  auto all = dev->allocate(dev->capacity_bytes());
  REQUIRE(all);
  std::memset(all->data(), 0x42, dev->capacity_bytes());
  CHECK(static_cast<std::byte*>(all->data())[dev->capacity_bytes() - 1] == std::byte{0x42});
  auto stats = dev->stats();
  CHECK(stats.pages_mapped == 4 + 4 + 2 + 4 + dev->capacity_bytes() / page);
  CHECK(stats.pages_unmapped == 4 + 4 + 2 + 4);
}

TEST_CASE("a prefaulted emulated device's memory is resident before its first copy",
          "[emulated][pages]") {
  // mincore says which pages of a mapping are in memory: a fresh device's are not, so that
  // its first copies would run at the page-fault rate; a prefaulted one's all are.
  auto resident_share = [](bool prefault) {
    gpu::emulated_device_options o;
    o.capacity_bytes = 32ull << 20;
    o.link_gbps = 4.0;
    o.prefault = prefault;
    auto dev = gpu::emulated_device::make(o);
    REQUIRE(dev);
    auto all = (*dev)->allocate((*dev)->capacity_bytes());
    REQUIRE(all);
    const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const auto bytes = (*dev)->capacity_bytes();
    std::vector<unsigned char> in_core(bytes / page);
    REQUIRE(::mincore(all->data(), bytes, in_core.data()) == 0);
    auto resident =
        std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return c & 1; });
    return static_cast<double>(resident) / static_cast<double>(in_core.size());
  };
  CHECK(resident_share(false) == 0.0);
  CHECK(resident_share(true) == 1.0);
}
