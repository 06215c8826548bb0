#include <catch2/catch.hpp>

#include <vector>

#include "common/random.hpp"

TEST_CASE("seeded random bytes are reproducible and depend on the seed", "[random]") {
  std::vector<std::byte> a(1003), b(1003), c(1003);
  computron::fill_random_bytes(a.data(), a.size(), 1);
  computron::fill_random_bytes(b.data(), b.size(), 1);
  computron::fill_random_bytes(c.data(), c.size(), 2);
  CHECK(a == b);
  CHECK(a != c);
  // The tail past the last whole word is filled too (not left at zero).
  std::vector<std::byte> tail(7, std::byte{0});
  computron::fill_random_bytes(tail.data(), tail.size(), 3);
  CHECK(tail != std::vector<std::byte>(7, std::byte{0}));
}
