// Where a model goes that names no devices: the devices with the most room left.
#include <catch2/catch.hpp>

#include "sched/placement.hpp"

using namespace computron::sched;

TEST_CASE("placement spreads models over the devices with the most room left", "[placement]") {
  const std::vector<uint64_t> usable{100, 100};
  std::vector<uint64_t> placed{0, 0};
  // Five one-shard models of 30 bytes on two devices alternate, ties to the lower index.
  std::vector<int32_t> got;
  for (int i = 0; i < 5; ++i) {
    auto d = spread_placement(1, usable, placed);
    REQUIRE(d.size() == 1);
    got.push_back(d[0]);
    placed[static_cast<size_t>(d[0])] += 30;
  }
  CHECK(got == std::vector<int32_t>{0, 1, 0, 1, 0});
  // A two-shard model takes both, in ascending order; a bigger device wins a tie of count.
  CHECK(spread_placement(2, usable, placed) == std::vector<int32_t>{0, 1});
  CHECK(spread_placement(1, {100, 300, 200}, {50, 100, 0}) == std::vector<int32_t>{1});
  CHECK(spread_placement(2, {100, 300, 200}, {50, 100, 0}) == std::vector<int32_t>{1, 2});
  // Over-promised devices have the least room; devices of no capacity are never chosen.
  CHECK(spread_placement(1, {100, 100}, {250, 120}) == std::vector<int32_t>{1});
  CHECK(spread_placement(1, {0, 100}, {0, 90}) == std::vector<int32_t>{1});
  // Too few devices, or nothing to place: empty.
  CHECK(spread_placement(3, {100, 0, 100}, {}).empty());
  CHECK(spread_placement(0, usable, placed).empty());
}

TEST_CASE("an adapter's base: by name, path, last part, one being registered, else the one model",
          "[sched][placement][adapters]") {
  const std::vector<base_candidate> served{{"llama", "/models/Llama-3.2-1B"},
                                           {"qwen", "/models/qwen/"}};
  CHECK(match_base("llama", served) == "llama");
  CHECK(match_base("/models/qwen", served) == "qwen");              // its weights' path
  CHECK(match_base("meta-llama/Llama-3.2-1B", served) == "llama");  // the folder's name
  CHECK(match_base("someone/qwen", served) == "qwen");              // the served name
  CHECK(match_base("org/mistral", served).empty());                 // none of two fits
  CHECK(match_base("mistral", served).empty());
  // Two that fit by their last part: neither.
  CHECK(match_base("org/x", {{"x", "/a/x"}, {"y", "/b/x"}}).empty());
  // One being registered that fits is the answer, never a fallback to another.
  CHECK(match_base("org/mistral", {{"llama", ""}}, {{"mistral", ""}}) == "mistral");
  // A path or hub id that fits nothing, and one model served: that one; a plain name
  // never falls back.
  CHECK(match_base("org/mistral", {{"llama", ""}}) == "llama");
  CHECK(match_base("mistral", {{"llama", ""}}).empty());
}
