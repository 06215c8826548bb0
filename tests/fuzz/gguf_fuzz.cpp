// Fuzz target: a GGUF file (header, typed metadata, tensor infos, byte ranges), read through
// the same mmap path as a checkpoint on disk, then every getter and every dequantization.
#include <cstddef>
#include <cstdint>

#include "common/gguf.hpp"
#include "tests/fuzz/memfile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace computron;
  static computron::fuzz::memfile file;
  auto path = file.write(data, size);
  if (path.empty()) return 0;
  auto f = gguf_file::open(path);
  if (!f) return 0;
  for (auto& [key, value] : f->metadata()) {
    (void)f->get_string(key);
    (void)f->get_int(key);
    (void)f->get_float(key);
    (void)f->get_bool(key);
    (void)f->get_strings(key);
    (void)f->get_ints(key);
    (void)f->get_floats(key);
  }
  // Every tensor's bytes must lie inside the mapping: touch the first and last, and
  // dequantize the small ones (open() bounds their size by the file's).
  volatile std::byte sink{};
  for (auto& t : f->tensors()) {
    if (t.size_bytes > 0) {
      sink = t.data[0];
      sink = t.data[t.size_bytes - 1];
    }
    if (gguf_element_count(t) <= (1u << 20)) (void)dequantize(t);
  }
  (void)sink;
  return 0;
}
