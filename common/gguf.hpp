#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "common/mapped_file.hpp"

/// GGUF checkpoints (llama.cpp's format, versions 2 and 3): a little-endian header, typed
/// metadata key/values (the architecture's hyperparameters, the tokenizer's vocabulary),
/// tensor infos, then the aligned tensor data. Read through mmap: tensors, strings and keys
/// are views of the mapping, never a whole-file copy. Dequantizes the types a small model
/// needs (F32, F16, BF16, Q8_0, Q4_0, Q4_1) to float exactly as ggml defines them.
namespace computron {

/// GGUF's metadata value types (their ids in the file are these values).
enum class gguf_value_type : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

/// "uint8", "string", "array", ... (the gguf Python package's names, lower case).
const char* gguf_value_type_name(gguf_value_type t);

/// One metadata value. Integers keep their signedness (i8..i64 as int64_t, u8..u64 as
/// uint64_t), floats widen to double, strings view the mapping. An array is a vector of its
/// element kind; an array of arrays is a vector of values. Views stay valid while the
/// gguf_file that made them lives (moves included).
struct gguf_value {
  gguf_value_type type = gguf_value_type::u8;
  /// Arrays only: their elements' type.
  gguf_value_type element_type = gguf_value_type::u8;
  std::variant<int64_t, uint64_t, double, bool, std::string_view, std::vector<int64_t>,
               std::vector<uint64_t>, std::vector<double>, std::vector<bool>,
               std::vector<std::string_view>, std::vector<gguf_value>>
      data;
};

/// One tensor: its metadata and a view of its bytes in the mapping.
struct gguf_tensor {
  std::string name;
  /// ggml's type id (0 = F32, 1 = F16, 2 = Q4_0, 3 = Q4_1, 8 = Q8_0, 30 = BF16, ...).
  uint32_t type = 0;
  /// GGUF order: dims[0] is the fastest-varying (the row length), the reverse of
  /// PyTorch's shape.
  std::vector<int64_t> dims;
  const std::byte* data = nullptr;
  uint64_t size_bytes = 0;
};

/// A GGUF file mapped read-only. Move-only; unmaps itself.
class gguf_file {
 public:
  /// Maps and validates `path`. Errors (io_error for a file that cannot be read,
  /// invalid_request for its contents, each naming the file and what is wrong where): a bad
  /// magic, an unsupported version, a truncated header, a count or length past the end, a bad
  /// value or ggml type, a bad alignment, a tensor byte range outside the file or misaligned.
  static caf::expected<gguf_file> open(const std::string& path);

  gguf_file(gguf_file&&) noexcept;
  gguf_file& operator=(gguf_file&&) noexcept;
  ~gguf_file();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  /// general.alignment, or GGUF's default of 32.
  uint64_t alignment() const { return alignment_; }

  /// The metadata value under `key`, or null.
  const gguf_value* find(std::string_view key) const;
  const std::map<std::string, gguf_value, std::less<>>& metadata() const { return metadata_; }

  // Typed getters. Errors (invalid_request): a missing key, another type, an integer that
  // does not fit. Strings are views of the mapping.
  caf::expected<std::string_view> get_string(std::string_view key) const;
  /// Any integer type; a uint64 above INT64_MAX is an error.
  caf::expected<int64_t> get_int(std::string_view key) const;
  /// float32 or float64.
  caf::expected<double> get_float(std::string_view key) const;
  caf::expected<bool> get_bool(std::string_view key) const;
  /// An array of strings (tokenizer.ggml.tokens, tokenizer.ggml.merges).
  caf::expected<std::vector<std::string_view>> get_strings(std::string_view key) const;
  /// An array of any integer type (tokenizer.ggml.token_type), range-checked.
  caf::expected<std::vector<int64_t>> get_ints(std::string_view key) const;
  /// An array of float32 (exact) or float64 (rounded; one past float32's range is an
  /// error) (tokenizer.ggml.scores).
  caf::expected<std::vector<float>> get_floats(std::string_view key) const;

  /// The tensor called `name`, or null.
  const gguf_tensor* find_tensor(std::string_view name) const;
  /// In file order.
  const std::vector<gguf_tensor>& tensors() const { return tensors_; }

 private:
  gguf_file() = default;
  caf::error mismatch(std::string_view key, const gguf_value* v, const char* wanted) const;

  std::string path_;
  mapped_file map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, gguf_value, std::less<>> metadata_;
  std::vector<gguf_tensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

/// "F32", "F16", "Q4_0", "Q4_1", "Q8_0", "BF16", "Q6_K", ... (ggml's names); "type N" for an
/// id ggml does not define.
std::string gguf_type_name(uint32_t type);

/// ggml's block layout of `type`: elements per block and bytes per block; false for an id
/// ggml does not define (or no longer does).
bool gguf_block_layout(uint32_t type, uint64_t& block_elements, uint64_t& block_bytes);

/// The bytes a tensor of `type` and `dims` takes. Errors (invalid_request, without a tensor
/// name): an unknown type id, a negative dimension, an element count past int64, a row
/// length (dims[0]) that is not a whole number of the type's blocks.
caf::expected<uint64_t> gguf_tensor_bytes(uint32_t type, const std::vector<int64_t>& dims);

/// The number of elements (the product of dims) of a tensor gguf_tensor_bytes accepts.
uint64_t gguf_element_count(const gguf_tensor& t);

/// `t`'s elements as float, in GGUF order (dims[0] fastest), into `out` (room for
/// gguf_element_count(t) floats). Errors (invalid_request, naming the tensor): a type other
/// than F32, F16, BF16, Q8_0, Q4_0, Q4_1; a size that disagrees with the dims; a row length
/// that is not a whole number of blocks.
caf::error dequantize(const gguf_tensor& t, float* out);
caf::expected<std::vector<float>> dequantize(const gguf_tensor& t);

}  // namespace computron
