// Fuzz target: a safetensors file (length, JSON header, byte ranges), read through the
// same mmap path as a checkpoint on disk.
#include <cstddef>
#include <cstdint>

#include "models/safetensors.hpp"
#include "tests/fuzz/memfile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static computron::fuzz::memfile file;
  auto path = file.write(data, size);
  if (path.empty()) return 0;
  auto f = computron::models::safetensors_file::open(path);
  if (!f) return 0;
  // Every tensor's bytes must lie inside the mapping: touch the first and last.
  volatile std::byte sink{};
  for (auto& [name, t] : f->tensors())
    if (t.size_bytes > 0) {
      sink = t.data[0];
      sink = t.data[t.size_bytes - 1];
    }
  (void)sink;
  return 0;
}
