#include "common/random.hpp"

#include <cstring>

namespace computron {

void fill_random_bytes(std::byte* dst, uint64_t bytes, uint64_t seed) {
  uint64_t x = seed;
  auto next = [&x] {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    auto z = next();
    std::memcpy(dst + i, &z, 8);
  }
  if (i < bytes) {
    auto z = next();
    std::memcpy(dst + i, &z, bytes - i);
  }
}

}  // namespace computron
