#include "models/safetensors.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace computron::models {

namespace {

/// Headers are small (a few MB for the largest models); anything bigger is corrupt.
constexpr uint64_t max_header_bytes = 100ull << 20;

caf::error corrupt(const std::string& path, const std::string& why) {
  return make_error(ec::invalid_request,
                    fmt::format("{}: not a valid safetensors file: {}", path, why));
}

bool parse_dtype(const std::string& s, gpu::dtype& out) {
  static const std::pair<const char*, gpu::dtype> names[] = {
      {"F32", gpu::dtype::f32}, {"F16", gpu::dtype::f16}, {"BF16", gpu::dtype::bf16},
      {"I64", gpu::dtype::i64}, {"I32", gpu::dtype::i32}, {"I8", gpu::dtype::i8},
      {"U8", gpu::dtype::u8}};
  for (auto& [name, t] : names)
    if (s == name) {
      out = t;
      return true;
    }
  return false;
}

}  // namespace

const char* safetensors_dtype_name(gpu::dtype t) {
  switch (t) {
    case gpu::dtype::f32:
      return "F32";
    case gpu::dtype::f16:
      return "F16";
    case gpu::dtype::bf16:
      return "BF16";
    case gpu::dtype::i64:
      return "I64";
    case gpu::dtype::i32:
      return "I32";
    case gpu::dtype::i8:
      return "I8";
    case gpu::dtype::u8:
      return "U8";
  }
  return "U8";
}

safetensors_file::safetensors_file(safetensors_file&&) noexcept = default;
safetensors_file& safetensors_file::operator=(safetensors_file&&) noexcept = default;
safetensors_file::~safetensors_file() = default;

const safetensor* safetensors_file::find(std::string_view name) const {
  auto i = tensors_.find(name);
  return i == tensors_.end() ? nullptr : &i->second;
}

caf::expected<safetensors_file> safetensors_file::open(const std::string& path) {
  auto map = mapped_file::open(path);
  if (!map) return map.error();
  auto file_bytes = map->size();
  if (file_bytes < 8)
    return corrupt(path,
                   fmt::format("{} bytes, shorter than the 8-byte header length", file_bytes));
  safetensors_file f;
  f.map_ = std::move(*map);
  const auto* base = f.map_.data();
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(base[i]);
  if (header_len > max_header_bytes || header_len > file_bytes - 8)
    return corrupt(path, fmt::format("header of {} bytes in a file of {}", header_len, file_bytes));
  auto data_bytes = file_bytes - 8 - header_len;
  const auto* data = base + 8 + header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(base + 8),
                                   reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const std::exception& e) {
    return corrupt(path, fmt::format("header is not JSON ({})", e.what()));
  }
  if (!header.is_object()) return corrupt(path, "header is not a JSON object");
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return corrupt(path, "__metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) return corrupt(path, fmt::format("metadata '{}' is not a string", k));
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    // A copy: a lambda may not capture a structured binding in C++17 (clang refuses).
    const std::string& tensor = name;
    auto where = [&](const std::string& why) {
      return corrupt(path, fmt::format("tensor '{}': {}", tensor, why));
    };
    if (!entry.is_object()) return where("entry is not an object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || sh == entry.end() || off == entry.end())
      return where("needs dtype, shape and data_offsets");
    safetensor t;
    t.name = name;
    if (!dt->is_string() || !parse_dtype(dt->get<std::string>(), t.type))
      return where(fmt::format("unsupported dtype {}", dt->dump()));
    if (!sh->is_array()) return where("shape is not an array");
    uint64_t elems = 1;
    for (auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return where("shape has a non-integer or negative dimension");
      auto v = static_cast<uint64_t>(d.get<int64_t>());
      if (v != 0 && elems > std::numeric_limits<uint64_t>::max() / v)
        return where("shape overflows");
      elems *= v;
      t.shape.push_back(d.get<int64_t>());
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      return where("data_offsets must be two unsigned integers");
    auto begin = (*off)[0].get<uint64_t>();
    auto end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_bytes)
      return where(fmt::format("byte range [{}, {}) outside the {} data bytes (truncated file?)",
                               begin, end, data_bytes));
    auto width = gpu::size_of(t.type);
    if (elems > std::numeric_limits<uint64_t>::max() / width || end - begin != elems * width)
      return where(fmt::format("{} bytes for {} elements of {}", end - begin, elems,
                               gpu::to_string(t.type)));
    t.data = data + begin;
    t.size_bytes = end - begin;
    f.tensors_.emplace(name, std::move(t));
  }
  return f;
}

caf::error write_safetensors(const std::string& path, const std::vector<safetensor>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      return make_error(ec::invalid_request, fmt::format("bad tensor name '{}'", t.name));
    if (!names.insert(t.name).second)
      return make_error(ec::invalid_request, fmt::format("duplicate tensor '{}'", t.name));
    uint64_t elems = 1;
    for (auto d : t.shape) {
      if (d < 0)
        return make_error(ec::invalid_request,
                          fmt::format("tensor '{}' has a negative dimension", t.name));
      elems *= static_cast<uint64_t>(d);
    }
    if (elems * gpu::size_of(t.type) != t.size_bytes || (t.size_bytes > 0 && t.data == nullptr))
      return make_error(ec::invalid_request,
                        fmt::format("tensor '{}': {} bytes given, dtype x shape needs {}", t.name,
                                    t.size_bytes, elems * gpu::size_of(t.type)));
    header[t.name] = {{"dtype", safetensors_dtype_name(t.type)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.size_bytes}}};
    offset += t.size_bytes;
  }
  auto text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  auto tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return make_error(ec::io_error,
                        fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
    uint64_t len = text.size();
    char len_bytes[8];
    for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>((len >> (8 * i)) & 0xff);
    out.write(len_bytes, 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (auto& t : tensors)
      out.write(reinterpret_cast<const char*>(t.data), static_cast<std::streamsize>(t.size_bytes));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return make_error(ec::io_error, fmt::format("writing {} failed", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = make_error(
        ec::io_error, fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
    std::remove(tmp.c_str());
    return err;
  }
  return {};
}

}  // namespace computron::models
