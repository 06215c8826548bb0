#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "common/mapped_file.hpp"
#include "gpu/weight_store.hpp"

/// Safetensors checkpoints (a little-endian u64 header length, a JSON header naming
/// each tensor's dtype, shape and byte range, then the raw bytes). Read through mmap:
/// tensors are views of the mapping, never a whole-file copy.
namespace computron::models {

/// One tensor: its metadata and a pointer to its bytes (into the mapping when read,
/// caller-owned memory when written).
struct safetensor {
  std::string name;
  gpu::dtype type = gpu::dtype::f32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  uint64_t size_bytes = 0;
};

/// A safetensors file mapped read-only. Move-only; unmaps itself.
class safetensors_file {
 public:
  /// Maps and validates `path`. Errors (io_error / invalid_request, each saying what and
  /// where): a missing file, a truncated file, a header that is not JSON or not an
  /// object, a bad dtype, shape or byte range, ranges that overlap the header end.
  static caf::expected<safetensors_file> open(const std::string& path);

  safetensors_file(safetensors_file&&) noexcept;
  safetensors_file& operator=(safetensors_file&&) noexcept;
  ~safetensors_file();

  /// The tensor called `name`, or null.
  const safetensor* find(std::string_view name) const;
  const std::map<std::string, safetensor, std::less<>>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  safetensors_file() = default;
  mapped_file map_;
  std::map<std::string, safetensor, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Writes a checkpoint atomically (a temporary file renamed into place). Errors: a size
/// that disagrees with dtype x shape, duplicate names, I/O failures.
caf::error write_safetensors(const std::string& path, const std::vector<safetensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

/// "F32", "BF16", ... (the format's names).
const char* safetensors_dtype_name(gpu::dtype t);

}  // namespace computron::models
