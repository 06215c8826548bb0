// KV caches in blocks: rows that join and leave a running batch decode as they do alone,
// the blocks a batch holds are exactly its rows' (and all go back), the stage's allocator
// hook gives the memory and a refusal is an error, not a crash. Tensor-parallel ranks run
// in threads through real Gloo on 127.0.0.1.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <sstream>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "gpu/emulated_device.hpp"
#include "tests/support/sharded_model.hpp"

using namespace computron;
using namespace computron::models;
using computron::test::relative_error;

namespace {

/// A request of the scripted batch: its prompt, the step it joins at, the tokens it gets.
struct request {
  std::vector<int64_t> prompt;
  int arrive = 0;
  size_t max_tokens = 1;
};

/// What every request got: greedy tokens and the logits each was drawn from.
struct outcome {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<std::vector<float>>> logits;
  bool operator==(const outcome& o) const { return tokens == o.tokens && logits == o.logits; }
};

/// Rows [rows, vocab] of a last stage's logits, and each row's greedy pick.
std::vector<std::vector<float>> rows_of(const host_tensor& t) {
  auto f = t.to_floats();
  const auto vocab = t.shape[1];
  std::vector<std::vector<float>> out;
  for (int64_t r = 0; r < t.shape[0]; ++r)
    out.emplace_back(f.begin() + r * vocab, f.begin() + (r + 1) * vocab);
  return out;
}
int64_t greedy(const std::vector<float>& row) {
  return std::max_element(row.begin(), row.end()) - row.begin();
}

/// One step through the chain: a prefill of `prompts` or a decode of `tokens`.
caf::expected<host_tensor> step(const std::vector<decoder_stage*>& chain,
                                std::vector<kv_cache>& caches,
                                const std::vector<std::vector<int64_t>>* prompts,
                                const std::vector<int64_t>& tokens) {
  host_tensor h;
  for (size_t s = 0; s < chain.size(); ++s) {
    auto* in = s == 0 ? nullptr : &h;
    auto r = prompts ? chain[s]->prefill(*prompts, in, caches[s])
                     : chain[s]->decode(tokens, in, caches[s]);
    if (!r) return r;
    h = std::move(*r);
  }
  return h;
}

/// Each request on its own: its prefill, then greedy decode steps.
caf::expected<outcome> alone(const std::vector<decoder_stage*>& chain,
                             const std::vector<request>& reqs) {
  outcome o;
  for (auto& q : reqs) {
    std::vector<kv_cache> caches(chain.size());
    std::vector<int64_t> toks;
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<int64_t>> prompts{q.prompt};
    auto out = step(chain, caches, &prompts, {});
    while (true) {
      if (!out) return std::move(out.error());
      logits.push_back(rows_of(*out)[0]);
      toks.push_back(greedy(logits.back()));
      if (toks.size() == q.max_tokens) break;
      out = step(chain, caches, nullptr, {toks.back()});
    }
    o.tokens.push_back(toks);
    o.logits.push_back(logits);
  }
  return o;
}

/// Called after every operation on the batch's caches (one per stage) with the requests
/// each row serves; returns what is wrong, empty when nothing is.
using cache_check =
    std::function<std::string(const std::vector<kv_cache>&, const std::vector<size_t>&)>;

/// The scripted batch: at every step, rows that have all their tokens leave, the others
/// decode one token, then the requests arriving at this step are prefilled together and
/// join. Continuous batching as the dispatch core drives it.
caf::expected<outcome> batched(const std::vector<decoder_stage*>& chain,
                               const std::vector<request>& reqs, const cache_check& check = {}) {
  outcome o;
  o.tokens.resize(reqs.size());
  o.logits.resize(reqs.size());
  std::vector<kv_cache> batch(chain.size());
  std::vector<size_t> rows;  // request of each row
  size_t done = 0;
  auto checked = [&](const char* what, int s) -> caf::error {
    if (!check) return {};
    auto why = check(batch, rows);
    if (why.empty()) return {};
    return make_error(ec::invalid_request, fmt::format("step {} after {}: {}", s, what, why));
  };
  for (int s = 0; done < reqs.size(); ++s) {
    if (s > 1000) return make_error(ec::deadline_exceeded, "the batch never finished");
    std::vector<int64_t> keep;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (o.tokens[rows[r]].size() < reqs[rows[r]].max_tokens)
        keep.push_back(static_cast<int64_t>(r));
      else
        ++done;
    }
    if (keep.size() != rows.size()) {
      for (auto& c : batch)
        if (auto err = c.keep_rows(keep)) return err;
      std::vector<size_t> next;
      for (auto r : keep) next.push_back(rows[static_cast<size_t>(r)]);
      rows = next;
      if (auto err = checked("leaving", s)) return err;
    }
    if (!rows.empty()) {
      std::vector<int64_t> last;
      for (auto r : rows) last.push_back(o.tokens[r].back());
      auto out = step(chain, batch, nullptr, last);
      if (!out) return std::move(out.error());
      auto got = rows_of(*out);
      for (size_t r = 0; r < rows.size(); ++r) {
        o.logits[rows[r]].push_back(got[r]);
        o.tokens[rows[r]].push_back(greedy(got[r]));
      }
      if (auto err = checked("decoding", s)) return err;
    }
    std::vector<std::vector<int64_t>> prompts;
    std::vector<size_t> joining;
    for (size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i].arrive == s) {
        prompts.push_back(reqs[i].prompt);
        joining.push_back(i);
      }
    if (prompts.empty()) continue;
    std::vector<kv_cache> join(chain.size());
    auto out = step(chain, join, &prompts, {});
    if (!out) return std::move(out.error());
    auto got = rows_of(*out);
    for (size_t r = 0; r < joining.size(); ++r) {
      o.logits[joining[r]].push_back(got[r]);
      o.tokens[joining[r]].push_back(greedy(got[r]));
    }
    for (size_t c = 0; c < chain.size(); ++c)
      if (auto err = batch[c].append(std::move(join[c]))) return err;
    rows.insert(rows.end(), joining.begin(), joining.end());
    if (auto err = checked("joining", s)) return err;
  }
  return o;
}

/// Prompts of `n` ids from `seed`.
std::vector<int64_t> prompt(size_t n, int64_t seed) {
  std::vector<int64_t> p{2};
  for (size_t i = 1; i < n; ++i) p.push_back(3 + (seed * 131 + static_cast<int64_t>(i) * 37) % 500);
  return p;
}

/// Rows join and leave at different steps, cross block boundaries (15 and 30 tokens, an
/// exact block of 16) and two identical prompts share one prefill and their first block.
const std::vector<request> script = {
    {prompt(15, 1), 0, 6}, {prompt(3, 2), 0, 10}, {prompt(16, 3), 2, 4},
    {prompt(30, 4), 3, 8}, {prompt(5, 5), 5, 3},  {prompt(5, 5), 5, 5},
};

void same_as_alone(const outcome& got, const outcome& want) {
  REQUIRE(got.tokens.size() == want.tokens.size());
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    INFO("request " << i);
    CHECK(got.tokens[i] == want.tokens[i]);
    REQUIRE(got.logits[i].size() == want.logits[i].size());
    for (size_t k = 0; k < want.logits[i].size(); ++k) {
      INFO("token " << k);
      CHECK(relative_error(got.logits[i][k], want.logits[i][k]) <= 1e-5);
    }
  }
}

/// The blocks the caches hold are their rows' and the pool's in use: distinct blocks are
/// the sum of kv_blocks_for(length), less the first block the two identical prompts share
/// until one of them writes into it.
cache_check accounting(const std::vector<decoder_stage*>& chain) {
  return [chain](const std::vector<kv_cache>& caches, const std::vector<size_t>& rows) {
    std::ostringstream why;
    for (size_t s = 0; s < chain.size(); ++s) {
      auto lengths = caches[s].lengths();
      int64_t sum = 0;
      for (auto len : lengths) sum += kv_blocks_for(len);
      // Requests 4 and 5 share their 5-token prompt's block until their first decode.
      auto shared = 0;
      for (size_t r = 0; r + 1 < rows.size(); ++r)
        if (rows[r] == 4 && rows[r + 1] == 5 && lengths[r] == 5 && lengths[r + 1] == 5) shared = 1;
      auto pool = chain[s]->kv_blocks();
      if (caches[s].blocks() != sum - shared)
        why << "stage " << s << " holds " << caches[s].blocks() << " blocks, its rows "
            << sum - shared << "; ";
      if (pool.blocks_in_use != caches[s].blocks())
        why << "stage " << s << "'s pool has " << pool.blocks_in_use << " in use, the batch "
            << caches[s].blocks() << "; ";
      if (pool.blocks_allocated < pool.blocks_in_use) why << "more blocks in use than allocated; ";
    }
    return why.str();
  };
}

}  // namespace

TEST_CASE("kv blocks: rows that join and leave a batch get their tokens and logits alone",
          "[models][kv][join]") {
  for (auto name : {"opt-tiny", "llama-tiny"}) {
    INFO(name);
    test::sharded_model m{
        *find_spec(name), gpu::dtype::f32, {1, 1}, test::seeded_filler(*find_spec(name), 7)};
    auto chain = m.chain(0);
    auto want = alone(chain, script);
    REQUIRE(want);
    auto got = batched(chain, script, accounting(chain));
    INFO((got ? std::string{} : render(got.error())));
    REQUIRE(got);
    same_as_alone(*got, *want);
    // Every block went back with the rows that held it, and so did every chunk.
    CHECK(chain[0]->kv_blocks().blocks_in_use == 0);
    CHECK(chain[0]->kv_blocks().chunks == 0);
    // Chunks of one block at least, so that rows' blocks spread over several chunks and
    // every gather and write crosses chunks.
    kv_pool_options small;
    small.min_chunk_blocks = 1;
    auto spread = decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], small);
    REQUIRE(spread);
    std::vector<decoder_stage*> one{spread->get()};
    auto many = batched(one, script, accounting(one));
    INFO((many ? std::string{} : render(many.error())));
    REQUIRE(many);
    same_as_alone(*many, *want);
  }
}

TEST_CASE("kv blocks: joins and leaves at every tensor x pipeline split equal each row alone",
          "[models][kv][join][tp][pp]") {
  for (auto name : {"opt-tiny", "llama-tiny"}) {
    for (auto par : {parallel_config{2, 2}, parallel_config{4, 1}}) {
      DYNAMIC_SECTION(name << " tp=" << par.tp << " pp=" << par.pp) {
        test::sharded_model m{*find_spec(name), gpu::dtype::f32, par,
                              test::seeded_filler(*find_spec(name), 7)};
        auto want = m.on_all_ranks([](std::vector<decoder_stage*> c) { return alone(c, script); });
        auto got = m.on_all_ranks([](std::vector<decoder_stage*> c) { return batched(c, script); });
        same_as_alone(got, want);
        for (auto& st : m.stages) CHECK(st->kv_blocks().blocks_in_use == 0);
      }
    }
  }
}

TEST_CASE("kv blocks: attention that reads the blocks in place equals the gathered blocks",
          "[models][kv][paged_attention]") {
  // Joins, leaves, block boundaries and shared blocks (the script), chunks of 16 blocks
  // or as small as the pool makes them (min_chunk_blocks 1: it still doubles), a kv head
  // per query head (OPT), two and four query heads per kv head (llama-tiny, llama-mini),
  // in f32 and bf16.
  for (auto name : {"opt-tiny", "llama-tiny", "llama-mini"})
    for (auto type : {gpu::dtype::f32, gpu::dtype::bf16})
      for (int64_t chunk_blocks : {16, 1}) {
        DYNAMIC_SECTION(name << " " << gpu::to_string(type) << " chunks of " << chunk_blocks) {
          test::sharded_model m{
              *find_spec(name), type, {1, 1}, test::seeded_filler(*find_spec(name), 7)};
          kv_pool_options in_place, gathered;
          in_place.min_chunk_blocks = gathered.min_chunk_blocks = chunk_blocks;
          gathered.paged_attention = false;
          auto a =
              decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], in_place);
          auto b =
              decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], gathered);
          REQUIRE(a);
          REQUIRE(b);
          // Otherwise this compares the gather with itself.
          REQUIRE((*a)->reads_kv_in_place(1));
          REQUIRE_FALSE((*b)->reads_kv_in_place(1));
          std::vector<decoder_stage*> ca{a->get()}, cb{b->get()};
          auto got = batched(ca, script, accounting(ca));
          auto want = batched(cb, script, accounting(cb));
          INFO((got ? std::string{} : render(got.error())));
          REQUIRE(got);
          REQUIRE(want);
          if (type == gpu::dtype::f32) {
            same_as_alone(*got, *want);
          } else {
            // bf16: the gather rounds the probabilities to bf16 before their product with
            // the values; the kernel keeps them in f32. The logits agree within bf16's
            // rounding at every step whose history is the same in both: up to and
            // including the first greedy pick that a near-tie sends another way.
            size_t compared = 0;
            for (size_t i = 0; i < want->logits.size(); ++i)
              for (size_t k = 0; k < want->logits[i].size() && k < got->logits[i].size(); ++k) {
                CHECK(relative_error(got->logits[i][k], want->logits[i][k]) <= 2e-2);
                ++compared;
                if (got->tokens[i][k] != want->tokens[i][k]) break;
              }
            CHECK(compared >= 20);
          }
          CHECK((*a)->kv_blocks().blocks_in_use == 0);
        }
      }
}

TEST_CASE("kv blocks: a batch whose blocks lie in more chunks than one call reads gathers them",
          "[models][kv][paged_attention]") {
  // No spare makes every chunk exactly a step's need: 40 rows
  // of lengths 1 to 40 cross a block boundary two or three at a time, one new chunk per
  // step, until the batch's blocks lie in more than engine::paged_max_chunks (32) chunks
  // and its steps gather instead (kv_cache.cpp's plan_in_place).
  test::sharded_model m{*find_spec("llama-tiny"),
                        gpu::dtype::f32,
                        {1, 1},
                        test::seeded_filler(*find_spec("llama-tiny"), 5)};
  kv_pool_options in_place, gathered;
  in_place.min_chunk_blocks = gathered.min_chunk_blocks = 1;
  gathered.paged_attention = false;
  auto a = decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], in_place);
  auto b = decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], gathered);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE((*a)->reads_kv_in_place(1));
  (*a)->set_kv_spare(0);
  (*b)->set_kv_spare(0);
  std::vector<std::vector<int64_t>> prompts;
  for (size_t n = 1; n <= 40; ++n) prompts.push_back(prompt(n, static_cast<int64_t>(n)));
  kv_cache ca, cb;
  REQUIRE((*a)->prefill(prompts, nullptr, ca));
  REQUIRE((*b)->prefill(prompts, nullptr, cb));
  int64_t most_chunks = 0;
  for (int s = 0; s < 48; ++s) {
    std::vector<int64_t> fed(prompts.size(), 7 + s);
    auto x = (*a)->decode(fed, nullptr, ca);
    auto y = (*b)->decode(fed, nullptr, cb);
    INFO("step " << s << ": " << (x ? std::string{} : render(x.error())));
    REQUIRE(x);
    REQUIRE(y);
    auto gx = rows_of(*x), gy = rows_of(*y);
    for (size_t r = 0; r < gx.size(); ++r) CHECK(relative_error(gx[r], gy[r]) <= 1e-5);
    most_chunks = std::max(most_chunks, (*a)->kv_blocks().chunks);
  }
  CHECK(most_chunks > 32);
}

TEST_CASE("kv blocks: a row crossing a 16-token block boundary mid-batch takes one more block",
          "[models][kv][decode]") {
  test::sharded_model m{*find_spec("llama-tiny"),
                        gpu::dtype::f32,
                        {1, 1},
                        test::seeded_filler(*find_spec("llama-tiny"), 3)};
  auto* stage = m.chain(0)[0];
  kv_cache batch;
  REQUIRE(stage->prefill({prompt(15, 1), prompt(3, 2)}, nullptr, batch));
  CHECK(batch.blocks() == 2);
  std::vector<std::vector<float>> first_row;
  for (int s = 0; s < 3; ++s) {
    auto out = stage->decode({7 + s, 9 + s}, nullptr, batch);
    REQUIRE(out);
    first_row.push_back(rows_of(*out)[0]);
    // Lengths 16, 17, 18 and 4, 5, 6: the long row's second block comes at 17.
    CHECK(batch.lengths() == std::vector<int64_t>{16 + s, 4 + s});
    CHECK(batch.blocks() == (s == 0 ? 2 : 3));
    CHECK(stage->kv_blocks().blocks_in_use == batch.blocks());
  }
  kv_cache solo;
  REQUIRE(stage->prefill({prompt(15, 1)}, nullptr, solo));
  for (int s = 0; s < 3; ++s) {
    auto out = stage->decode({7 + s}, nullptr, solo);
    REQUIRE(out);
    CHECK(relative_error(rows_of(*out)[0], first_row[static_cast<size_t>(s)]) <= 1e-5);
  }
  // Identical 20-token prompts share both blocks after their prefill; each then writes into
  // its own copy of the partly filled second one, and the full first one stays shared.
  kv_cache twins;
  REQUIRE(stage->prefill({prompt(20, 4), prompt(20, 4)}, nullptr, twins));
  CHECK(twins.blocks() == 2);
  auto out = stage->decode({5, 5}, nullptr, twins);
  REQUIRE(out);
  CHECK(twins.blocks() == 3);
  CHECK(rows_of(*out)[0] == rows_of(*out)[1]);
  batch = kv_cache{};
  solo = kv_cache{};
  twins = kv_cache{};
  CHECK(stage->kv_blocks().blocks_in_use == 0);
  CHECK(stage->kv_blocks().chunks == 0);
}

namespace {

/// Host memory handed out as device memory, counted: what a device hook does, over the
/// process's heap (the stage runs on the CPU).
struct counting_memory {
  std::shared_ptr<int64_t> calls = std::make_shared<int64_t>(0);
  std::shared_ptr<int64_t> live_bytes = std::make_shared<int64_t>(0);
  kv_pool_options options() const {
    kv_pool_options o;
    o.allocate = [calls = calls, live = live_bytes](uint64_t bytes) -> caf::expected<kv_memory> {
      ++*calls;
      auto mem = std::shared_ptr<std::vector<float>>(new std::vector<float>(bytes / sizeof(float)),
                                                     [live, bytes](std::vector<float>* v) {
                                                       *live -= static_cast<int64_t>(bytes);
                                                       delete v;
                                                     });
      *live += static_cast<int64_t>(bytes);
      return kv_memory{mem->data(), mem};
    };
    return o;
  }
};

/// A stage's allocator over an emulated device, as the shard worker's is over its device.
kv_pool_options device_memory(const gpu::device_ptr& dev) {
  kv_pool_options o;
  o.min_chunk_blocks = 1;
  o.allocate = [dev](uint64_t bytes) -> caf::expected<kv_memory> {
    auto a = dev->allocate(bytes);
    if (!a) return std::move(a.error());
    auto held = std::make_shared<gpu::device_allocation>(std::move(*a));
    return kv_memory{held->data(), held};
  };
  return o;
}

}  // namespace

TEST_CASE("kv blocks: the stage's allocator gives the blocks' memory and a refusal is an error",
          "[models][kv][errors]") {
  test::sharded_model m{*find_spec("opt-tiny"),
                        gpu::dtype::f32,
                        {1, 1},
                        test::seeded_filler(*find_spec("opt-tiny"), 7)};
  auto* plain = m.chain(0)[0];
  const auto block = kv_block_bytes(m.spec, gpu::dtype::f32, m.par, {0, 0});
  auto want = alone(m.chain(0), script);
  REQUIRE(want);

  SECTION("every chunk comes from the hook and goes back to it") {
    counting_memory mem;
    auto stage =
        decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], mem.options());
    REQUIRE(stage);
    std::vector<decoder_stage*> chain{stage->get()};
    int64_t most = 0;
    auto got =
        batched(chain, script, [&](const std::vector<kv_cache>&, const std::vector<size_t>&) {
          auto st = chain[0]->kv_blocks();
          most = std::max(most, st.blocks_allocated);
          return static_cast<uint64_t>(*mem.live_bytes) ==
                         static_cast<uint64_t>(st.blocks_allocated) * block
                     ? std::string{}
                     : std::string{"the hook's live bytes are not the pool's"};
        });
    INFO((got ? std::string{} : render(got.error())));
    REQUIRE(got);
    same_as_alone(*got, *want);
    CHECK((*stage)->kv_blocks().block_bytes == block);
    CHECK(*mem.calls >= 1);
    CHECK(most > 0);
    CHECK(*mem.live_bytes == 0);  // every chunk went back once its blocks did
    CHECK(plain->kv_blocks().blocks_allocated == 0);
  }

  SECTION("chunks grow past a step's need only by the spare its batch holds in the ledger") {
    counting_memory mem;
    auto stage =
        decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], mem.options());
    REQUIRE(stage);
    // Unbounded, the first chunk is the pool's smallest (16 blocks) for two rows of one.
    kv_cache a;
    REQUIRE((*stage)->prefill({prompt(15, 1), prompt(3, 2)}, nullptr, a));
    CHECK((*stage)->kv_blocks().blocks_allocated == 16);
    a = kv_cache{};
    CHECK((*stage)->kv_blocks().blocks_allocated == 0);
    // The batch holds one block beyond its rows' two: the chunk is 3.
    (*stage)->set_kv_spare(1);
    kv_cache b;
    REQUIRE((*stage)->prefill({prompt(15, 1), prompt(3, 2)}, nullptr, b));
    CHECK((*stage)->kv_blocks().blocks_allocated == 3);
    // Another batch of six blocks and a spare of two takes the free one first, then a chunk
    // of 5 + 2: afterwards the pool's free blocks are exactly the spare, however many
    // blocks the model's other batches hold (they may be going back to the ledger).
    (*stage)->set_kv_spare(2);
    kv_cache c;
    REQUIRE((*stage)->prefill({prompt(40, 3), prompt(40, 4)}, nullptr, c));
    auto s = (*stage)->kv_blocks();
    CHECK(s.blocks_allocated == 3 + 5 + 2);
    CHECK(s.blocks_allocated - s.blocks_in_use == 2);
    // With no spare, a step that needs more gets exactly that.
    (*stage)->set_kv_spare(0);
    kv_cache d;
    REQUIRE((*stage)->prefill({prompt(40, 5), prompt(40, 6), prompt(40, 7)}, nullptr, d));
    s = (*stage)->kv_blocks();
    CHECK(s.blocks_allocated == 10 + 7);  // 2 free + 7 more for 9
    CHECK(s.blocks_allocated == s.blocks_in_use);
    CHECK(*mem.live_bytes == static_cast<int64_t>(17 * block));
  }

  SECTION("a chunk fills whole pages of the device, and the pool counts them") {
    // The device maps pages: the blocks that fill a chunk's pages are the pool's too,
    // and what the pool reports holding is what the device has mapped for it.
    gpu::emulated_device_options o;
    o.capacity_bytes = 64 * block;
    o.page_bytes = 1 << 16;
    while (o.page_bytes < 3 * block) o.page_bytes *= 2;  // a page of 3 blocks or more
    auto made = gpu::emulated_device::make(o);
    REQUIRE(made);
    gpu::device_ptr dev = *made;
    auto mem = device_memory(dev);
    mem.page_bytes = dev->page_bytes();
    auto stage = decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], mem);
    REQUIRE(stage);
    const auto per_page = static_cast<int64_t>(dev->page_bytes() / block);
    {
      kv_cache c;
      REQUIRE((*stage)->prefill({prompt(15, 1), prompt(3, 2)}, nullptr, c));  // 2 blocks
      auto st = (*stage)->kv_blocks();
      CHECK(st.blocks_in_use == 2);
      CHECK(st.blocks_allocated == per_page);
      CHECK(st.device_bytes == dev->page_bytes());
      CHECK(dev->used_bytes() == st.device_bytes);
    }
    CHECK((*stage)->kv_blocks().device_bytes == 0);
    CHECK(dev->used_bytes() == 0);
  }

  SECTION("a hook that refuses fails the prefill with out_of_device_memory") {
    kv_pool_options refuse;
    refuse.allocate = [](uint64_t bytes) -> caf::expected<kv_memory> {
      return make_error(ec::out_of_device_memory, fmt::format("no room for {} bytes", bytes));
    };
    auto stage = decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0], refuse);
    REQUIRE(stage);
    kv_cache c;
    auto out = (*stage)->prefill({prompt(15, 1), prompt(3, 2)}, nullptr, c);
    REQUIRE_FALSE(out);
    CHECK(is(out.error(), ec::out_of_device_memory));
    CHECK_THAT(render(out.error()), Catch::Contains("no room for 2 more KV blocks of " +
                                                    std::to_string(block) + " bytes"));
    CHECK(c.rows() == 0);
    CHECK((*stage)->kv_blocks().blocks_in_use == 0);
  }

  SECTION("a full device fails the step that needs a block, and the batch goes on after") {
    // Room for two blocks; what was there before reads as NaN, which blocks a step leaves
    // partly empty must not pass on (masked positions meet a zero probability).
    gpu::emulated_device_options o;
    o.capacity_bytes = 2 * block;
    auto made = gpu::emulated_device::make(o);
    REQUIRE(made);
    gpu::device_ptr dev = *made;
    {
      auto all = dev->allocate(2 * block);
      REQUIRE(all);
      REQUIRE_FALSE(dev->fill(*all, 0xff));
    }
    auto stage = decoder_stage::create(m.spec, m.par, {0, 0}, *m.shards[0], *m.groups[0],
                                       device_memory(dev));
    REQUIRE(stage);
    auto* st = stage->get();
    kv_cache c;
    auto first = st->prefill({script[0].prompt, script[1].prompt}, nullptr, c);
    REQUIRE(first);
    CHECK(dev->used_bytes() == 2 * block);
    auto lone = want->logits;
    CHECK(relative_error(rows_of(*first)[0], lone[0][0]) <= 1e-5);
    CHECK(relative_error(rows_of(*first)[1], lone[1][0]) <= 1e-5);
    // Length 15 -> 16 fits the first block; the next step needs a second one: refused.
    auto second = st->decode({want->tokens[0][0], want->tokens[1][0]}, nullptr, c);
    REQUIRE(second);
    auto refused = st->decode({want->tokens[0][1], want->tokens[1][1]}, nullptr, c);
    REQUIRE_FALSE(refused);
    CHECK(is(refused.error(), ec::out_of_device_memory));
    CHECK_THAT(render(refused.error()), Catch::Contains("2 blocks allocated, 2 in use"));
    CHECK(c.lengths() == std::vector<int64_t>{16, 4});  // the failed step changed nothing
    // The short row leaves; its block takes the long row on.
    REQUIRE_FALSE(c.keep_rows({0}));
    auto third = st->decode({want->tokens[0][1]}, nullptr, c);
    INFO((third ? std::string{} : render(third.error())));
    REQUIRE(third);
    CHECK(relative_error(rows_of(*third)[0], lone[0][2]) <= 1e-5);
    c = kv_cache{};
    CHECK(dev->used_bytes() == 0);
  }
}
