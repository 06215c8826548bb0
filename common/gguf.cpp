#include "common/gguf.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "common/error.hpp"

namespace computron {

namespace {

/// Arrays of arrays: the gguf Python package writes them, ggml reads none. Deeper nesting is
/// corruption (and unbounded recursion on a fuzzed file).
constexpr int max_array_depth = 4;
/// GGML_MAX_DIMS.
constexpr uint32_t max_dims = 4;
/// The fewest bytes a metadata entry (key length, type, a one-byte value) and a tensor info
/// (name length, n_dims, one dim, type, offset) take: a count beyond the bytes left at these
/// sizes is refused before anything is reserved.
constexpr uint64_t min_entry_bytes = 8 + 4 + 1;
constexpr uint64_t min_tensor_info_bytes = 8 + 4 + 8 + 4 + 8;

caf::error corrupt(const std::string& path, const std::string& why) {
  return make_error(ec::invalid_request, fmt::format("{}: not a valid GGUF file: {}", path, why));
}

/// The encoded size of a value of type `t`; for strings and arrays, their fewest bytes (a
/// length or an element type and count); 0 for an id GGUF does not define.
uint64_t min_value_bytes(uint32_t t) {
  switch (static_cast<gguf_value_type>(t)) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::boolean:
      return 1;
    case gguf_value_type::u16:
    case gguf_value_type::i16:
      return 2;
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::f32:
      return 4;
    case gguf_value_type::u64:
    case gguf_value_type::i64:
    case gguf_value_type::f64:
    case gguf_value_type::string:
      return 8;
    case gguf_value_type::array:
      return 4 + 8;
  }
  return 0;
}

bool is_signed(gguf_value_type t) {
  return t == gguf_value_type::i8 || t == gguf_value_type::i16 || t == gguf_value_type::i32 ||
         t == gguf_value_type::i64;
}

bool is_unsigned(gguf_value_type t) {
  return t == gguf_value_type::u8 || t == gguf_value_type::u16 || t == gguf_value_type::u32 ||
         t == gguf_value_type::u64;
}

/// Where a value sits, for error messages: built only when something fails, since the
/// tokenizer's arrays hold a hundred thousand strings.
struct where {
  std::string_view key;
  const uint64_t* index = nullptr;  // the element, inside an array
  /// What is read before a key is known ("tensor info 3"), said as is.
  std::string_view plain = {};
  std::string text() const {
    if (!plain.empty()) return std::string{plain};
    return index ? fmt::format("metadata '{}' element {}", key, *index)
                 : fmt::format("metadata '{}'", key);
  }
};

/// A bounds-checked little-endian reader over the mapping.
class reader {
 public:
  reader(const std::string& path, const std::byte* base, uint64_t size)
      : path_(path), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const std::byte* at(uint64_t offset) const { return base_ + offset; }
  caf::error fail(const std::string& why) const { return corrupt(path_, why); }

  caf::error truncated(const std::string& what, uint64_t need) const {
    return fail(fmt::format("{} needs {} bytes at byte {}, {} left (truncated file?)", what, need,
                            pos_, left()));
  }

  /// An unsigned integer of `width` bytes (1, 2, 4, 8); false at the end of the file.
  bool uint(int width, uint64_t& out) {
    if (left() < static_cast<uint64_t>(width)) return false;
    out = 0;
    for (int i = width - 1; i >= 0; --i)
      out = (out << 8) | static_cast<uint8_t>(base_[pos_ + static_cast<uint64_t>(i)]);
    pos_ += static_cast<uint64_t>(width);
    return true;
  }

  caf::error u32(uint32_t& out, const std::string& what) {
    uint64_t v = 0;
    if (!uint(4, v)) return truncated(what, 4);
    out = static_cast<uint32_t>(v);
    return {};
  }

  caf::error u64(uint64_t& out, const std::string& what) {
    return uint(8, out) ? caf::error{} : truncated(what, 8);
  }

  /// A GGUF string (u64 length, then bytes), viewing the mapping.
  caf::error string(std::string_view& out, const where& w) {
    uint64_t len = 0;
    if (!uint(8, len)) return truncated(w.text() + " string length", 8);
    if (len > left())
      return fail(
          fmt::format("{}: a string of {} bytes at byte {}, {} left", w.text(), len, pos_, left()));
    out = std::string_view{reinterpret_cast<const char*>(base_ + pos_), len};
    pos_ += len;
    return {};
  }

 private:
  const std::string& path_;
  const std::byte* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

int64_t sign_extend(uint64_t v, uint64_t width) {
  if (width == 8) return static_cast<int64_t>(v);
  auto shift = 64 - 8 * width;
  return static_cast<int64_t>(v << shift) >> shift;
}

double float_of(uint64_t bits, uint64_t width) {
  if (width == 4) {
    auto b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  }
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

caf::error read_array(reader& r, gguf_value& out, int depth, const where& w);

/// One value of type `t` (checked to be a GGUF type) into `out`.
caf::error read_value(reader& r, gguf_value_type t, gguf_value& out, int depth, const where& w) {
  out.type = t;
  if (t == gguf_value_type::array) return read_array(r, out, depth + 1, w);
  if (t == gguf_value_type::string) {
    std::string_view s;
    if (auto err = r.string(s, w)) return err;
    out.data = s;
    return {};
  }
  auto width = min_value_bytes(static_cast<uint32_t>(t));
  uint64_t v = 0;
  if (!r.uint(static_cast<int>(width), v)) return r.truncated(w.text(), width);
  if (is_signed(t))
    out.data = sign_extend(v, width);
  else if (is_unsigned(t))
    out.data = v;
  else if (t == gguf_value_type::boolean)
    out.data = v != 0;  // any non-zero byte, as C reads it
  else
    out.data = float_of(v, width);
  return {};
}

/// `count` fixed-size elements, whose bytes the caller checked are there.
template <class T, class Convert>
std::vector<T> read_fixed(reader& r, uint64_t count, uint64_t width, Convert convert) {
  std::vector<T> items;
  items.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t v = 0;
    r.uint(static_cast<int>(width), v);
    items.push_back(convert(v));
  }
  return items;
}

caf::error read_array(reader& r, gguf_value& out, int depth, const where& w) {
  if (depth > max_array_depth)
    return r.fail(fmt::format("{}: arrays nested deeper than {}", w.text(), max_array_depth));
  // Nested arrays come here once per element: the error text is made only on an error.
  uint64_t elem = 0, count = 0;
  if (!r.uint(4, elem)) return r.truncated(w.text() + " array type", 4);
  if (!r.uint(8, count)) return r.truncated(w.text() + " array length", 8);
  auto width = min_value_bytes(static_cast<uint32_t>(elem));
  if (width == 0)
    return r.fail(fmt::format("{}: array of type id {} (GGUF defines 0..12)", w.text(), elem));
  if (count > r.left() / width)
    return r.fail(fmt::format(
        "{}: {} elements of {} at byte {} cannot fit in the {} bytes left", w.text(), count,
        gguf_value_type_name(static_cast<gguf_value_type>(elem)), r.pos(), r.left()));
  auto t = static_cast<gguf_value_type>(elem);
  out.element_type = t;
  if (is_signed(t)) {
    out.data =
        read_fixed<int64_t>(r, count, width, [&](uint64_t v) { return sign_extend(v, width); });
  } else if (is_unsigned(t)) {
    out.data = read_fixed<uint64_t>(r, count, width, [](uint64_t v) { return v; });
  } else if (t == gguf_value_type::boolean) {
    out.data = read_fixed<bool>(r, count, width, [](uint64_t v) { return v != 0; });
  } else if (t == gguf_value_type::f32 || t == gguf_value_type::f64) {
    out.data = read_fixed<double>(r, count, width, [&](uint64_t v) { return float_of(v, width); });
  } else if (t == gguf_value_type::string) {
    std::vector<std::string_view> items;
    items.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      std::string_view s;
      if (auto err = r.string(s, where{w.key, &i})) return err;
      items.push_back(s);
    }
    out.data = std::move(items);
  } else {
    std::vector<gguf_value> items(count);
    for (uint64_t i = 0; i < count; ++i)
      if (auto err = read_value(r, t, items[i], depth, where{w.key, &i})) return err;
    out.data = std::move(items);
  }
  return {};
}

/// `pos` rounded up to `alignment` (a power of two); false past 64 bits.
bool align_up(uint64_t pos, uint64_t alignment, uint64_t& out) {
  auto pad = (alignment - pos % alignment) % alignment;
  if (pos > std::numeric_limits<uint64_t>::max() - pad) return false;
  out = pos + pad;
  return true;
}

}  // namespace

const char* gguf_value_type_name(gguf_value_type t) {
  static const char* const names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                      "int32",  "float32", "bool",   "string", "array",
                                      "uint64", "int64",   "float64"};
  auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

gguf_file::gguf_file(gguf_file&&) noexcept = default;
gguf_file& gguf_file::operator=(gguf_file&&) noexcept = default;
gguf_file::~gguf_file() = default;

caf::expected<gguf_file> gguf_file::open(const std::string& path) {
  auto map = mapped_file::open(path);
  if (!map) return map.error();
  auto file_bytes = map->size();
  // magic, version, tensor count, metadata count.
  if (file_bytes < 4 + 4 + 8 + 8)
    return corrupt(path, fmt::format("{} bytes, shorter than the 24-byte header", file_bytes));
  gguf_file f;
  f.path_ = path;
  f.map_ = std::move(*map);
  reader r{f.path_, f.map_.data(), file_bytes};

  uint64_t magic = 0;
  r.uint(4, magic);         // the 24 bytes are there
  if (magic != 0x46554747)  // "GGUF", little-endian
    return r.fail("the file does not start with \"GGUF\"");
  if (auto err = r.u32(f.version_, "version")) return err;
  if (f.version_ != 2 && f.version_ != 3)
    return r.fail(fmt::format("GGUF version {} is not supported (2 and 3 are){}", f.version_,
                              (f.version_ & 0xffff) == 0 ? "; a big-endian file?" : ""));
  uint64_t tensor_count = 0, kv_count = 0;
  if (auto err = r.u64(tensor_count, "tensor count")) return err;
  if (auto err = r.u64(kv_count, "metadata count")) return err;
  if (kv_count > r.left() / min_entry_bytes)
    return r.fail(
        fmt::format("{} metadata entries cannot fit in the {} bytes left", kv_count, r.left()));
  if (tensor_count > r.left() / min_tensor_info_bytes)
    return r.fail(
        fmt::format("{} tensors cannot fit in the {} bytes left", tensor_count, r.left()));

  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string_view key;
    auto entry = fmt::format("metadata entry {}", i);
    if (auto err = r.string(key, where{{}, nullptr, entry})) return err;
    uint32_t type = 0;
    if (auto err = r.u32(type, fmt::format("metadata '{}' type", key))) return err;
    if (min_value_bytes(type) == 0)
      return r.fail(fmt::format("metadata '{}' has type id {} (GGUF defines 0..12)", key, type));
    gguf_value value;
    if (auto err = read_value(r, static_cast<gguf_value_type>(type), value, 0, where{key}))
      return err;
    if (!f.metadata_.emplace(std::string{key}, std::move(value)).second)
      return r.fail(fmt::format("metadata '{}' appears twice", key));
  }
  if (f.find("general.alignment") != nullptr) {
    auto a = f.get_int("general.alignment");
    if (!a) return a.error();
    if (*a <= 0 || (*a & (*a - 1)) != 0)
      return r.fail(fmt::format("general.alignment {} is not a power of two", *a));
    f.alignment_ = static_cast<uint64_t>(*a);
  }

  f.tensors_.reserve(tensor_count);
  std::vector<uint64_t> offsets;
  offsets.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    std::string_view name;
    auto entry = fmt::format("tensor info {}", i);
    if (auto err = r.string(name, where{{}, nullptr, entry})) return err;
    gguf_tensor t;
    t.name = std::string{name};
    auto what = [&](const char* field) { return fmt::format("tensor '{}' {}", t.name, field); };
    uint32_t n_dims = 0;
    if (auto err = r.u32(n_dims, what("dimension count"))) return err;
    if (n_dims < 1 || n_dims > max_dims)
      return r.fail(fmt::format("tensor '{}' has {} dimensions (1 to {} are allowed)", t.name,
                                n_dims, max_dims));
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (auto err = r.u64(dim, what("dimensions"))) return err;
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    uint64_t offset = 0;
    if (auto err = r.u32(t.type, what("type"))) return err;
    if (auto err = r.u64(offset, what("offset"))) return err;
    auto bytes = gguf_tensor_bytes(t.type, t.dims);
    if (!bytes) return with_context(bytes.error(), fmt::format("{}: tensor '{}'", path, t.name));
    t.size_bytes = *bytes;
    if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second)
      return r.fail(fmt::format("tensor '{}' appears twice", t.name));
    f.tensors_.push_back(std::move(t));
    offsets.push_back(offset);
  }

  // The data section starts at the next multiple of the alignment; offsets count from it.
  uint64_t data_start = 0;
  if (!align_up(r.pos(), f.alignment_, data_start) || (data_start > file_bytes && tensor_count > 0))
    return r.fail(
        fmt::format("the data section, aligned to {} after the header's {} bytes, "
                    "starts past the end of the file ({} bytes)",
                    f.alignment_, r.pos(), file_bytes));
  auto data_bytes = tensor_count > 0 ? file_bytes - data_start : 0;
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    auto& t = f.tensors_[i];
    auto offset = offsets[i];
    if (offset % f.alignment_ != 0)
      return r.fail(fmt::format("tensor '{}': offset {} is not a multiple of the alignment {}",
                                t.name, offset, f.alignment_));
    if (offset > data_bytes || t.size_bytes > data_bytes - offset)
      return r.fail(
          fmt::format("tensor '{}': {} bytes at offset {} run past the end of the "
                      "file ({} data bytes from byte {})",
                      t.name, t.size_bytes, offset, data_bytes, data_start));
    t.data = r.at(data_start + offset);
  }
  return f;
}

const gguf_value* gguf_file::find(std::string_view key) const {
  auto i = metadata_.find(key);
  return i == metadata_.end() ? nullptr : &i->second;
}

const gguf_tensor* gguf_file::find_tensor(std::string_view name) const {
  auto i = tensor_index_.find(name);
  return i == tensor_index_.end() ? nullptr : &tensors_[i->second];
}

caf::error gguf_file::mismatch(std::string_view key, const gguf_value* v,
                               const char* wanted) const {
  if (v == nullptr)
    return make_error(ec::invalid_request, fmt::format("{}: no metadata '{}'", path_, key));
  auto is = v->type == gguf_value_type::array
                ? fmt::format("an array of {}", gguf_value_type_name(v->element_type))
                : std::string{gguf_value_type_name(v->type)};
  return make_error(ec::invalid_request,
                    fmt::format("{}: metadata '{}' is {}, not {}", path_, key, is, wanted));
}

caf::expected<std::string_view> gguf_file::get_string(std::string_view key) const {
  auto* v = find(key);
  if (v != nullptr)
    if (auto* s = std::get_if<std::string_view>(&v->data)) return *s;
  return mismatch(key, v, "a string");
}

caf::expected<int64_t> gguf_file::get_int(std::string_view key) const {
  auto* v = find(key);
  if (v != nullptr) {
    if (auto* i = std::get_if<int64_t>(&v->data)) return *i;
    if (auto* u = std::get_if<uint64_t>(&v->data)) {
      if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return make_error(
            ec::invalid_request,
            fmt::format("{}: metadata '{}' = {} does not fit in int64", path_, key, *u));
      return static_cast<int64_t>(*u);
    }
  }
  return mismatch(key, v, "an integer");
}

caf::expected<double> gguf_file::get_float(std::string_view key) const {
  auto* v = find(key);
  if (v != nullptr)
    if (auto* d = std::get_if<double>(&v->data)) return *d;
  return mismatch(key, v, "a float");
}

caf::expected<bool> gguf_file::get_bool(std::string_view key) const {
  auto* v = find(key);
  if (v != nullptr)
    if (auto* b = std::get_if<bool>(&v->data)) return *b;
  return mismatch(key, v, "a bool");
}

caf::expected<std::vector<std::string_view>> gguf_file::get_strings(std::string_view key) const {
  auto* v = find(key);
  if (v != nullptr)
    if (auto* s = std::get_if<std::vector<std::string_view>>(&v->data)) return *s;
  return mismatch(key, v, "an array of strings");
}

caf::expected<std::vector<int64_t>> gguf_file::get_ints(std::string_view key) const {
  auto* v = find(key);
  if (v != nullptr) {
    if (auto* i = std::get_if<std::vector<int64_t>>(&v->data)) return *i;
    if (auto* u = std::get_if<std::vector<uint64_t>>(&v->data)) {
      std::vector<int64_t> out;
      out.reserve(u->size());
      for (auto x : *u) {
        if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return make_error(ec::invalid_request,
                            fmt::format("{}: metadata '{}' holds {}, past int64", path_, key, x));
        out.push_back(static_cast<int64_t>(x));
      }
      return out;
    }
  }
  return mismatch(key, v, "an array of integers");
}

caf::expected<std::vector<float>> gguf_file::get_floats(std::string_view key) const {
  auto* v = find(key);
  if (v != nullptr)
    if (auto* d = std::get_if<std::vector<double>>(&v->data)) {
      std::vector<float> out;
      out.reserve(d->size());
      for (auto x : *d) {
        // A finite float64 beyond float's range has no float (the conversion is undefined).
        if (std::isfinite(x) && std::abs(x) > std::numeric_limits<float>::max())
          return make_error(ec::invalid_request,
                            fmt::format("{}: metadata '{}' holds {}, past float32", path_, key, x));
        out.push_back(static_cast<float>(x));
      }
      return out;
    }
  return mismatch(key, v, "an array of floats");
}

}  // namespace computron
