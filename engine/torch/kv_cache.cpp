// The KV cache of one stage for one batch as block tables: rows leave (keep_rows) and join
// (append) at step boundaries by editing the tables, and each step's plan says where its
// new keys go and which blocks attention gathers. The blocks themselves are the pool's
// (kv_blocks.cpp); the forward that runs the steps is decoder_stage.cpp's.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "common/error.hpp"
#include "engine/paged_attention.hpp"
#include "engine/torch/kv_blocks.hpp"

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

std::vector<int64_t> kv_cache::adapters() const {
  std::vector<int64_t> out;
  for (auto& r : impl_->rows) out.push_back(r.adapter);
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

/// Whether v is 0, 1, ..., n - 1 (every one of n elements, in order).
bool in_order(const std::vector<int64_t>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) != n) return false;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<int64_t>(i)) return false;
  return true;
}

/// The parts of a plan from its lists, their index tensors on the device. Where one chunk
/// holds everything and `from` (writes) or `into` (reads) is every one of the `n`
/// elements in order, that list is left out: the copy then takes the tensor as it is (a
/// step whose rows all write every column, a gather from one chunk).
struct part_builder {
  index_pack pack;
  struct pending {
    int32_t chunk;
    long into = -1, from = -1;
  };
  std::vector<pending> writes, reads;

  void add_writes(const chunk_lists& lists, int64_t n) {
    for (auto& [chunk, l] : lists) {
      pending p{chunk};
      p.into = static_cast<long>(pack.add(l.first));
      if (lists.size() > 1 || !in_order(l.second, n))
        p.from = static_cast<long>(pack.add(l.second));
      writes.push_back(p);
    }
  }
  void add_reads(const chunk_lists& lists, int64_t n) {
    for (auto& [chunk, l] : lists) {
      pending p{chunk};
      if (lists.size() > 1 || !in_order(l.first, n)) p.into = static_cast<long>(pack.add(l.first));
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

/// An in-place step's lists (kv_step::in_place) from the rows' tables, after the step's
/// blocks were taken: the chunks they lie in, each row's entries, and `limits` with none
/// for a row that holds no position (its padding columns read nothing). False, and nothing
/// kept, where the blocks lie in more chunks than one kernel call reads: the step gathers.
bool plan_in_place(const detail::kv_cache_rows& c, int64_t read_blocks,
                   const std::vector<int64_t>& limits, detail::kv_step& s) {
  const auto b = c.rows.size();
  const auto t = b == 0 ? 0 : limits.size() / b;
  std::map<int32_t, int64_t> place;
  s.table.assign(b * static_cast<size_t>(read_blocks), 0);
  for (size_t r = 0; r < b; ++r) {
    const auto& blocks = c.rows[r].blocks;
    for (size_t j = 0; j < blocks.size(); ++j) {
      auto [it, fresh] =
          place.try_emplace(detail::chunk_of(blocks[j]), static_cast<int64_t>(place.size()));
      if (fresh && static_cast<int64_t>(place.size()) > engine::paged_max_chunks) {
        s.table.clear();
        return false;
      }
      s.table[r * static_cast<size_t>(read_blocks) + j] =
          (it->second << 32) | detail::index_in_chunk(blocks[j]);
    }
  }
  s.chunks.assign(place.size(), 0);
  for (auto [chunk, at] : place) s.chunks[static_cast<size_t>(at)] = chunk;
  s.limits = limits;
  for (size_t r = 0; r < b; ++r)
    if (c.rows[r].length == 0)
      std::fill_n(s.limits.begin() + static_cast<std::ptrdiff_t>(r * t), t, 0);
  s.in_place = true;
  return true;
}

}  // namespace

caf::expected<kv_step> plan_prefill(kv_cache_rows& c, std::shared_ptr<kv_block_pool> pool,
                                    const std::vector<int64_t>& lengths, int64_t t,
                                    at::Tensor visible) {
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
  s.visible = std::move(visible);
  part_builder parts;
  parts.add_writes(writes, s.rows * t);
  parts.finish(s, parts.pack.tensors(c.pool->options().device()));
  return s;
}

namespace {

/// plan_extend's first part: the blocks each row needs before it writes `added[r]`
/// positions from its length on, taken at once (a pool without room changes nothing);
/// shared, partly filled last blocks copied and let go, fresh partly filled ones zeroed.
caf::error hold_step_blocks(kv_cache_rows& c, const std::vector<int64_t>& added) {
  auto& pool = *c.pool;
  const auto b = c.rows.size();
  // What each row needs before it writes: a private copy where it writes into a shared,
  // partly filled last block (the last of its holders here writes in place), and fresh
  // blocks for the positions past its last block. All are taken at once, so that a pool
  // without room changes nothing.
  std::vector<bool> copy(b, false);
  std::vector<int64_t> fresh_count(b, 0);
  std::map<block_id, int32_t> leaving;
  int64_t n = 0;
  for (size_t r = 0; r < b; ++r) {
    auto& row = c.rows[r];
    if (added[r] == 0) continue;
    if (row.length % kv_block_tokens != 0)
      if (auto last = row.blocks.back(); pool.holders(last) - leaving[last] > 1) {
        copy[r] = true;
        ++leaving[last];
        ++n;
      }
    fresh_count[r] = kv_blocks_for(row.length + added[r]) - kv_blocks_for(row.length);
    n += fresh_count[r];
  }
  auto ids = pool.take(n);
  if (!ids) return std::move(ids.error());
  // Fresh blocks the step leaves partly filled hold finite values past the row's length.
  std::vector<block_id> partial;
  std::vector<std::pair<block_id, block_id>> copies;  // (shared, private)
  size_t next = 0;
  for (size_t r = 0; r < b; ++r) {
    auto& row = c.rows[r];
    if (copy[r]) {
      copies.emplace_back(row.blocks.back(), (*ids)[next]);
      row.blocks.back() = (*ids)[next++];
    }
    for (int64_t k = 0; k < fresh_count[r]; ++k) row.blocks.push_back((*ids)[next++]);
    if (fresh_count[r] > 0 && (row.length + added[r]) % kv_block_tokens != 0)
      partial.push_back(row.blocks.back());
  }
  // The rows hold their new blocks now; the shared ones are let go whatever happens.
  try {
    for (auto [shared, own] : copies) pool.copy(shared, own);
  } catch (...) {
    for (auto [shared, own] : copies) pool.release(shared);
    throw;
  }
  for (auto [shared, own] : copies) pool.release(shared);
  pool.zero(partial);
  return {};
}

}  // namespace

caf::error extend_rows_by_one(kv_cache_rows& c) {
  if (auto err = hold_step_blocks(c, std::vector<int64_t>(c.rows.size(), 1))) return err;
  for (auto& row : c.rows) ++row.length;
  return {};
}

caf::expected<kv_step> plan_extend(kv_cache_rows& c, const std::vector<int64_t>& added, int64_t t,
                                   bool in_place) {
  if (auto err = hold_step_blocks(c, added)) return err;
  auto& pool = *c.pool;
  const auto b = c.rows.size();

  // Writes: row r's k-th new position, from column t - added[r] + k of the step's keys.
  // Limits: query column j of row r sees the positions below limits[r x t + j].
  chunk_lists writes, reads;
  std::vector<int64_t> limits(b * static_cast<size_t>(t), 1);
  // Per written column: (column, chunk, slot), for an in-place step's `slots`.
  std::vector<std::array<int64_t, 3>> wrote;
  int64_t read_blocks = 0, read_positions = 0;
  std::optional<block_id> filler;
  for (size_t r = 0; r < b; ++r) {
    auto& row = c.rows[r];
    const auto pad = t - added[r];
    for (int64_t k = 0; k < added[r]; ++k) {
      const auto p = row.length + k;
      auto blk = row.blocks[static_cast<size_t>(p / kv_block_tokens)];
      auto& w = writes[chunk_of(blk)];
      w.first.push_back(index_in_chunk(blk) * kv_block_tokens + p % kv_block_tokens);
      w.second.push_back(static_cast<int64_t>(r) * t + pad + k);
      wrote.push_back({w.second.back(), chunk_of(blk), w.first.back()});
      limits[r * static_cast<size_t>(t) + static_cast<size_t>(pad + k)] = p + 1;
    }
    row.length += added[r];
    read_blocks = std::max(read_blocks, static_cast<int64_t>(row.blocks.size()));
    read_positions = std::max(read_positions, row.length);
    if (!filler && !row.blocks.empty()) filler = row.blocks.front();
  }
  kv_step s;
  s.pool = &pool;
  s.rows = static_cast<int64_t>(b);
  s.read_blocks = read_blocks;
  s.read_positions = read_positions;
  part_builder parts;
  parts.add_writes(writes, s.rows * t);
  if (in_place && plan_in_place(c, read_blocks, limits, s)) {
    // Nothing is gathered. The writes' lists go to the device, and on a GPU the table,
    // limits and slots go with them in the same copy; the CPU reads the host lists.
    s.slots.assign(limits.size(), -1);
    for (auto [column, chunk, slot] : wrote) {
      // Every written block is one of the rows' blocks, so its chunk has a place.
      auto place = std::find(s.chunks.begin(), s.chunks.end(), chunk) - s.chunks.begin();
      if (place == static_cast<std::ptrdiff_t>(s.chunks.size()))
        throw std::logic_error("plan_extend: a written block outside the rows' chunks");
      s.slots[static_cast<size_t>(column)] = (static_cast<int64_t>(place) << 32) | slot;
    }
    std::optional<size_t> index_at;
    if (!pool.options().device().is_cpu()) {
      auto all = s.table;
      all.insert(all.end(), s.limits.begin(), s.limits.end());
      all.insert(all.end(), s.slots.begin(), s.slots.end());
      index_at = parts.pack.add(all);
    }
    auto tensors = parts.pack.tensors(pool.options().device());
    parts.finish(s, tensors);
    if (index_at) s.on_device = tensors[*index_at];
    return s;
  }
  // Every row gathers read_blocks blocks: its own, then its last again as padding (finite
  // values, masked), or another row's first where it has none yet; positions past a
  // query's own are blocked.
  for (size_t r = 0; r < b; ++r) {
    auto& blocks = c.rows[r].blocks;
    for (int64_t j = 0; j < read_blocks; ++j) {
      auto blk = j < static_cast<int64_t>(blocks.size()) ? blocks[static_cast<size_t>(j)]
                 : blocks.empty()                        ? *filler
                                                         : blocks.back();
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
  parts.add_reads(reads, s.rows * read_blocks);
  auto limits_at = parts.pack.add(limits);
  auto device = pool.options().device();
  auto tensors = parts.pack.tensors(device);
  parts.finish(s, tensors);
  auto positions = at::arange(read_positions, at::TensorOptions().dtype(at::kLong).device(device));
  s.blocked = positions.view({1, 1, 1, 1, -1}) >=
              tensors[limits_at].view({1, static_cast<int64_t>(b), 1, t, 1});
  return s;
}

caf::expected<kv_step> plan_decode(kv_cache_rows& c, bool in_place) {
  return plan_extend(c, std::vector<int64_t>(c.rows.size(), 1), 1, in_place);
}

}  // namespace detail

}  // namespace computron::models
