#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <caf/expected.hpp>

/// A checkpoint file mapped read-only, for the readers that hand out views of it
/// (safetensors, GGUF) instead of copying gigabytes.
namespace computron {

/// A regular file mapped read-only (MAP_PRIVATE). Move-only; unmaps itself. Views into it
/// stay valid across moves: the mapping never moves.
class mapped_file {
 public:
  /// Errors (io_error): a file that cannot be opened, is not a regular file, or cannot be
  /// mapped. An empty file maps nothing (data() is null, size() 0).
  static caf::expected<mapped_file> open(const std::string& path);

  mapped_file() = default;
  mapped_file(mapped_file&& other) noexcept;
  mapped_file& operator=(mapped_file&& other) noexcept;
  ~mapped_file();

  const std::byte* data() const { return static_cast<const std::byte*>(map_); }
  uint64_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace computron
