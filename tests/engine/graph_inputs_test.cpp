// The layout of a decode graph's inputs (engine/graph_inputs.hpp): buckets, the block table
// of the pool's slots, padding rows that read and write nothing, and the steps a graph
// refuses (which then run eagerly).
#include <catch2/catch.hpp>

#include <vector>

#include "engine/graph_inputs.hpp"

using namespace computron::engine;

namespace {

int64_t block(int64_t chunk, int64_t index) {
  return (chunk << 32) | index;
}

}  // namespace

TEST_CASE("graph buckets are 1, 2, 4, 8 then steps of 8 up to the maximum", "[graphs]") {
  CHECK(graph_buckets(0).empty());
  CHECK(graph_buckets(-3).empty());
  CHECK(graph_buckets(1) == std::vector<int32_t>{1});
  CHECK(graph_buckets(3) == std::vector<int32_t>{1, 2, 3});
  CHECK(graph_buckets(8) == std::vector<int32_t>{1, 2, 4, 8});
  CHECK(graph_buckets(32) == std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32});
  CHECK(graph_buckets(20) == std::vector<int32_t>{1, 2, 4, 8, 16, 20});
  CHECK(graph_buckets(10'000).back() == graph_max_bucket);

  auto b = graph_buckets(32);
  CHECK(graph_bucket_for(b, 0) == 0);
  CHECK(graph_bucket_for(b, 1) == 1);
  CHECK(graph_bucket_for(b, 3) == 4);
  CHECK(graph_bucket_for(b, 9) == 16);
  CHECK(graph_bucket_for(b, 32) == 32);
  CHECK(graph_bucket_for(b, 33) == 0);
  CHECK(graph_bucket_for({}, 1) == 0);
}

TEST_CASE("a graph's inputs hold each row's blocks by pool slot, and pad the bucket", "[graphs]") {
  graph_inputs in;
  shape_graph_inputs(in, 4, 3);
  REQUIRE(in.size() == 4 * 3 + 4 * 4);
  // Row 0: 20 positions (the new token at 19) in blocks of 16: its second block, offset 3.
  // Row 1: one position, in chunk slot 2.
  std::vector<int64_t> r0{block(0, 5), block(1, 7)}, r1{block(2, 0)};
  std::vector<graph_row> rows{{&r0, 20, 42}, {&r1, 1, 7}};
  REQUIRE(fill_graph_inputs(in, rows, 16, 32, 1) == nullptr);
  auto at = [&](int64_t i) { return in.all[static_cast<size_t>(i)]; };
  // The table: ids as the pool names them, zeros past a row's blocks.
  CHECK(at(in.table_at() + 0) == block(0, 5));
  CHECK(at(in.table_at() + 1) == block(1, 7));
  CHECK(at(in.table_at() + 2) == 0);
  CHECK(at(in.table_at() + 3) == block(2, 0));
  CHECK(at(in.table_at() + 4) == 0);
  CHECK(at(in.limits_at() + 0) == 20);
  CHECK(at(in.limits_at() + 1) == 1);
  // Slot: the chunk's slot high, block index x 16 + offset low.
  CHECK(at(in.slots_at() + 0) == block(1, 7 * 16 + 3));
  CHECK(at(in.slots_at() + 1) == block(2, 0));
  CHECK(at(in.positions_at() + 0) == 19);
  CHECK(at(in.positions_at() + 1) == 0);
  CHECK(at(in.tokens_at() + 0) == 42);
  CHECK(at(in.tokens_at() + 1) == 7);
  // Padding rows: nothing read (limit 0), nothing written (slot -1), the pad token.
  for (int64_t r = 2; r < 4; ++r) {
    CHECK(at(in.limits_at() + r) == 0);
    CHECK(at(in.slots_at() + r) == -1);
    CHECK(at(in.positions_at() + r) == 0);
    CHECK(at(in.tokens_at() + r) == 1);
  }

  // Filled again with fewer rows: the row that left is padding now, its table zeros.
  REQUIRE(fill_graph_inputs(in, {{&r1, 1, 9}}, 16, 32, 1) == nullptr);
  CHECK(at(in.table_at() + 0) == block(2, 0));
  CHECK(at(in.table_at() + 1) == 0);
  CHECK(at(in.table_at() + 3) == 0);
  CHECK(at(in.limits_at() + 1) == 0);
  CHECK(at(in.slots_at() + 1) == -1);
}

TEST_CASE("a graph refuses steps its buffers cannot hold", "[graphs]") {
  graph_inputs in;
  shape_graph_inputs(in, 2, 2);
  std::vector<int64_t> two{block(0, 0), block(0, 1)}, three{block(0, 0), block(0, 1), block(0, 2)},
      far{block(32, 0)}, one{block(0, 0)};
  CHECK(fill_graph_inputs(in, {{&one, 1, 0}, {&one, 1, 0}, {&one, 1, 0}}, 16, 32, 1) != nullptr);
  CHECK(fill_graph_inputs(in, {{&three, 40, 0}}, 16, 32, 1) != nullptr);
  CHECK(fill_graph_inputs(in, {{&far, 1, 0}}, 16, 32, 1) != nullptr);
  CHECK(fill_graph_inputs(in, {{&one, 17, 0}}, 16, 32, 1) != nullptr);
  CHECK(fill_graph_inputs(in, {{&one, 0, 0}}, 16, 32, 1) != nullptr);
  CHECK(fill_graph_inputs(in, {{nullptr, 1, 0}}, 16, 32, 1) != nullptr);
  CHECK(fill_graph_inputs(in, {{&two, 32, 0}}, 16, 32, 1) == nullptr);
}
