#include "engine/graph_inputs.hpp"

#include <algorithm>

namespace computron::engine {

std::vector<int32_t> graph_buckets(int32_t max_batch) {
  std::vector<int32_t> out;
  const auto most = std::min(max_batch, graph_max_bucket);
  for (int32_t b : {1, 2, 4, 8})
    if (b <= most) out.push_back(b);
  for (int32_t b = 16; b <= most; b += 8) out.push_back(b);
  if (most > 0 && out.back() != most) out.push_back(most);
  return out;
}

int32_t graph_bucket_for(const std::vector<int32_t>& buckets, int64_t rows) {
  if (rows <= 0) return 0;
  auto it = std::lower_bound(buckets.begin(), buckets.end(), rows,
                             [](int32_t b, int64_t r) { return b < r; });
  return it == buckets.end() ? 0 : *it;
}

void shape_graph_inputs(graph_inputs& in, int32_t bucket, int32_t width) {
  in.bucket = bucket;
  in.width = width;
  in.all.assign(static_cast<size_t>(in.size()), 0);
}

const char* fill_graph_inputs(graph_inputs& in, const std::vector<graph_row>& rows,
                              int32_t block_tokens, int32_t max_chunks, int64_t pad_token) {
  if (static_cast<int64_t>(rows.size()) > in.bucket) return "more rows than the bucket";
  if (block_tokens <= 0) return "no block tokens";
  auto* all = in.all.data();
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    if (row.blocks == nullptr || row.length <= 0) return "a row with no position";
    const auto n = static_cast<int64_t>(row.blocks->size());
    if (n > in.width) return "a row longer than the graph's block table";
    if (n * block_tokens < row.length) return "a row whose blocks do not hold its length";
    for (auto id : *row.blocks)
      if ((id >> 32) >= max_chunks || id < 0) return "a block past the graph's chunk table";
    auto* table = all + in.table_at() + static_cast<int64_t>(r) * in.width;
    std::copy(row.blocks->begin(), row.blocks->end(), table);
    std::fill(table + n, table + in.width, 0);
    const auto p = row.length - 1;
    const auto block = (*row.blocks)[static_cast<size_t>(p / block_tokens)];
    all[in.limits_at() + static_cast<int64_t>(r)] = row.length;
    all[in.slots_at() + static_cast<int64_t>(r)] =
        (block & ~0xffffffffLL) | ((block & 0xffffffffLL) * block_tokens + p % block_tokens);
    all[in.positions_at() + static_cast<int64_t>(r)] = p;
    all[in.tokens_at() + static_cast<int64_t>(r)] = row.token;
  }
  // Padding rows: no position read, no key written.
  for (auto r = static_cast<int64_t>(rows.size()); r < in.bucket; ++r) {
    std::fill(all + in.table_at() + r * in.width, all + in.table_at() + (r + 1) * in.width, 0);
    all[in.limits_at() + r] = 0;
    all[in.slots_at() + r] = -1;
    all[in.positions_at() + r] = 0;
    all[in.tokens_at() + r] = pad_token;
  }
  return nullptr;
}

}  // namespace computron::engine
