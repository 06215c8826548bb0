// One stage's KV block pool (chunks of device memory cut into blocks) and a step's writes
// into and reads from the blocks. The tables that say which blocks a row holds, and the
// plans of each step, are kv_cache.cpp's.
#include "engine/torch/kv_blocks.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <map>

#include "common/error.hpp"
#include "engine/torch/torch_interop.hpp"

namespace computron::models::detail {

kv_block_pool::kv_block_pool(std::string name, int64_t layers, int64_t kv_heads, int64_t head_dim,
                             at::TensorOptions options, kv_pool_options opts)
    : name_(std::move(name)),
      layers_(layers),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      options_(options),
      opts_(std::move(opts)),
      block_bytes_(static_cast<uint64_t>(layers * 2 * kv_heads * kv_block_tokens * head_dim) *
                   static_cast<uint64_t>(c10::elementSize(options.dtype().toScalarType()))) {}

kv_block_pool::~kv_block_pool() {
  // Caches hold the pool, so none is left: every chunk is already back, unless a cache
  // leaked its blocks. Give the memory back after the last kernel that may read it.
  if (!chunks_.empty()) finish_compute(options_.device());
}

kv_block_pool::chunk& kv_block_pool::at_(block_id b) const {
  return *chunks_[static_cast<size_t>(chunk_of(b))];
}

caf::expected<at::Tensor> kv_block_pool::allocate_chunk(int64_t blocks) {
  std::vector<int64_t> shape{layers_, 2, kv_heads_, blocks, kv_block_tokens, head_dim_};
  const auto bytes = static_cast<uint64_t>(blocks) * block_bytes_;
  if (!opts_.allocate) {
    try {
      return at::empty(shape, options_);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      return make_error(msg.find("out of memory") != std::string::npos ? ec::out_of_device_memory
                                                                       : ec::device_error,
                        msg.substr(0, msg.find('\n')));
    }
  }
  auto mem = opts_.allocate(bytes);
  if (!mem) return std::move(mem.error());
  if (mem->data == nullptr)
    return make_error(ec::device_error,
                      fmt::format("the KV allocator gave no memory for {} bytes", bytes));
  try {
    // The tensor's storage holds the memory's owner: the chunk's bytes go back to the
    // device when the last view of the chunk goes.
    auto owner = std::move(mem->owner);
    return at::from_blob(
        mem->data, shape, [owner](void*) mutable { owner.reset(); }, options_);
  } catch (const std::exception& e) {
    return make_error(ec::device_error, fmt::format("KV chunk over device memory: {}", e.what()));
  }
}

caf::error kv_block_pool::grow(int64_t need) {
  // Doubling keeps the chunks few (each chunk is one more gather per layer and step);
  // where the device has no room for that, exactly what is needed. Beyond what a step
  // needs, a chunk stays within the spare its batch holds in the ledger: the device's
  // memory past that is the ledger's to give to weights or to other models' KV. (A grow
  // takes every free block first, so afterwards the free ones are the chunk's extra.)
  const int64_t cap = spare_ >= 0 ? need + spare_ : std::numeric_limits<int64_t>::max();
  std::vector<int64_t> sizes{std::min(cap, std::max({need, opts_.min_chunk_blocks, allocated_})),
                             std::min(cap, std::max(need, opts_.min_chunk_blocks)), need};
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  caf::error last;
  const auto page = std::max<uint64_t>(1, opts_.page_bytes);
  for (auto n : sizes) {
    // The device maps whole pages: the blocks that fill them are the chunk's too.
    const auto pages = (static_cast<uint64_t>(n) * block_bytes_ + page - 1) / page * page;
    n = std::max<int64_t>(n, static_cast<int64_t>(pages / block_bytes_));
    auto data = allocate_chunk(n);
    if (!data) {
      last = std::move(data.error());
      continue;
    }
    auto c = std::make_unique<chunk>();
    c->data = std::move(*data);
    c->holders.assign(static_cast<size_t>(n), 0);
    c->device_bytes = pages;
    for (auto i = n; i-- > 0;) c->free.push_back(i);  // index 0 taken first
    auto slot = std::find(chunks_.begin(), chunks_.end(), nullptr);
    if (slot == chunks_.end())
      chunks_.push_back(std::move(c));
    else
      *slot = std::move(c);
    allocated_ += n;
    device_bytes_ += pages;
    ++version_;
    return {};
  }
  auto numbers = fmt::format(
      "{}: no room for {} more KV blocks of {} bytes ({} blocks allocated, {} in use, "
      "chunks of {} tried)",
      name_, need, block_bytes_, allocated_, held_, fmt::join(sizes, ", "));
  // The allocator's code stays (a full device is out_of_device_memory, a broken one a
  // device_error); the numbers say what was asked.
  return with_context(last, numbers);
}

void kv_block_pool::set_spare(int64_t blocks) {
  std::lock_guard<std::mutex> guard{mtx_};
  spare_ = std::max<int64_t>(-1, blocks);
}

caf::expected<std::vector<block_id>> kv_block_pool::take(int64_t n) {
  std::lock_guard<std::mutex> guard{mtx_};
  std::vector<block_id> out;
  if (n <= 0) return out;
  if (allocated_ - held_ < n)
    if (auto err = grow(n - (allocated_ - held_))) return err;
  out.reserve(static_cast<size_t>(n));
  for (size_t s = 0; s < chunks_.size() && static_cast<int64_t>(out.size()) < n; ++s) {
    auto* c = chunks_[s].get();
    while (c != nullptr && !c->free.empty() && static_cast<int64_t>(out.size()) < n) {
      auto i = c->free.back();
      c->free.pop_back();
      c->holders[static_cast<size_t>(i)] = 1;
      ++c->held;
      out.push_back(make_block_id(static_cast<int32_t>(s), i));
    }
  }
  held_ += n;
  return out;
}

void kv_block_pool::share(block_id b) {
  std::lock_guard<std::mutex> guard{mtx_};
  ++at_(b).holders[static_cast<size_t>(index_in_chunk(b))];
}

void kv_block_pool::release(block_id b) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto& c = at_(b);
  auto& h = c.holders[static_cast<size_t>(index_in_chunk(b))];
  if (--h > 0) return;
  c.free.push_back(index_in_chunk(b));
  --held_;
  if (--c.held > 0) return;
  // Blocks are released between steps, but a CUDA kernel of the last step may still read
  // the chunk: the device must be done with it before the arena hands its bytes out again.
  finish_compute(options_.device());
  allocated_ -= static_cast<int64_t>(c.holders.size());
  device_bytes_ -= c.device_bytes;
  chunks_[static_cast<size_t>(chunk_of(b))].reset();
  ++version_;
}

int32_t kv_block_pool::holders(block_id b) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return at_(b).holders[static_cast<size_t>(index_in_chunk(b))];
}

at::Tensor kv_block_pool::layer_view(int32_t chunk, int64_t layer, int kind) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return chunks_[static_cast<size_t>(chunk)]->data.select(0, layer).select(0, kind);
}

const void* kv_block_pool::layer_data(int32_t chunk, int64_t layer, int kind,
                                      int64_t& head_stride) const {
  std::lock_guard<std::mutex> guard{mtx_};
  const auto& data = chunks_[static_cast<size_t>(chunk)]->data;
  // [layers, 2, kv heads, blocks, tokens, d], contiguous: a layer's keys or values are one
  // run of kv heads x blocks x tokens x d elements.
  head_stride = data.stride(2);
  const auto offset = (layer * 2 + kind) * data.stride(1);
  return static_cast<const std::byte*>(data.const_data_ptr()) +
         offset * static_cast<int64_t>(data.element_size());
}

std::vector<engine::paged_kv_chunk> kv_block_pool::chunk_table() const {
  std::vector<engine::paged_kv_chunk> out(static_cast<size_t>(layers_ * engine::paged_max_chunks));
  std::lock_guard<std::mutex> guard{mtx_};
  const auto n = std::min<size_t>(chunks_.size(), engine::paged_max_chunks);
  for (size_t slot = 0; slot < n; ++slot) {
    if (chunks_[slot] == nullptr) continue;
    const auto& data = chunks_[slot]->data;
    const auto element = static_cast<int64_t>(data.element_size());
    const auto* base = static_cast<const std::byte*>(data.const_data_ptr());
    for (int64_t layer = 0; layer < layers_; ++layer) {
      auto& e = out[static_cast<size_t>(layer * engine::paged_max_chunks) + slot];
      // As layer_data: [layers, 2, kv heads, blocks, tokens, d], contiguous.
      e.keys = base + layer * 2 * data.stride(1) * element;
      e.values = base + (layer * 2 + 1) * data.stride(1) * element;
      e.head_stride = data.stride(2);
    }
  }
  return out;
}

uint64_t kv_block_pool::chunk_version() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return version_;
}

int32_t kv_block_pool::slot_bound() const {
  std::lock_guard<std::mutex> guard{mtx_};
  size_t bound = 0;
  bool free_slot = false;
  for (size_t slot = 0; slot < chunks_.size(); ++slot) {
    if (chunks_[slot] != nullptr)
      bound = slot + 1;
    else if (!free_slot)
      bound = std::max(bound, slot + 1), free_slot = true;  // where grow() puts a chunk
  }
  if (!free_slot) bound = chunks_.size() + 1;
  return static_cast<int32_t>(bound);
}

void kv_block_pool::zero(const std::vector<block_id>& blocks) {
  if (blocks.empty()) return;
  std::map<int32_t, std::vector<int64_t>> by_chunk;
  for (auto b : blocks) by_chunk[chunk_of(b)].push_back(index_in_chunk(b));
  std::lock_guard<std::mutex> guard{mtx_};
  for (auto& [c, idx] : by_chunk) {
    auto& data = chunks_[static_cast<size_t>(c)]->data;
    data.index_fill_(3, at::tensor(idx, at::kLong).to(data.device()), 0);
  }
}

void kv_block_pool::copy(block_id from, block_id to) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto src = at_(from).data.select(3, index_in_chunk(from));
  at_(to).data.select(3, index_in_chunk(to)).copy_(src);
}

kv_pool_stats kv_block_pool::stats() const {
  std::lock_guard<std::mutex> guard{mtx_};
  kv_pool_stats s;
  s.block_bytes = block_bytes_;
  s.blocks_allocated = allocated_;
  s.blocks_in_use = held_;
  s.device_bytes = device_bytes_;
  s.chunks = static_cast<int64_t>(
      std::count_if(chunks_.begin(), chunks_.end(), [](auto& c) { return c != nullptr; }));
  return s;
}

void kv_step::write(int64_t layer, const at::Tensor& k, const at::Tensor& v) const {
  const auto b = k.size(0), h = k.size(1), t = k.size(2), d = k.size(3);
  for (int kind = 0; kind < 2; ++kind) {
    // [kv heads, b x t, d]: a view at t == 1 (decode), a copy for a prefill.
    auto flat = (kind == 0 ? k : v).transpose(0, 1).reshape({h, b * t, d});
    for (auto& p : writes) {
      auto dst = pool->layer_view(p.chunk, layer, kind);
      auto slots = dst.view({h, dst.size(1) * kv_block_tokens, d});
      slots.index_copy_(1, p.into, p.from.defined() ? flat.index_select(1, p.from) : flat);
    }
  }
}

std::pair<at::Tensor, at::Tensor> kv_step::gather(int64_t layer) const {
  const auto h = pool->kv_heads(), d = pool->head_dim();
  const auto n = rows * read_blocks;
  std::pair<at::Tensor, at::Tensor> out;
  for (int kind = 0; kind < 2; ++kind) {
    at::Tensor g;
    if (reads.size() == 1 && !reads.front().into.defined()) {
      // Every block in one chunk (the common case): one gather, nothing else copied.
      g = pool->layer_view(reads.front().chunk, layer, kind).index_select(1, reads.front().from);
    } else {
      // Each chunk's blocks gathered, then put in place as one-block slices: a scatter on
      // the first dimension (index_put_) runs about three times as fast as index_copy_ on
      // the second on the CPU.
      g = at::empty({h * n, kv_block_tokens, d}, pool->options());
      for (auto& p : reads) {
        auto part = pool->layer_view(p.chunk, layer, kind).index_select(1, p.from);
        g.index_put_({p.into}, part.view({-1, kv_block_tokens, d}));
      }
    }
    // A view: matmul takes the narrowed rows as they are (one stride per row).
    (kind == 0 ? out.first : out.second) =
        g.view({h, rows, read_blocks * kv_block_tokens, d}).narrow(2, 0, read_positions);
  }
  return out;
}

}  // namespace computron::models::detail
