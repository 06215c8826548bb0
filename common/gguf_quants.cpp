// ggml's tensor types (names and block layouts) and the dequantization of the few a small
// model needs, written from ggml's block definitions (ggml-common.h, ggml-quants.c):
//   Q8_0: f16 scale d, 32 x int8 q;              x = q * d
//   Q4_0: f16 scale d, 16 bytes of nibbles;      x = (q - 8) * d
//   Q4_1: f16 scale d, f16 minimum m, 16 bytes;  x = q * d + m
// In Q4_0 and Q4_1, byte j's low nibble is element j and its high nibble element j + 16.
// Each product and sum is rounded to float on its own, as ggml's reference code and the gguf
// Python package do (CMakeLists.txt compiles this file with -ffp-contract=off, so that a
// compiler targeting FMA cannot fuse q * d + m and change the last bit).
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"
#include "common/gguf.hpp"

namespace computron {

namespace {

struct type_info {
  uint32_t id;
  const char* name;
  uint64_t block_elements;
  uint64_t block_bytes;
};

// ggml's types (ggml.h's enum ggml_type with ggml.c's type traits); ids 4, 5 and 31..33,
// 36..38 were removed from ggml and are refused.
constexpr type_info types[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},    {40, "NVFP4", 64, 36},
    {41, "Q1_0", 128, 18},
};

constexpr uint32_t type_f32 = 0, type_f16 = 1, type_q4_0 = 2, type_q4_1 = 3, type_q8_0 = 8,
                   type_bf16 = 30;

const type_info* info_of(uint32_t type) {
  for (auto& t : types)
    if (t.id == type) return &t;
  return nullptr;
}

uint16_t load_u16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<uint16_t>(p[0]) | (static_cast<uint16_t>(p[1]) << 8));
}

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// IEEE half to float, exact (every half is a float): subnormals scaled, infinities and NaNs
/// (payload kept) widened.
float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // mantissa * 2^-24: an integer below 2^10 times a power of two, so exact.
    float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    uint32_t bits;
    std::memcpy(&bits, &magnitude, sizeof bits);
    return from_bits(sign | bits);
  }
  if (exponent == 31) return from_bits(sign | 0x7f800000u | (mantissa << 13));
  return from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

float bf16_to_float(uint16_t b) {
  return from_bits(static_cast<uint32_t>(b) << 16);
}

caf::error bad_tensor(const gguf_tensor& t, const std::string& why) {
  return make_error(ec::invalid_request, fmt::format("tensor '{}' {}", t.name, why));
}

/// Q4_0 and Q4_1's 16 bytes of nibbles: byte j holds element j (low) and j + 16 (high).
template <class Value>
void unpack_nibbles(const std::byte* qs, float* out, Value value) {
  for (int j = 0; j < 16; ++j) {
    auto byte = static_cast<uint8_t>(qs[j]);
    out[j] = value(byte & 0x0f);
    out[j + 16] = value(byte >> 4);
  }
}

}  // namespace

std::string gguf_type_name(uint32_t type) {
  if (auto* t = info_of(type)) return t->name;
  return fmt::format("type {}", type);
}

bool gguf_block_layout(uint32_t type, uint64_t& block_elements, uint64_t& block_bytes) {
  auto* t = info_of(type);
  if (t == nullptr) return false;
  block_elements = t->block_elements;
  block_bytes = t->block_bytes;
  return true;
}

caf::expected<uint64_t> gguf_tensor_bytes(uint32_t type, const std::vector<int64_t>& dims) {
  auto* t = info_of(type);
  if (t == nullptr)
    return make_error(ec::invalid_request, fmt::format("unknown ggml type id {}", type));
  uint64_t elements = 1;
  for (auto d : dims) {
    if (d < 0) return make_error(ec::invalid_request, fmt::format("negative dimension {}", d));
    auto v = static_cast<uint64_t>(d);
    // ggml counts elements in int64_t.
    if (v != 0 && elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / v)
      return make_error(ec::invalid_request, "dimensions overflow a 64-bit element count");
    elements *= v;
  }
  if (!dims.empty() && static_cast<uint64_t>(dims[0]) % t->block_elements != 0)
    return make_error(ec::invalid_request,
                      fmt::format("row length {} is not a multiple of {}'s block of {}", dims[0],
                                  t->name, t->block_elements));
  auto blocks = elements / t->block_elements;
  if (blocks > std::numeric_limits<uint64_t>::max() / t->block_bytes)
    return make_error(ec::invalid_request, "byte size overflows 64 bits");
  return blocks * t->block_bytes;
}

uint64_t gguf_element_count(const gguf_tensor& t) {
  uint64_t n = 1;
  for (auto d : t.dims) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

/// Everything dequantize checks before it touches `out`.
caf::error check_dequantizable(const gguf_tensor& t) {
  switch (t.type) {
    case type_f32:
    case type_f16:
    case type_bf16:
    case type_q8_0:
    case type_q4_0:
    case type_q4_1:
      break;
    default:
      return bad_tensor(t, fmt::format("is {}: not supported (F32, F16, BF16, Q8_0, Q4_0, "
                                       "Q4_1 are)",
                                       gguf_type_name(t.type)));
  }
  // open() checked these for its own tensors; a caller's hand-made one is checked here.
  auto bytes = gguf_tensor_bytes(t.type, t.dims);
  if (!bytes) return with_context(bytes.error(), fmt::format("tensor '{}'", t.name));
  if (*bytes != t.size_bytes)
    return bad_tensor(t, fmt::format("has {} bytes, {} of {} needs {}", t.size_bytes,
                                     gguf_type_name(t.type), fmt::join(t.dims, "x"), *bytes));
  if (t.size_bytes > 0 && t.data == nullptr) return bad_tensor(t, "has no data");
  return {};
}

}  // namespace

caf::error dequantize(const gguf_tensor& t, float* out) {
  if (auto err = check_dequantizable(t)) return err;
  if (t.size_bytes > 0 && out == nullptr) return bad_tensor(t, "has no output buffer");
  auto n = gguf_element_count(t);
  // An empty tensor (a zero dimension) may have neither data nor buffer: memcpy would be
  // handed null.
  if (n == 0) return {};
  const std::byte* p = t.data;
  switch (t.type) {
    case type_f32:
      std::memcpy(out, p, n * sizeof(float));
      break;
    case type_f16:
      for (uint64_t i = 0; i < n; ++i) out[i] = half_to_float(load_u16(p + 2 * i));
      break;
    case type_bf16:
      for (uint64_t i = 0; i < n; ++i) out[i] = bf16_to_float(load_u16(p + 2 * i));
      break;
    case type_q8_0:
      for (uint64_t b = 0; b < n / 32; ++b, p += 34, out += 32) {
        float d = half_to_float(load_u16(p));
        for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(p[2 + j])) * d;
      }
      break;
    case type_q4_0:
      for (uint64_t b = 0; b < n / 32; ++b, p += 18, out += 32) {
        float d = half_to_float(load_u16(p));
        unpack_nibbles(p + 2, out, [d](int q) { return static_cast<float>(q - 8) * d; });
      }
      break;
    case type_q4_1:
      for (uint64_t b = 0; b < n / 32; ++b, p += 20, out += 32) {
        float d = half_to_float(load_u16(p));
        float m = half_to_float(load_u16(p + 2));
        unpack_nibbles(p + 4, out, [d, m](int q) {
          float scaled = static_cast<float>(q) * d;
          return scaled + m;
        });
      }
      break;
  }
  return {};
}

caf::expected<std::vector<float>> dequantize(const gguf_tensor& t) {
  // Checked before allocating: a hand-made tensor's dims may promise more than its bytes.
  if (auto err = check_dequantizable(t)) return err;
  std::vector<float> out(gguf_element_count(t));
  if (auto err = dequantize(t, out.data())) return err;
  return out;
}

}  // namespace computron
