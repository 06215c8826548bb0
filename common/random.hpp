#pragma once

#include <cstddef>
#include <cstdint>

namespace computron {

/// Fills `bytes` bytes with a deterministic pseudo-random stream (splitmix64) of `seed`:
/// fast enough for gigabytes of benchmark weights, reproducible for tests.
void fill_random_bytes(std::byte* dst, uint64_t bytes, uint64_t seed);

}  // namespace computron
