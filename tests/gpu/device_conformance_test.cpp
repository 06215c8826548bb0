// The device contract, checked on every backend: emulated always, CUDA where a GPU is.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include "common/error.hpp"
#include "gpu/weight_store.hpp"
#include "tests/support/devices.hpp"

using namespace computron;
using namespace std::chrono_literals;
using test::device_factory;

namespace {

/// A shard of `bytes` random bytes on `dev`, as one u8 tensor.
std::unique_ptr<gpu::weight_shard> make_shard(gpu::device_ptr dev, uint64_t bytes, uint64_t seed) {
  gpu::tensor_table t;
  REQUIRE_FALSE(t.add("w", gpu::dtype::u8, {static_cast<int64_t>(bytes)}));
  auto s = gpu::weight_shard::create(std::move(dev), std::move(t));
  REQUIRE(s);
  auto data = test::random_bytes(bytes, seed);
  std::memcpy((*s)->host_data(), data.data(), bytes);
  return std::move(*s);
}

void bytes_survive_a_round_trip(const device_factory& make) {
  auto dev = make(0);
  // An odd size and odd chunk boundaries, so no copy is a neat multiple of anything.
  const uint64_t n = (3ull << 20) + 12345;
  auto src = test::random_bytes(n, 7);
  auto mem = dev->allocate(n);
  REQUIRE(mem);
  REQUIRE_FALSE(dev->fill(*mem, 0xCD));  // poison the destination first
  std::vector<gpu::copy_event_ptr> events;
  for (uint64_t off = 0; off < n; off += 777777) {
    auto len = std::min<uint64_t>(777777, n - off);
    auto ev = dev->copy_to_device_async(*mem, off, src.data() + off, len);
    REQUIRE(ev);
    events.push_back(*ev);
  }
  for (auto& ev : events) REQUIRE_FALSE(ev->wait(10s));
  std::vector<std::byte> back(n, std::byte{0x5A});  // and the read-back buffer
  REQUIRE_FALSE(dev->copy_to_host(back.data(), *mem, 0, n));
  CHECK(std::memcmp(back.data(), src.data(), n) == 0);
  // A read from the middle returns exactly that range.
  std::vector<std::byte> mid(1000, std::byte{0});
  REQUIRE_FALSE(dev->copy_to_host(mid.data(), *mem, 500000, 1000));
  CHECK(std::memcmp(mid.data(), src.data() + 500000, 1000) == 0);
}

void capacity_is_enforced_with_a_clear_error(const device_factory& make) {
  auto dev = make(0);
  auto cap = dev->capacity_bytes();
  auto too_big = dev->allocate(cap + 1);
  REQUIRE_FALSE(too_big);
  CHECK(is(too_big.error(), ec::out_of_device_memory));
  CHECK_THAT(render(too_big.error()), Catch::Contains("free of"));
  CHECK(dev->used_bytes() == 0);
  {
    auto half = dev->allocate(cap / 2);
    REQUIRE(half);
    CHECK(dev->used_bytes() >= cap / 2);
    auto rest = dev->allocate(cap - cap / 2 + 4096);
    REQUIRE_FALSE(rest);
    CHECK(is(rest.error(), ec::out_of_device_memory));
  }
  CHECK(dev->used_bytes() == 0);  // freed with the allocation
  CHECK(dev->allocate(cap / 2));  // and usable again
}

void eviction_copies_nothing_back(const device_factory& make) {
  auto dev = make(0);
  auto shard = make_shard(dev, 8ull << 20, 11);
  REQUIRE_FALSE(shard->load({1ull << 20}));
  REQUIRE_FALSE(shard->wait_loaded(30s));
  REQUIRE(shard->state() == gpu::residency::resident);
  auto before = dev->stats();
  auto used = dev->used_bytes();
  CHECK(used >= shard->size_bytes());
  REQUIRE_FALSE(shard->evict());
  auto after = dev->stats();
  CHECK(after.bytes_to_host == before.bytes_to_host);
  CHECK(after.copies_to_host == before.copies_to_host);
  CHECK(after.bytes_to_device == before.bytes_to_device);
  CHECK(dev->used_bytes() == 0);
  CHECK(shard->state() == gpu::residency::offloaded);
  // The host copy is still the truth: a reload brings back the same bytes.
  REQUIRE_FALSE(shard->load({1ull << 20}));
  REQUIRE_FALSE(shard->wait_loaded(30s));
  std::vector<std::byte> back(shard->size_bytes());
  REQUIRE_FALSE(shard->read_back(0, back.data(), back.size()));
  CHECK(std::memcmp(back.data(), shard->host_data(), back.size()) == 0);
}

void chunks_become_ready_in_order(const device_factory& make) {
  auto dev = make(0);
  auto shard = make_shard(dev, 64ull << 20, 3);
  REQUIRE_FALSE(shard->load({1ull << 20}));
  auto n = shard->chunk_count();
  REQUIRE(n == 64);
  uint64_t last_ready = 0;
  bool saw_partial = false;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (shard->state() == gpu::residency::loading) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    // Sample readiness from the end backwards: a later chunk seen ready while an
    // earlier one is not would break the in-order contract.
    bool later_ready = false;
    for (size_t i = n; i-- > 0;) {
      bool r = shard->chunk_ready(i);
      if (later_ready) REQUIRE(r);
      later_ready = later_ready || r;
    }
    auto ready = shard->ready_bytes();
    REQUIRE(ready >= last_ready);  // the ready prefix only grows
    if (ready > 0 && ready < shard->size_bytes()) saw_partial = true;
    last_ready = ready;
  }
  CHECK(shard->ready_bytes() == shard->size_bytes());
  // On the emulated link (64 MiB at 4 GB/s, 17 ms) a partial prefix is always seen;
  // a GPU may finish before the first poll.
  if (dev->info().kind == gpu::device_kind::emulated) CHECK(saw_partial);
}

void two_devices_loading_at_once_do_not_interfere(const device_factory& make) {
  if (test::available(make) < 2) {
    WARN("fewer than two devices of this kind: nothing to check");
    return;
  }
  auto a = make_shard(make(0), 16ull << 20, 100);
  auto b = make_shard(make(1), 16ull << 20, 200);
  // Catch2 assertions are not thread-safe: the loaders only record their errors.
  caf::error err_a, err_b;
  std::thread ta([&] {
    err_a = a->load({1ull << 20});
    if (!err_a) err_a = a->wait_loaded(30s);
  });
  std::thread tb([&] {
    err_b = b->load({1ull << 20});
    if (!err_b) err_b = b->wait_loaded(30s);
  });
  ta.join();
  tb.join();
  REQUIRE_FALSE(err_a);
  REQUIRE_FALSE(err_b);
  for (auto* s : {a.get(), b.get()}) {
    std::vector<std::byte> back(s->size_bytes());
    REQUIRE_FALSE(s->read_back(0, back.data(), back.size()));
    CHECK(std::memcmp(back.data(), s->host_data(), back.size()) == 0);
    CHECK(s->dev().stats().bytes_to_device == s->size_bytes());
  }
}

void bad_requests_get_clear_errors(const device_factory& make) {
  auto dev = make(0);
  auto zero = dev->allocate(0);
  REQUIRE_FALSE(zero);
  CHECK(is(zero.error(), ec::invalid_request));
  CHECK_FALSE(dev->allocate_host(0));
  auto mem = dev->allocate(4096);
  REQUIRE(mem);
  std::vector<std::byte> buf(8192);
  auto outside = dev->copy_to_device_async(*mem, 4000, buf.data(), 200);
  REQUIRE_FALSE(outside);
  CHECK_THAT(render(outside.error()), Catch::Contains("outside allocation"));
  CHECK(is(dev->copy_to_host(buf.data(), *mem, 0, 4097), ec::invalid_request));
  CHECK(is(dev->copy_to_host(nullptr, *mem, 0, 16), ec::invalid_request));
  CHECK_FALSE(dev->copy_to_device_async(*mem, 0, nullptr, 16));
  CHECK_FALSE(dev->copy_to_device_async(*mem, 0, buf.data(), 0));
  gpu::device_allocation empty;
  CHECK_FALSE(dev->copy_to_device_async(empty, 0, buf.data(), 16));
  CHECK(dev->stats().bytes_to_device == 0);  // nothing was copied by any of them
}

void shard_lifecycle_misuse_is_refused(const device_factory& make) {
  auto dev = make(0);
  auto shard = make_shard(dev, 4ull << 20, 5);
  // Evicting what never loaded, then twice.
  CHECK(is(shard->evict(), ec::not_resident));
  REQUIRE_FALSE(shard->load({1ull << 20}));
  // Still loading or already resident: refused either way (the emulated tests pin down
  // the loading case on a slow link).
  CHECK(is(shard->load({1ull << 20}), ec::invalid_state));
  REQUIRE_FALSE(shard->wait_loaded(30s));
  CHECK(is(shard->load({1ull << 20}), ec::invalid_state));
  REQUIRE_FALSE(shard->evict());
  auto twice = shard->evict();
  CHECK(is(twice, ec::not_resident));
  CHECK_THAT(render(twice), Catch::Contains("offloaded"));
  CHECK(is(shard->read_back(0, nullptr, 1), ec::not_resident));
  CHECK(is(shard->wait_loaded(1s), ec::not_resident));
  CHECK(is(shard->load({0}), ec::invalid_request));
  CHECK(dev->used_bytes() == 0);
}

void a_load_that_cannot_fit_moves_nothing(const device_factory& make) {
  auto dev = make(0);
  gpu::tensor_table t;
  REQUIRE_FALSE(t.add("huge", gpu::dtype::u8, {static_cast<int64_t>(dev->capacity_bytes() + 1)}));
  if (t.total_bytes() > (1ull << 30)) {
    WARN("device too large to stage a host copy of more than its capacity in a test");
    return;
  }
  auto shard = gpu::weight_shard::create(dev, std::move(t));
  REQUIRE(shard);
  auto err = (*shard)->load();
  CHECK(is(err, ec::out_of_device_memory));
  CHECK((*shard)->state() == gpu::residency::offloaded);
  CHECK(dev->stats().bytes_to_device == 0);
  CHECK(dev->used_bytes() == 0);
}

}  // namespace

void loads_and_evictions_never_call_the_native_allocator(const device_factory& make) {
  auto dev = make(0);
  auto before = dev->stats();
  CHECK(before.native_allocations >= 1);  // the pages made at open
  const uint64_t n = (8ull << 20) + 4096;
  auto shard = make_shard(dev, n, 11);
  auto other = make_shard(dev, n / 2, 12);
  for (int round = 0; round < 3; ++round) {
    REQUIRE_FALSE(shard->load({1ull << 20}));
    REQUIRE_FALSE(other->load({1ull << 20}));
    REQUIRE_FALSE(shard->wait_loaded(10s));
    REQUIRE_FALSE(other->wait_loaded(10s));
    std::vector<std::byte> back(4096);
    REQUIRE_FALSE(shard->read_back(n - 4096, back.data(), 4096));
    CHECK(std::memcmp(back.data(), shard->host_data() + n - 4096, 4096) == 0);
    REQUIRE_FALSE(shard->evict());
    REQUIRE_FALSE(other->evict());
  }
  auto after = dev->stats();
  // No cudaMalloc on a load, no cudaFree (a device-wide synchronization) on an eviction.
  CHECK(after.native_allocations == before.native_allocations);
  CHECK(after.native_frees == before.native_frees);
  CHECK(dev->used_bytes() == 0);
}

void memory_in_pages_never_fragments(const device_factory& make) {
  auto dev = make(0);
  const auto page = dev->page_bytes();
  REQUIRE(page >= 4096);
  CHECK(dev->capacity_bytes() % page == 0);
  CHECK(dev->largest_free_block() == dev->capacity_bytes());
  auto q = dev->capacity_bytes() / 4 / page * page;
  REQUIRE(q > 0);
  auto a = dev->allocate(q);
  auto b = dev->allocate(q);
  auto c = dev->allocate(q);
  REQUIRE((a && b && c));
  CHECK(dev->used_bytes() == 3 * q);
  CHECK(dev->mapped_pages() * page == 3 * q);
  b->reset();  // a hole of q between a and c, and the tail
  // A contiguous arena refused this (its largest block was q): pages take any free page.
  CHECK(dev->largest_free_block() == dev->free_bytes());
  auto big = dev->allocate(2 * q);
  REQUIRE(big);
  CHECK(dev->used_bytes() == 4 * q);
  // Both halves of the range hold what is written there.
  std::vector<std::byte> pattern(2 * q), back(2 * q);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>(i * 131 + 7);
  auto ev = dev->copy_to_device_async(*big, 0, pattern.data(), 2 * q);
  REQUIRE(ev);
  REQUIRE_FALSE((*ev)->wait(30s));
  REQUIRE_FALSE(dev->copy_to_host(back.data(), *big, 0, 2 * q));
  CHECK(back == pattern);
  // An allocation takes whole pages: one byte more than the rest is refused, with sizes.
  big->reset();
  auto over = dev->allocate(dev->free_bytes() + 1);
  REQUIRE_FALSE(over);
  CHECK(is(over.error(), ec::out_of_device_memory));
  CHECK(dev->used_bytes() == 2 * q);
}

void a_shard_keeps_its_addresses_across_eviction_and_reload(const device_factory& make) {
  auto dev = make(0);
  const auto page = dev->page_bytes();
  const uint64_t n = 3 * page + 4096;  // not a whole number of pages
  auto shard = make_shard(dev, n, 21);
  auto other = make_shard(dev, 2 * page, 22);
  REQUIRE_FALSE(shard->load({page}));
  REQUIRE_FALSE(shard->wait_loaded(10s));
  auto first = shard->device_data();
  REQUIRE(first);
  CHECK(dev->used_bytes() == 4 * page);
  REQUIRE_FALSE(shard->evict());
  CHECK(dev->used_bytes() == 0);
  // Another shard takes the pages the first gave back; the first comes back at its old
  // addresses over other pages, with its bytes.
  REQUIRE_FALSE(other->load({page}));
  REQUIRE_FALSE(other->wait_loaded(10s));
  REQUIRE_FALSE(shard->load({page}));
  REQUIRE_FALSE(shard->wait_loaded(10s));
  auto again = shard->device_data();
  REQUIRE(again);
  CHECK(*again == *first);
  std::vector<std::byte> back(n);
  REQUIRE_FALSE(shard->read_back(0, back.data(), n));
  CHECK(std::memcmp(back.data(), shard->host_data(), n) == 0);
  CHECK(dev->used_bytes() == 6 * page);
  CHECK(dev->mapped_pages() == 6);
  auto stats = dev->stats();
  CHECK(stats.pages_mapped == 4 + 2 + 4);
  CHECK(stats.pages_unmapped == 4);
}

COMPUTRON_CONFORMANCE("random bytes survive host to device to host unchanged",
                      bytes_survive_a_round_trip)
COMPUTRON_CONFORMANCE("device capacity is enforced with a clear error",
                      capacity_is_enforced_with_a_clear_error)
COMPUTRON_CONFORMANCE("eviction frees device memory and copies nothing back",
                      eviction_copies_nothing_back)
COMPUTRON_CONFORMANCE("chunks of a load become ready in order", chunks_become_ready_in_order)
COMPUTRON_CONFORMANCE("two devices loading at once do not interfere",
                      two_devices_loading_at_once_do_not_interfere)
COMPUTRON_CONFORMANCE("bad device requests get clear errors and copy nothing",
                      bad_requests_get_clear_errors)
COMPUTRON_CONFORMANCE("shard lifecycle misuse is refused with clear errors",
                      shard_lifecycle_misuse_is_refused)
COMPUTRON_CONFORMANCE("a load that cannot fit is refused before anything moves",
                      a_load_that_cannot_fit_moves_nothing)
COMPUTRON_CONFORMANCE("loads and evictions never call the device's own allocator",
                      loads_and_evictions_never_call_the_native_allocator)
COMPUTRON_CONFORMANCE("device memory in pages never fragments", memory_in_pages_never_fragments)
COMPUTRON_CONFORMANCE("a shard keeps its device addresses across an eviction and a reload",
                      a_shard_keeps_its_addresses_across_eviction_and_reload)
