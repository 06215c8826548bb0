#include "engine/paged_attention.hpp"
#include "engine/host_elements.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace computron::engine {

const char* paged_attention_refusal(const paged_attention_args& a) {
  if (a.rows <= 0 || a.columns <= 0) return "no rows or no columns";
  if (a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads != 0)
    return "query heads must be a positive multiple of kv heads";
  if (a.head_dim <= 0 || a.block_tokens <= 0) return "head dim and block tokens must be positive";
  if (a.max_positions < 0 || a.table_width < 0 ||
      static_cast<int64_t>(a.table_width) * a.block_tokens < a.max_positions)
    return "the block table is narrower than the longest row's positions";
  if (a.chunks <= 0 || a.chunks > paged_max_chunks) return "chunks out of range";
  if (a.chunk_table == nullptr)
    for (int32_t c = 0; c < a.chunks; ++c)
      if (a.chunk[c].keys == nullptr || a.chunk[c].values == nullptr || a.chunk[c].head_stride <= 0)
        return "a chunk without keys, values or head stride";
  if (a.queries == nullptr || a.out == nullptr || a.limits == nullptr ||
      (a.max_positions > 0 && a.table == nullptr))
    return "a null pointer";
  return nullptr;
}

const char* paged_attention_host_refusal(const paged_attention_args& a) {
  if (a.type == element_type::f16) return "f16 on the host (CPUs run f32 and bf16)";
  return paged_attention_refusal(a);
}

namespace {

/// Eight running sums, so that the compiler may keep them in vector lanes (a float sum in
/// one accumulator cannot be reordered without -ffast-math).
float dot(const float* a, const float* b, int32_t n) {
  float s[8] = {};
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int32_t j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/// Per thread, reused across calls: no allocation per step once a thread saw the largest
/// shape.
struct scratch {
  std::vector<float> queries, keys, values, scores, acc, acc_split;
  std::vector<paged_partial> partial, partial_split;
  std::vector<int64_t> limits;
};

/// Adds positions [begin, end) of `row`'s history, for kv head `kv_head`, into the running
/// softmax of each query (`partial`, `acc`).
void attend_range(const paged_attention_args& a, int32_t row, int32_t kv_head, int64_t begin,
                  int64_t end, scratch& s, paged_partial* partial, float* acc) {
  const int32_t queries = paged_queries(a), d = a.head_dim, bt = a.block_tokens;
  constexpr float hidden = -std::numeric_limits<float>::infinity();
  for (int64_t tile = begin; tile < end; tile += bt) {
    const auto entry = paged_entry(a, row, tile / bt);
    const auto& c = paged_chunk(a, paged_entry_chunk(entry));
    const auto n = static_cast<int32_t>(std::min<int64_t>(bt, end - tile));
    // The tile's keys and values in f32, read once for all the group's queries.
    for (int32_t p = 0; p < n; ++p) {
      const auto at = paged_kv_offset(a, entry, kv_head, p);
      load(a.type, c.keys, at, d, s.keys.data() + static_cast<size_t>(p) * d);
      load(a.type, c.values, at, d, s.values.data() + static_cast<size_t>(p) * d);
    }
    for (int32_t q = 0; q < queries; ++q) {
      const auto limit = s.limits[static_cast<size_t>(q)];
      if (tile >= limit) continue;
      const auto* qv = s.queries.data() + static_cast<size_t>(q) * d;
      float* sc = s.scores.data();
      float top = hidden;
      for (int32_t p = 0; p < n; ++p) {
        sc[p] = tile + p < limit ? dot(qv, s.keys.data() + static_cast<size_t>(p) * d, d) : hidden;
        top = std::max(top, sc[p]);
      }
      auto& part = partial[q];
      const float m = std::max(part.max, top);
      const float keep = expf(part.max - m);  // 0 before the first position
      float added = 0;
      for (int32_t p = 0; p < n; ++p) {
        sc[p] = sc[p] == hidden ? 0.0f : expf(sc[p] - m);
        added += sc[p];
      }
      part.sum = part.sum * keep + added;
      part.max = m;
      float* out = acc + static_cast<size_t>(q) * d;
      for (int32_t e = 0; e < d; ++e) out[e] *= keep;
      for (int32_t p = 0; p < n; ++p) {
        const float w = sc[p];
        const float* v = s.values.data() + static_cast<size_t>(p) * d;
        for (int32_t e = 0; e < d; ++e) out[e] += w * v[e];
      }
    }
  }
}

}  // namespace

void paged_attention_host(const paged_attention_args& a, int64_t begin, int64_t end,
                          int32_t splits) {
  thread_local scratch s;
  const int32_t queries = paged_queries(a), groups = paged_groups(a), d = a.head_dim;
  const auto qd = static_cast<size_t>(queries) * static_cast<size_t>(d);
  s.queries.resize(qd);
  s.acc.resize(qd);
  s.acc_split.resize(qd);
  s.keys.resize(static_cast<size_t>(a.block_tokens) * static_cast<size_t>(d));
  s.values.resize(s.keys.size());
  s.scores.resize(static_cast<size_t>(a.block_tokens));
  s.partial.resize(static_cast<size_t>(queries));
  s.partial_split.resize(static_cast<size_t>(queries));
  s.limits.resize(static_cast<size_t>(queries));
  constexpr float hidden = -std::numeric_limits<float>::infinity();
  splits = std::max(splits, 1);
  for (auto item = begin; item < end; ++item) {
    const auto row = static_cast<int32_t>(item / a.kv_heads);
    const auto kv_head = static_cast<int32_t>(item % a.kv_heads);
    int64_t reach = 0;
    for (int32_t q = 0; q < queries; ++q) {
      const int32_t head = kv_head * groups + q / a.columns, column = q % a.columns;
      load(a.type, a.queries, paged_query_offset(a, row, head, column), d,
           s.queries.data() + static_cast<size_t>(q) * d);
      const auto limit = std::min<int64_t>(a.limits[static_cast<int64_t>(row) * a.columns + column],
                                           a.max_positions);
      s.limits[static_cast<size_t>(q)] = limit;
      reach = std::max(reach, limit);
    }
    std::fill(s.acc.begin(), s.acc.end(), 0.0f);
    std::fill(s.partial.begin(), s.partial.end(), paged_partial{hidden, 0.0f});
    for (int32_t split = 0; split < splits; ++split) {
      int64_t from = 0, to = 0;
      paged_split_range(a, split, splits, reach, from, to);
      to = std::min(to, reach);
      if (from >= to) continue;
      if (splits == 1) {
        attend_range(a, row, kv_head, from, to, s, s.partial.data(), s.acc.data());
        continue;
      }
      // Each split apart, then merged: the CUDA kernel's split-K, step for step.
      std::fill(s.acc_split.begin(), s.acc_split.end(), 0.0f);
      std::fill(s.partial_split.begin(), s.partial_split.end(), paged_partial{hidden, 0.0f});
      attend_range(a, row, kv_head, from, to, s, s.partial_split.data(), s.acc_split.data());
      for (int32_t q = 0; q < queries; ++q) {
        float into = 1, other = 0;
        paged_merge_factors(s.partial[static_cast<size_t>(q)],
                            s.partial_split[static_cast<size_t>(q)], into, other);
        float* acc = s.acc.data() + static_cast<size_t>(q) * d;
        const float* add = s.acc_split.data() + static_cast<size_t>(q) * d;
        for (int32_t e = 0; e < d; ++e) acc[e] = acc[e] * into + add[e] * other;
      }
    }
    for (int32_t q = 0; q < queries; ++q) {
      float* acc = s.acc.data() + static_cast<size_t>(q) * d;
      const float sum = s.partial[static_cast<size_t>(q)].sum;
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      for (int32_t e = 0; e < d; ++e) acc[e] *= inv;
      const int32_t head = kv_head * groups + q / a.columns, column = q % a.columns;
      store(a.type, a.out, paged_out_offset(a, row, head, column), d, acc);
    }
  }
}

}  // namespace computron::engine
