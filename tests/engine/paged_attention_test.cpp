// The host build of paged attention (engine/paged_attention.hpp) against attention written
// out plainly in double precision over each row's history as one array: blocks spread over
// several chunks in scrambled order, rows ending on and beside block boundaries, rows with
// nothing yet, grouped queries, several columns with their own limits, and split-K.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "engine/paged_attention.hpp"

using namespace computron::engine;

namespace {

uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

struct problem {
  int32_t rows = 0, columns = 0, heads = 0, kv_heads = 0, d = 0, bt = 16;
  std::vector<int64_t> lengths;  // positions each row holds
  std::vector<int64_t> limits;   // rows x columns
  // Each row's keys and values in position order: [row][kv head][position][d].
  std::vector<std::vector<float>> keys, values;
  std::vector<float> queries;  // [rows, heads, columns, d]
};

problem make(std::mt19937& rng, int32_t heads, int32_t kv_heads, int32_t columns,
             std::vector<int64_t> lengths, int32_t d = 16) {
  problem p;
  p.rows = static_cast<int32_t>(lengths.size());
  p.columns = columns;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.d = d;
  p.lengths = lengths;
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto len : lengths) {
    std::vector<float> k(static_cast<size_t>(kv_heads * len * d)), v(k.size());
    for (auto& x : k) x = n(rng);
    for (auto& x : v) x = n(rng);
    p.keys.push_back(k);
    p.values.push_back(v);
    // Column c of `columns` sees the positions up to the row's length - (columns - 1 - c),
    // as an extend step's new tokens do; a row with too few sees none in its first columns.
    for (int32_t c = 0; c < columns; ++c)
      p.limits.push_back(std::max<int64_t>(0, len - (columns - 1 - c)));
  }
  p.queries.resize(static_cast<size_t>(p.rows * heads * columns * d));
  for (auto& x : p.queries) x = n(rng) * 0.3f;
  return p;
}

/// Attention written out: for query head h of row r's column c, softmax over positions
/// below the limit of q . k, times v. Zeros where the limit is 0.
std::vector<double> reference(const problem& p) {
  const int32_t groups = p.heads / p.kv_heads;
  std::vector<double> out(static_cast<size_t>(p.rows * p.columns * p.heads * p.d), 0.0);
  for (int32_t r = 0; r < p.rows; ++r)
    for (int32_t h = 0; h < p.heads; ++h)
      for (int32_t c = 0; c < p.columns; ++c) {
        const auto limit = p.limits[static_cast<size_t>(r * p.columns + c)];
        if (limit == 0) continue;
        const int32_t kvh = h / groups;
        const auto len = p.lengths[static_cast<size_t>(r)];
        const float* q = &p.queries[static_cast<size_t>(((r * p.heads + h) * p.columns + c) * p.d)];
        std::vector<double> s(static_cast<size_t>(limit));
        for (int64_t pos = 0; pos < limit; ++pos) {
          const float* k =
              &p.keys[static_cast<size_t>(r)][static_cast<size_t>((kvh * len + pos) * p.d)];
          double dot = 0;
          for (int32_t e = 0; e < p.d; ++e) dot += static_cast<double>(q[e]) * k[e];
          s[static_cast<size_t>(pos)] = dot;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - m));
        double* o = &out[static_cast<size_t>(((r * p.columns + c) * p.heads + h) * p.d)];
        for (int64_t pos = 0; pos < limit; ++pos) {
          const float* v =
              &p.values[static_cast<size_t>(r)][static_cast<size_t>((kvh * len + pos) * p.d)];
          for (int32_t e = 0; e < p.d; ++e) o[e] += s[static_cast<size_t>(pos)] / sum * v[e];
        }
      }
  return out;
}

/// The problem laid out as a block pool: `chunk_blocks` blocks per chunk, each row's
/// blocks taken from a shuffled list of every chunk's, in the pool's element type. The
/// table has `spare_blocks` entries per row beyond the longest row's (-1, never read), as
/// a table sized for a captured graph has.
template <typename E>
struct paged {
  std::vector<std::vector<E>> chunk_keys, chunk_values;
  std::vector<int64_t> table;
  std::vector<E> queries, out;
  paged_attention_args args;

  paged(const problem& p, element_type type, std::vector<int32_t> chunk_blocks, std::mt19937& rng,
        int32_t spare_blocks = 0) {
    auto cast = [](float f) -> E {
      if constexpr (sizeof(E) == 2)
        return to_bf16(f);
      else
        return f;
    };
    std::vector<int64_t> free;  // entries
    for (size_t c = 0; c < chunk_blocks.size(); ++c) {
      auto elems = static_cast<size_t>(p.kv_heads) * static_cast<size_t>(chunk_blocks[c]) *
                   static_cast<size_t>(p.bt * p.d);
      chunk_keys.emplace_back(elems, cast(NAN));  // unread slots: NaN would show
      chunk_values.emplace_back(elems, cast(NAN));
      for (int32_t b = 0; b < chunk_blocks[c]; ++b)
        free.push_back((static_cast<int64_t>(c) << 32) | b);
    }
    std::shuffle(free.begin(), free.end(), rng);
    int32_t width = 0;
    for (auto len : p.lengths)
      width = std::max<int32_t>(width, static_cast<int32_t>((len + p.bt - 1) / p.bt));
    width += spare_blocks;
    table.assign(static_cast<size_t>(p.rows * std::max(width, 1)), -1);
    size_t next = 0;
    for (int32_t r = 0; r < p.rows; ++r) {
      const auto len = p.lengths[static_cast<size_t>(r)];
      for (int64_t b = 0; b * p.bt < len; ++b) {
        const auto entry = free.at(next++);
        table[static_cast<size_t>(r * width + b)] = entry;
        const auto c = static_cast<size_t>(entry >> 32);
        const auto idx = entry & 0xffffffff;
        for (int32_t h = 0; h < p.kv_heads; ++h)
          for (int32_t t = 0; t < p.bt && b * p.bt + t < len; ++t)
            for (int32_t e = 0; e < p.d; ++e) {
              const auto from = static_cast<size_t>((h * len + b * p.bt + t) * p.d + e);
              const auto at =
                  static_cast<size_t>(((h * chunk_blocks[c] + idx) * p.bt + t) * p.d + e);
              chunk_keys[c][at] = cast(p.keys[static_cast<size_t>(r)][from]);
              chunk_values[c][at] = cast(p.values[static_cast<size_t>(r)][from]);
            }
      }
    }
    for (auto q : p.queries) queries.push_back(cast(q));
    out.assign(queries.size(), cast(NAN));
    args.type = type;
    args.rows = p.rows;
    args.columns = p.columns;
    args.heads = p.heads;
    args.kv_heads = p.kv_heads;
    args.head_dim = p.d;
    args.block_tokens = p.bt;
    args.table_width = width;
    args.max_positions = static_cast<int32_t>(*std::max_element(p.limits.begin(), p.limits.end()));
    args.queries = queries.data();
    args.out = out.data();
    args.table = table.data();
    args.limits = p.limits.data();
    args.chunks = static_cast<int32_t>(chunk_blocks.size());
    for (size_t c = 0; c < chunk_blocks.size(); ++c)
      args.chunk[c] = {chunk_keys[c].data(), chunk_values[c].data(),
                       static_cast<int64_t>(chunk_blocks[c]) * p.bt * p.d};
  }

  std::vector<double> run(int32_t splits) {
    REQUIRE(paged_attention_host_refusal(args) == nullptr);
    // Two ranges of items, as two threads would take them.
    const int64_t items = static_cast<int64_t>(args.rows) * args.kv_heads;
    paged_attention_host(args, 0, items / 2, splits);
    paged_attention_host(args, items / 2, items, splits);
    std::vector<double> o;
    for (auto x : out) {
      if constexpr (sizeof(E) == 2)
        o.push_back(from_bf16(x));
      else
        o.push_back(x);
    }
    return o;
  }
};

double worst(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    w = std::max(w, std::abs(a[i] - b[i]));
  }
  return w;
}

}  // namespace

TEST_CASE("paged attention reads blocks in place and equals attention written out",
          "[paged_attention]") {
  std::mt19937 rng(7);
  struct shape {
    int32_t heads, kv_heads, columns;
    std::vector<int64_t> lengths;
  };
  // Grouped queries 1, 4 and 8; a decode column and three columns; rows on, before and past
  // a block boundary, one of a single position, a long one.
  const std::vector<shape> shapes = {
      {4, 4, 1, {16, 15, 17, 1, 100}},
      {8, 2, 1, {32, 31, 33, 250}},
      {8, 1, 1, {5, 64, 130}},
      {8, 2, 3, {16, 2, 47, 200}},
  };
  for (auto& sh : shapes)
    for (int32_t splits : {1, 2, 5}) {
      auto p = make(rng, sh.heads, sh.kv_heads, sh.columns, sh.lengths);
      auto want = reference(p);
      paged<float> f(p, element_type::f32, {8, 16, 32}, rng);
      CHECK(worst(f.run(splits), want) < 1e-5);
    }
}

TEST_CASE("paged attention in bf16 accumulates in f32", "[paged_attention]") {
  std::mt19937 rng(11);
  auto p = make(rng, 8, 2, 1, {16, 17, 90, 300}, 64);
  // The reference reads what the pool holds: the inputs rounded to bf16.
  for (auto* v : {&p.queries})
    for (auto& x : *v) x = from_bf16(to_bf16(x));
  for (auto& row : p.keys)
    for (auto& x : row) x = from_bf16(to_bf16(x));
  for (auto& row : p.values)
    for (auto& x : row) x = from_bf16(to_bf16(x));
  auto want = reference(p);
  for (int32_t splits : {1, 3}) {
    paged<uint16_t> b(p, element_type::bf16, {64}, rng);
    // The output's own rounding: bf16 keeps 8 bits, values here are below 4 in magnitude.
    CHECK(worst(b.run(splits), want) < 2e-2);
  }
}

TEST_CASE("paged attention gives zeros for a column that sees nothing", "[paged_attention]") {
  std::mt19937 rng(3);
  // Row 1 holds nothing; row 0's first column sees nothing either (limit 0).
  auto p = make(rng, 2, 1, 2, {1, 0});
  paged<float> f(p, element_type::f32, {4}, rng);
  auto got = f.run(1);
  CHECK(worst(got, reference(p)) < 1e-6);
  // Row 0 column 0 and all of row 1 are zeros; row 0 column 1 is row 0's one value.
  for (int32_t h = 0; h < 2; ++h)
    for (int32_t e = 0; e < p.d; ++e) {
      CHECK(got[static_cast<size_t>((0 * 2 + h) * p.d + e)] == 0.0);
      CHECK(got[static_cast<size_t>(((1 * 2 + 1) * 2 + h) * p.d + e)] == 0.0);
      CHECK(got[static_cast<size_t>(((0 * 2 + 1) * 2 + h) * p.d + e)] ==
            Approx(p.values[0][static_cast<size_t>(e)]).margin(1e-6));
    }
}

TEST_CASE("paged attention refuses arguments it cannot read", "[paged_attention]") {
  std::mt19937 rng(5);
  auto p = make(rng, 4, 2, 1, {20});
  paged<float> f(p, element_type::f32, {4}, rng);
  CHECK(paged_attention_refusal(f.args) == nullptr);
  auto a = f.args;
  a.heads = 3;
  CHECK(paged_attention_refusal(a) != nullptr);
  a = f.args;
  a.table_width = 1;  // 16 positions, the row has 20
  CHECK(paged_attention_refusal(a) != nullptr);
  a = f.args;
  a.chunks = paged_max_chunks + 1;
  CHECK(paged_attention_refusal(a) != nullptr);
  a = f.args;
  a.chunk[0].values = nullptr;
  CHECK(paged_attention_refusal(a) != nullptr);
  // f16 is the GPU's: the host build refuses it, the shared check does not.
  a = f.args;
  a.type = element_type::f16;
  CHECK(paged_attention_refusal(a) == nullptr);
  CHECK(paged_attention_host_refusal(a) != nullptr);
}

namespace {

/// NaN in every output element: a run that leaves one unwritten shows.
template <typename E>
void poison(paged<E>& f) {
  if constexpr (sizeof(E) == 2)
    f.out.assign(f.out.size(), to_bf16(NAN));
  else
    f.out.assign(f.out.size(), NAN);
}

/// The call's chunks as a table in host memory (the host build's memory), in reverse
/// order, with the block table's entries renamed to match, and the inline chunks cleared:
/// what the call reads can then only come through the table (the caller points
/// chunk_table at it).
template <typename E>
std::vector<paged_kv_chunk> move_to_table(paged<E>& f) {
  const int32_t n = f.args.chunks;
  std::vector<paged_kv_chunk> table;
  for (int32_t c = n - 1; c >= 0; --c) table.push_back(f.args.chunk[c]);
  for (auto& entry : f.table)
    if (entry >= 0)
      entry = (static_cast<int64_t>(n - 1 - paged_entry_chunk(entry)) << 32) | (entry & 0xffffffff);
  for (int32_t c = 0; c < n; ++c) f.args.chunk[c] = paged_kv_chunk{};
  return table;
}

}  // namespace

TEST_CASE("paged attention reads its chunks through a chunk table as it reads them inline",
          "[paged_attention]") {
  std::mt19937 rng(13);
  // Rows whose blocks lie in all three chunks (the shuffle spreads them), one with nothing.
  auto p = make(rng, 8, 2, 3, {40, 130, 0, 17}, 32);
  for (int32_t splits : {1, 3}) {
    INFO("splits " << splits);
    std::mt19937 layout(splits);
    paged<float> f(p, element_type::f32, {8, 16, 32}, layout);
    const auto inline_out = f.run(splits);
    const auto table = move_to_table(f);
    f.args.chunk_table = table.data();
    REQUIRE(paged_attention_host_refusal(f.args) == nullptr);
    poison(f);
    // The same arithmetic over the same elements: equal, not close.
    CHECK(f.run(splits) == inline_out);
  }
  // bf16, as the pool holds it.
  std::mt19937 layout(21);
  paged<uint16_t> b(p, element_type::bf16, {4, 64}, layout);
  const auto inline_out = b.run(2);
  const auto table = move_to_table(b);
  b.args.chunk_table = table.data();
  poison(b);
  CHECK(b.run(2) == inline_out);
}

TEST_CASE("paged attention split by each row's reach equals one split", "[paged_attention]") {
  // One short row and one long one, grouped queries (4 per kv head), decode and three
  // columns. The by-reach calls take the table's capacity as max_positions, as a graph
  // captured for every context does: split by max_positions, the short row's splits past
  // its few positions would read nothing, and the long row's last ones nothing either.
  for (int32_t columns : {1, 3}) {
    INFO("columns " << columns);
    std::mt19937 rng(17);
    auto p = make(rng, 8, 2, columns, {3, 700, 20}, 64);
    for (auto& x : p.queries) x = from_bf16(to_bf16(x));
    for (auto* side : {&p.keys, &p.values})
      for (auto& row : *side)
        for (auto& x : row) x = from_bf16(to_bf16(x));
    const auto want = reference(p);
    auto check = [&](auto& f, double bound) {
      const auto one = f.run(1);
      CHECK(worst(one, want) < bound);
      auto a = f.args;
      f.args.max_positions = f.args.table_width * f.args.block_tokens;
      f.args.splits_by_reach = true;
      for (int32_t splits : {1, 3, 8}) {
        INFO("splits " << splits);
        poison(f);
        CHECK(worst(f.run(splits), one) < bound);
      }
      f.args = a;
    };
    // Within split-K's bounds of the other tests: f32's rounding, and bf16's output
    // rounding (one unit of its last place, for values below 4).
    std::mt19937 layout(3);
    paged<float> f(p, element_type::f32, {16, 64}, layout, 20);
    check(f, 1e-5);
    paged<uint16_t> b(p, element_type::bf16, {16, 64}, layout, 20);
    check(b, 2e-2);
  }
}

TEST_CASE("paged attention's splits by reach cover the reach in whole, balanced blocks",
          "[paged_attention]") {
  paged_attention_args a;
  a.block_tokens = 16;
  a.max_positions = 1024;
  a.splits_by_reach = true;
  for (int64_t reach : {0, 1, 15, 16, 17, 300, 700, 1024, 5000}) {
    const int64_t span = std::min<int64_t>(reach, a.max_positions);
    const int64_t blocks = (span + 15) / 16;
    for (int32_t splits : {1, 3, 8, 32}) {
      INFO("reach " << reach << ", splits " << splits);
      int64_t next = 0;
      for (int32_t s = 0; s < splits; ++s) {
        int64_t begin = -1, end = -1;
        paged_split_range(a, s, splits, reach, begin, end);
        // In order, without gaps, each starting on a block (or empty, at the reach), none
        // more than its share.
        CHECK(begin == next);
        CHECK(end >= begin);
        if (end > begin) CHECK(begin % 16 == 0);
        CHECK((end - begin + 15) / 16 <= (blocks + splits - 1) / splits);
        next = end;
      }
      CHECK(next == span);
    }
  }
  // Without it, every item divides max_positions, whatever its reach.
  a.splits_by_reach = false;
  int64_t begin = 0, end = 0;
  paged_split_range(a, 1, 2, 20, begin, end);
  CHECK(begin == 512);
  CHECK(end == 1024);
}

TEST_CASE("paged attention with a chunk table checks only the chunk count", "[paged_attention]") {
  std::mt19937 rng(5);
  auto p = make(rng, 4, 2, 1, {20});
  paged<float> f(p, element_type::f32, {4}, rng);
  // The inline chunks are empty: with a table they are not read (the table may be device
  // memory, which the host cannot check either).
  std::vector<paged_kv_chunk> table = {f.args.chunk[0]};
  auto a = f.args;
  a.chunk[0] = paged_kv_chunk{};
  CHECK(paged_attention_refusal(a) != nullptr);
  a.chunk_table = table.data();
  CHECK(paged_attention_refusal(a) == nullptr);
  a.chunks = 0;
  CHECK(paged_attention_refusal(a) != nullptr);
  a.chunks = paged_max_chunks + 1;
  CHECK(paged_attention_refusal(a) != nullptr);
  a.chunks = paged_max_chunks;
  CHECK(paged_attention_refusal(a) == nullptr);
  // Splitting by reach is no reason to refuse, nor to skip the other checks.
  a = f.args;
  a.splits_by_reach = true;
  CHECK(paged_attention_refusal(a) == nullptr);
  a.table_width = 1;
  CHECK(paged_attention_refusal(a) != nullptr);
}
