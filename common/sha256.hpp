#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

/// SHA-256 (FIPS 180-4), incremental. Content keys that a cache trusts (a LoRA adapter's
/// identity) need a hash nobody can collide on purpose, which FNV or splitmix are not;
/// this avoids pulling OpenSSL into the torch-free libraries for one function.
namespace computron {

class sha256 {
 public:
  sha256();

  /// Appends `size` bytes to the message.
  void update(const void* data, size_t size);
  void update(std::string_view text) { update(text.data(), text.size()); }

  /// The digest of everything appended; the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();

  /// The digest as 64 lowercase hex digits.
  std::string finish_hex();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace computron
