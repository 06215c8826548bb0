// The KV cache of one stage for one batch as block tables: rows leave (keep_rows) and join
// (append) at step boundaries by editing the tables, and each step's plan says where its
// new keys go and which blocks attention gathers. The blocks themselves are the pool's
// (kv_blocks.cpp); the forward that runs the steps is decoder_stage.cpp's.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/error.hpp"
#include "models/kv_blocks.hpp"

namespace computron::models {

using detail::block_id;

kv_cache::kv_cache() : impl_(std::make_unique<impl>()) {}
kv_cache::~kv_cache() = default;
kv_cache::kv_cache(kv_cache&&) noexcept = default;
kv_cache& kv_cache::operator=(kv_cache&&) noexcept = default;

int64_t kv_cache::length() const {
  int64_t n = 0;
  for (auto& r : impl_->rows) n = std::max(n, r.length);
  return n;
}

int64_t kv_cache::rows() const {
  return static_cast<int64_t>(impl_->rows.size());
}

std::vector<int64_t> kv_cache::lengths() const {
  std::vector<int64_t> out;
  for (auto& r : impl_->rows) out.push_back(r.length);
  return out;
}

int64_t kv_cache::blocks() const {
  std::set<block_id> distinct;
  for (auto& r : impl_->rows) distinct.insert(r.blocks.begin(), r.blocks.end());
  return static_cast<int64_t>(distinct.size());
}

caf::error kv_cache::keep_rows(const std::vector<int64_t>& rows) {
  auto& c = *impl_;
  if (c.rows.empty()) return {};
  const auto b = static_cast<int64_t>(c.rows.size());
  for (auto r : rows)
    if (r < 0 || r >= b)
      return make_error(ec::invalid_request,
                        fmt::format("keep row {} is outside the batch of {}", r, b));
  // Kept rows' tables are copied (a repeated row shares its blocks until it writes into
  // them); then every old table lets go. A row that left gives its blocks back here.
  std::vector<detail::kv_cache_rows::row> next;
  next.reserve(rows.size());
  for (auto r : rows) {
    next.push_back(c.rows[static_cast<size_t>(r)]);
    for (auto blk : next.back().blocks) c.pool->share(blk);
  }
  for (auto& row : c.rows)
    for (auto blk : row.blocks) c.pool->release(blk);
  c.rows = std::move(next);
  return {};
}

caf::error kv_cache::append(kv_cache&& other) {
  auto& c = *impl_;
  auto& o = *other.impl_;
  if (o.rows.empty()) return {};
  if (c.rows.empty()) {
    std::swap(c, o);
    return {};
  }
  if (c.pool != o.pool)
    return make_error(ec::invalid_request,
                      "joining caches of different stages: their blocks live in different pools");
  // The joining rows' tables move over; their blocks stay where they are.
  for (auto& row : o.rows) c.rows.push_back(std::move(row));
  o.rows.clear();
  other = kv_cache{};
  return {};
}

namespace detail {

kv_cache_rows::kv_cache_rows(kv_cache_rows&& o) noexcept
    : pool(std::move(o.pool)), rows(std::move(o.rows)) {
  o.rows.clear();
}

kv_cache_rows& kv_cache_rows::operator=(kv_cache_rows&& o) noexcept {
  if (this == &o) return *this;
  clear();
  pool = std::move(o.pool);
  rows = std::move(o.rows);
  o.rows.clear();
  o.pool.reset();
  return *this;
}

kv_cache_rows::~kv_cache_rows() {
  clear();
}

void kv_cache_rows::clear() {
  if (pool)
    for (auto& row : rows)
      for (auto blk : row.blocks) pool->release(blk);
  rows.clear();
}

namespace {

/// A step's index lists, moved to the device in one copy: a plan has a few small lists,
/// and on a GPU each copy of its own would be one more synchronisation.
class index_pack {
 public:
  /// Adds a list; tensors() returns its tensor at the same position.
  size_t add(const std::vector<int64_t>& v) {
    spans_.emplace_back(static_cast<int64_t>(all_.size()), static_cast<int64_t>(v.size()));
    all_.insert(all_.end(), v.begin(), v.end());
    return spans_.size() - 1;
  }
  std::vector<at::Tensor> tensors(at::Device device) const {
    auto t = at::tensor(all_, at::kLong).to(device);
    std::vector<at::Tensor> out;
    for (auto [begin, n] : spans_) out.push_back(t.narrow(0, begin, n));
    return out;
  }

 private:
  std::vector<int64_t> all_;
  std::vector<std::pair<int64_t, int64_t>> spans_;
};

/// A chunk's share of a copy while it is planned: `into` and `from` as host lists.
using chunk_lists = std::map<int32_t, std::pair<std::vector<int64_t>, std::vector<int64_t>>>;

/// Whether v is 0, 1, ..., n - 1.
bool in_order(const std::vector<int64_t>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<int64_t>(i)) return false;
  return true;
}

/// The parts of a plan from its lists, their index tensors on the device. Where one chunk
/// holds everything and `from` (writes) or `into` (reads) is every element in order, that
/// list is left out: the copy then takes the tensor as it is.
struct part_builder {
  index_pack pack;
  struct pending {
    int32_t chunk;
    long into = -1, from = -1;
  };
  std::vector<pending> writes, reads;

  void add_writes(const chunk_lists& lists) {
    for (auto& [chunk, l] : lists) {
      pending p{chunk};
      p.into = static_cast<long>(pack.add(l.first));
      if (lists.size() > 1 || !in_order(l.second)) p.from = static_cast<long>(pack.add(l.second));
      writes.push_back(p);
    }
  }
  void add_reads(const chunk_lists& lists) {
    for (auto& [chunk, l] : lists) {
      pending p{chunk};
      if (lists.size() > 1 || !in_order(l.first)) p.into = static_cast<long>(pack.add(l.first));
      p.from = static_cast<long>(pack.add(l.second));
      reads.push_back(p);
    }
  }
  void finish(detail::kv_step& s, const std::vector<at::Tensor>& t) const {
    auto make = [&](const pending& p) {
      detail::kv_step::part out;
      out.chunk = p.chunk;
      if (p.into >= 0) out.into = t[static_cast<size_t>(p.into)];
      if (p.from >= 0) out.from = t[static_cast<size_t>(p.from)];
      return out;
    };
    for (auto& p : writes) s.writes.push_back(make(p));
    for (auto& p : reads) s.reads.push_back(make(p));
  }
};

}  // namespace

caf::expected<kv_step> plan_prefill(kv_cache_rows& c, std::shared_ptr<kv_block_pool> pool,
                                    const std::vector<int64_t>& lengths, int64_t t,
                                    at::Tensor blocked) {
  c.clear();
  int64_t total = 0;
  for (auto len : lengths) total += kv_blocks_for(len);
  auto ids = pool->take(total);
  if (!ids) return std::move(ids.error());
  c.pool = std::move(pool);
  std::vector<block_id> partial;
  chunk_lists writes;
  size_t next = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    auto& row = c.rows.emplace_back();
    row.length = lengths[r];
    auto n = static_cast<size_t>(kv_blocks_for(row.length));
    row.blocks.assign(ids->begin() + static_cast<ptrdiff_t>(next),
                      ids->begin() + static_cast<ptrdiff_t>(next + n));
    next += n;
    if (row.length % kv_block_tokens != 0) partial.push_back(row.blocks.back());
    const auto pad = t - row.length;
    for (int64_t j = 0; j < row.length; ++j) {
      auto blk = row.blocks[static_cast<size_t>(j / kv_block_tokens)];
      auto& w = writes[chunk_of(blk)];
      w.first.push_back(index_in_chunk(blk) * kv_block_tokens + j % kv_block_tokens);
      w.second.push_back(static_cast<int64_t>(r) * t + pad + j);
    }
  }
  c.pool->zero(partial);
  kv_step s;
  s.pool = c.pool.get();
  s.prefill = true;
  s.rows = static_cast<int64_t>(lengths.size());
  s.blocked = std::move(blocked);
  part_builder parts;
  parts.add_writes(writes);
  parts.finish(s, parts.pack.tensors(c.pool->options().device()));
  return s;
}

caf::expected<kv_step> plan_decode(kv_cache_rows& c) {
  auto& pool = *c.pool;
  const auto b = c.rows.size();
  // Rows that need a block: a fresh one where the new position starts a block, a private
  // copy where their last block is shared (the last of its holders here writes in place).
  enum class need : uint8_t { none, fresh, copy };
  std::vector<need> needs(b, need::none);
  std::map<block_id, int32_t> leaving;
  int64_t n = 0;
  for (size_t r = 0; r < b; ++r) {
    auto& row = c.rows[r];
    if (row.length % kv_block_tokens == 0) {
      needs[r] = need::fresh;
      ++n;
    } else if (auto last = row.blocks.back(); pool.holders(last) - leaving[last] > 1) {
      needs[r] = need::copy;
      ++leaving[last];
      ++n;
    }
  }
  auto ids = pool.take(n);
  if (!ids) return std::move(ids.error());
  std::vector<block_id> fresh;
  std::vector<std::pair<block_id, block_id>> copies;  // (shared, private)
  size_t next = 0;
  for (size_t r = 0; r < b; ++r) {
    auto& blocks = c.rows[r].blocks;
    if (needs[r] == need::fresh) {
      fresh.push_back((*ids)[next]);
      blocks.push_back((*ids)[next++]);
    } else if (needs[r] == need::copy) {
      copies.emplace_back(blocks.back(), (*ids)[next]);
      blocks.back() = (*ids)[next++];
    }
  }
  // The rows hold their new blocks now; the shared ones are let go whatever happens.
  try {
    for (auto [shared, own] : copies) pool.copy(shared, own);
  } catch (...) {
    for (auto [shared, own] : copies) pool.release(shared);
    throw;
  }
  for (auto [shared, own] : copies) pool.release(shared);
  pool.zero(fresh);

  chunk_lists writes, reads;
  std::vector<int64_t> lengths;
  int64_t read_blocks = 0;
  for (size_t r = 0; r < b; ++r) {
    auto& row = c.rows[r];
    auto blk = row.blocks.back();
    auto& w = writes[chunk_of(blk)];
    w.first.push_back(index_in_chunk(blk) * kv_block_tokens + row.length % kv_block_tokens);
    w.second.push_back(static_cast<int64_t>(r));
    ++row.length;
    lengths.push_back(row.length);
    read_blocks = std::max(read_blocks, static_cast<int64_t>(row.blocks.size()));
  }
  // Every row gathers read_blocks blocks: its own, then its last again as padding (finite
  // values, masked); positions past its length are blocked.
  for (size_t r = 0; r < b; ++r) {
    auto& blocks = c.rows[r].blocks;
    for (int64_t j = 0; j < read_blocks; ++j) {
      auto blk =
          j < static_cast<int64_t>(blocks.size()) ? blocks[static_cast<size_t>(j)] : blocks.back();
      auto& l = reads[chunk_of(blk)];
      l.first.push_back(static_cast<int64_t>(r) * read_blocks + j);
      l.second.push_back(index_in_chunk(blk));
    }
  }
  if (reads.size() > 1) {
    // Blocks in several chunks: each chunk's gather is scattered into the batch's list
    // viewed as [kv heads x rows x read_blocks] slices, one place per head and block.
    const auto places = static_cast<int64_t>(b) * read_blocks;
    for (auto& [chunk, l] : reads) {
      std::vector<int64_t> per_head;
      per_head.reserve(l.first.size() * static_cast<size_t>(pool.kv_heads()));
      for (int64_t h = 0; h < pool.kv_heads(); ++h)
        for (auto place : l.first) per_head.push_back(h * places + place);
      l.first = std::move(per_head);
    }
  }
  kv_step s;
  s.pool = &pool;
  s.rows = static_cast<int64_t>(b);
  s.read_blocks = read_blocks;
  part_builder parts;
  parts.add_writes(writes);
  parts.add_reads(reads);
  auto lens_at = parts.pack.add(lengths);
  auto device = pool.options().device();
  auto t = parts.pack.tensors(device);
  parts.finish(s, t);
  s.read_positions = *std::max_element(lengths.begin(), lengths.end());
  auto positions =
      at::arange(s.read_positions, at::TensorOptions().dtype(at::kLong).device(device));
  s.blocked = (positions.view({1, 1, 1, -1}) >= t[lens_at].view({1, -1, 1, 1}));
  return s;
}

}  // namespace detail

}  // namespace computron::models
