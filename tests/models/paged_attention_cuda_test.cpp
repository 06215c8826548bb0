// On a real GPU: the paged-attention kernel (engine/cuda/paged_attention.cu) inside the
// decoder's decode steps against the gathered blocks on the same GPU, in f16, bf16 and f32,
// for one, four and eight query heads per kv head; histories that cross block boundaries
// as they decode, and one long enough that the kernel splits it (split-K) and merges. The
// f32 kernel also against the host build on the CPU. And the kernels alone, with what a
// captured CUDA graph needs (engine/paged_attention.hpp, engine/rope.hpp): chunks read
// through a table in device memory, splits by each row's reach, and the KV write without
// rotation, against their host builds. Tagged [cuda]: it runs only where a GPU is
// (tests/CMakeLists.txt; scripts/gpu-check).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/error.hpp"
#include "engine/cuda/paged_attention.hpp"
#include "engine/cuda/rope.hpp"
#include "engine/host_elements.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "models/weights.hpp"
#include "tests/support/devices.hpp"
#include "tests/support/sharded_model.hpp"

// cudart, which the kernels' library links: the kernels run on the legacy default stream
// and the device's copies on a stream of their own, so a read-back waits for the whole GPU
// first. Declared here because this binary sees no CUDA header (nor torch's).
extern "C" int cudaDeviceSynchronize();

using namespace computron;
using namespace computron::models;
using namespace std::chrono_literals;
using computron::test::relative_error;

namespace {

/// A whole model on `dev` with these KV options.
struct single {
  std::unique_ptr<gpu::weight_shard> shard;
  std::unique_ptr<gpu::collective> group;
  std::unique_ptr<decoder_stage> stage;

  single(const decoder_spec& spec, gpu::dtype type, gpu::device_ptr dev, kv_pool_options kv) {
    auto table = shard_layout(spec, type, {1, 1}, {0, 0});
    REQUIRE(table);
    auto s = gpu::weight_shard::create(std::move(dev), *table);
    REQUIRE(s);
    shard = std::move(*s);
    REQUIRE_FALSE(fill_seeded(spec, {1, 1}, {0, 0}, shard->table(), shard->host_data(), 7));
    REQUIRE_FALSE(shard->load());
    REQUIRE_FALSE(shard->wait_loaded(60s));
    group = gpu::make_solo_collective();
    auto st = decoder_stage::create(spec, {1, 1}, {0, 0}, *shard, *group, std::move(kv));
    REQUIRE(st);
    stage = std::move(*st);
  }

  /// A prefill of `prompts`, then `steps` decode steps fed the same tokens: each step's
  /// logits [rows, vocab] in f32.
  std::vector<std::vector<float>> run(const std::vector<std::vector<int64_t>>& prompts, int steps) {
    std::vector<std::vector<float>> out;
    kv_cache cache;
    auto first = stage->prefill(prompts, nullptr, cache);
    REQUIRE(first);
    out.push_back(first->to_floats());
    for (int k = 0; k < steps; ++k) {
      std::vector<int64_t> fed(prompts.size(), 5 + k);
      auto next = stage->decode(fed, nullptr, cache);
      INFO((next ? std::string{} : render(next.error())));
      REQUIRE(next);
      out.push_back(next->to_floats());
    }
    return out;
  }
};

std::vector<int64_t> prompt(size_t n, int64_t seed) {
  std::vector<int64_t> p{1};
  for (size_t i = 1; i < n; ++i) p.push_back(3 + (seed * 131 + static_cast<int64_t>(i) * 37) % 400);
  return p;
}

/// llama-tiny with `heads` query heads over `kv_heads` (head dim 16).
decoder_spec grouped(int64_t heads, int64_t kv_heads) {
  auto spec = *find_spec("llama-tiny");
  spec.name = "llama-tiny-gqa";
  spec.heads = heads;
  spec.kv_heads = kv_heads;
  spec.hidden = heads * 16;
  spec.head_dim = 16;
  spec.max_positions = 2048;
  return spec;
}

/// `bytes` of host memory copied into new device memory.
gpu::device_allocation upload(gpu::device& dev, const void* src, size_t bytes) {
  auto mem = dev.allocate(bytes);
  REQUIRE(mem);
  auto copy = dev.copy_to_device_async(*mem, 0, src, bytes);
  REQUIRE(copy);
  REQUIRE_FALSE((*copy)->wait(60s));
  return std::move(*mem);
}

template <typename T>
gpu::device_allocation upload(gpu::device& dev, const std::vector<T>& v) {
  return upload(dev, v.data(), v.size() * sizeof(T));
}

/// Device memory back on the host, once every kernel queued so far has run.
std::vector<uint8_t> download(gpu::device& dev, const gpu::device_allocation& mem, size_t bytes) {
  REQUIRE(cudaDeviceSynchronize() == 0);
  std::vector<uint8_t> out(bytes);
  REQUIRE_FALSE(dev.copy_to_host(out.data(), mem, 0, bytes));
  return out;
}

size_t element_bytes(engine::element_type t) {
  return t == engine::element_type::f32 ? 4 : 2;
}

/// `n` normal values times `scale`, in the type's bytes.
std::vector<uint8_t> random_elements(engine::element_type t, size_t n, float scale,
                                     std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f(n);
  for (auto& x : f) x = normal(rng) * scale;
  std::vector<uint8_t> out(n * element_bytes(t));
  engine::store(t, out.data(), 0, static_cast<int32_t>(n), f.data());
  return out;
}

std::vector<float> as_floats(engine::element_type t, const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / element_bytes(t));
  engine::load(t, bytes.data(), 0, static_cast<int32_t>(out.size()), out.data());
  return out;
}

}  // namespace

TEST_CASE("the paged-attention kernel equals the gathered blocks on a GPU",
          "[cuda][paged_attention]") {
  auto gpu_dev = test::cuda(0);
  // 15, 16 and 17 positions cross a block boundary in the first decode steps; 700 spans 44
  // blocks, which the kernel splits (paged_attention_splits: up to 3 splits of 256
  // positions, as long as 2 x the device's multiprocessors exceed rows x kv heads, 5 to 20
  // here: on every GPU with 10 or more).
  const std::vector<std::vector<int64_t>> prompts = {prompt(700, 1), prompt(15, 2), prompt(16, 3),
                                                     prompt(17, 4), prompt(1, 5)};
  kv_pool_options in_place, gathered;
  gathered.paged_attention = false;
  for (auto [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {8, 1}}) {
    auto spec = grouped(heads, kv_heads);
    for (auto type : {gpu::dtype::f16, gpu::dtype::bf16, gpu::dtype::f32}) {
      single a{spec, type, gpu_dev, in_place};
      single b{spec, type, gpu_dev, gathered};
      REQUIRE(a.stage->reads_kv_in_place(1));
      REQUIRE_FALSE(b.stage->reads_kv_in_place(1));
      auto got = a.run(prompts, 20);
      auto want = b.run(prompts, 20);
      // The gather rounds the probabilities to the model's type before their product with
      // the values; the kernel keeps them in f32.
      const double bound = type == gpu::dtype::f32 ? 1e-4 : type == gpu::dtype::f16 ? 5e-3 : 3e-2;
      for (size_t k = 0; k < got.size(); ++k) {
        auto e = relative_error(got[k], want[k]);
        INFO(heads << "/" << kv_heads << " " << gpu::to_string(type) << " step " << k << ": " << e);
        CHECK(e <= bound);
      }
    }
    // The kernel in f32 against the host build on the CPU.
    single gpu32{spec, gpu::dtype::f32, gpu_dev, in_place};
    single cpu32{spec, gpu::dtype::f32, test::emulated(0), in_place};
    REQUIRE(cpu32.stage->reads_kv_in_place(1));
    auto on_gpu = gpu32.run(prompts, 20);
    auto on_cpu = cpu32.run(prompts, 20);
    for (size_t k = 0; k < on_gpu.size(); ++k) CHECK(relative_error(on_gpu[k], on_cpu[k]) <= 1e-3);
  }
}

TEST_CASE("the paged-attention kernel reads a chunked prefill's later chunks on a GPU",
          "[cuda][paged_attention]") {
  // Chunks of 7 tokens, the first taking what they leave (5 of 40, as the dispatch core
  // plans them): after it, each chunk is an extend step of 7 columns, which the kernel
  // takes (4 query heads per kv head x 7 x 16 elements fit a thread block).
  auto gpu_dev = test::cuda(0);
  auto spec = grouped(8, 2);
  kv_pool_options in_place, gathered;
  gathered.paged_attention = false;
  const std::vector<std::vector<int64_t>> prompts = {prompt(40, 1), prompt(23, 2), prompt(9, 3)};
  for (auto type : {gpu::dtype::f16, gpu::dtype::bf16, gpu::dtype::f32}) {
    single a{spec, type, gpu_dev, in_place};
    single b{spec, type, gpu_dev, gathered};
    REQUIRE(a.stage->reads_kv_in_place(7));
    auto chunked = [&](single& m) {
      kv_cache cache;
      caf::expected<host_tensor> out{host_tensor{}};
      for (int64_t left = 40; left > 0;) {
        const auto next = (left - 1) / 7 * 7;
        out = m.stage->prefill_chunk(prompts, next, left - next, nullptr, cache);
        left = next;
        INFO((out ? std::string{} : render(out.error())));
        REQUIRE(out);
      }
      return out->to_floats();
    };
    const double bound = type == gpu::dtype::f32 ? 1e-4 : type == gpu::dtype::f16 ? 5e-3 : 3e-2;
    auto e = relative_error(chunked(a), chunked(b));
    INFO(gpu::to_string(type) << ": " << e);
    CHECK(e <= bound);
  }
}

TEST_CASE(
    "the paged-attention kernel reads a device chunk table and splits by reach as the "
    "host build does",
    "[cuda][paged_attention]") {
  // As a captured graph calls it: max_positions at the table's capacity, the chunks through
  // a table in device memory, and the same arguments at two contexts (only the limits in
  // device memory change), with 1, 3 and 8 splits of each row's own reach. Rows of 5, 700
  // and 33 positions, then 40, 1000 and 17; 4 query heads per kv head of 64, then 32 query
  // heads on one kv head of 128 (multi-query), whose shared memory is past the default
  // 48 KiB (52 KB): the kernel asks for it.
  auto dev = test::cuda(0);
  using engine::element_type;
  const int32_t rows = 3, bt = 16, width = 64;
  const std::vector<int32_t> chunk_blocks = {16, 32, 64};
  const std::vector<std::vector<int64_t>> contexts = {{5, 700, 33}, {40, 1000, 17}};
  struct shape {
    int32_t heads, kv_heads, d;
  };
  for (auto [heads, kv_heads, d] : {shape{8, 2, 64}, shape{32, 1, 128}})
    for (auto type : {element_type::f32, element_type::bf16}) {
      INFO(static_cast<int>(type) << ", " << heads << " heads on " << kv_heads << " of " << d);
      std::mt19937 rng(29);
      // Every element of every chunk random: what a row reads is whichever blocks its table
      // names, the same ones on both builds.
      std::vector<std::vector<uint8_t>> keys, values;
      std::vector<int64_t> unused;
      for (size_t c = 0; c < chunk_blocks.size(); ++c) {
        const auto n =
            static_cast<size_t>(kv_heads) * static_cast<size_t>(chunk_blocks[c]) * bt * d;
        keys.push_back(random_elements(type, n, 1.0f, rng));
        values.push_back(random_elements(type, n, 1.0f, rng));
        for (int32_t b = 0; b < chunk_blocks[c]; ++b)
          unused.push_back((static_cast<int64_t>(c) << 32) | b);
      }
      std::shuffle(unused.begin(), unused.end(), rng);
      // Each row's blocks for its longest context; entries past them are never read.
      std::vector<int64_t> table(static_cast<size_t>(rows * width), 0);
      size_t next = 0;
      for (int32_t r = 0; r < rows; ++r) {
        int64_t longest = 0;
        for (auto& lengths : contexts) longest = std::max(longest, lengths[static_cast<size_t>(r)]);
        for (int64_t b = 0; b * bt < longest; ++b)
          table[static_cast<size_t>(r * width + b)] = unused.at(next++);
      }
      const auto queries = random_elements(type, static_cast<size_t>(rows * heads * d), 0.3f, rng);
      const size_t out_bytes = queries.size();

      engine::paged_attention_args a;
      a.type = type;
      a.rows = rows;
      a.columns = 1;
      a.heads = heads;
      a.kv_heads = kv_heads;
      a.head_dim = d;
      a.block_tokens = bt;
      a.table_width = width;
      a.max_positions = width * bt;
      a.splits_by_reach = true;
      a.chunks = static_cast<int32_t>(chunk_blocks.size());

      auto on_host = a;
      std::vector<uint8_t> host_out(out_bytes);
      on_host.queries = queries.data();
      on_host.out = host_out.data();
      on_host.table = table.data();
      for (size_t c = 0; c < chunk_blocks.size(); ++c)
        on_host.chunk[c] = {keys[c].data(), values[c].data(),
                            static_cast<int64_t>(chunk_blocks[c]) * bt * d};

      std::vector<gpu::device_allocation> chunk_mem;
      std::vector<engine::paged_kv_chunk> chunk_table;
      for (size_t c = 0; c < chunk_blocks.size(); ++c) {
        chunk_mem.push_back(upload(*dev, keys[c]));
        chunk_mem.push_back(upload(*dev, values[c]));
        chunk_table.push_back({chunk_mem[2 * c].data(), chunk_mem[2 * c + 1].data(),
                               static_cast<int64_t>(chunk_blocks[c]) * bt * d});
      }
      auto table_mem = upload(*dev, table);
      auto chunk_table_mem = upload(*dev, chunk_table);
      auto queries_mem = upload(*dev, queries);
      auto limits_mem = upload(*dev, contexts[0]);
      auto out_mem = dev->allocate(out_bytes);
      REQUIRE(out_mem);
      // The inline chunks stay empty: the kernel reads the table.
      auto on_gpu = a;
      on_gpu.queries = queries_mem.data();
      on_gpu.out = out_mem->data();
      on_gpu.table = static_cast<const int64_t*>(table_mem.data());
      on_gpu.limits = static_cast<const int64_t*>(limits_mem.data());
      on_gpu.chunk_table = static_cast<const engine::paged_kv_chunk*>(chunk_table_mem.data());
      REQUIRE(engine::cuda::paged_attention_unfit(on_gpu) == nullptr);

      for (auto& limits : contexts) {
        auto copy = dev->copy_to_device_async(limits_mem, 0, limits.data(),
                                              limits.size() * sizeof(int64_t));
        REQUIRE(copy);
        REQUIRE_FALSE((*copy)->wait(60s));
        on_host.limits = limits.data();
        REQUIRE(engine::paged_attention_host_refusal(on_host) == nullptr);
        engine::paged_attention_host(on_host, 0, static_cast<int64_t>(rows) * kv_heads, 1);
        const auto want = as_floats(type, host_out);
        for (int32_t splits : {1, 3, 8}) {
          INFO("context of " << limits[1] << ", splits " << splits);
          const auto ws_bytes = engine::cuda::paged_attention_workspace_bytes(on_gpu, splits);
          gpu::device_allocation ws;
          if (ws_bytes > 0) {
            auto w = dev->allocate(ws_bytes);
            REQUIRE(w);
            ws = std::move(*w);
          }
          REQUIRE_FALSE(dev->fill(*out_mem, 0xff));  // NaN where the kernel writes nothing
          const char* why = engine::cuda::paged_attention_launch(on_gpu, splits,
                                                                 ws ? ws.data() : nullptr, nullptr);
          INFO((why ? why : ""));
          REQUIRE(why == nullptr);
          const auto got = as_floats(type, download(*dev, *out_mem, out_bytes));
          for (auto x : got) REQUIRE(std::isfinite(x));
          // CUDA's expf and another order of sums: f32 to its rounding, bf16 to a unit of
          // its last place.
          const double bound = type == element_type::f32 ? 1e-4 : 1e-2;
          auto e = relative_error(got, want);
          INFO(e);
          CHECK(e <= bound);
        }
      }
    }
}

TEST_CASE("the KV write without rotation through a device cache table equals the host build",
          "[cuda][rope]") {
  // OPT's KV write: three rows of two columns (one padding) from a q/k/v product into two
  // chunks of 16 slots, in blocks out of order; the keys also head major. Copies: equal.
  auto dev = test::cuda(0);
  using engine::element_type;
  const int64_t rows = 3, columns = 2, heads = 4, kv_heads = 2, d = 64, slots_per_chunk = 16;
  const int64_t width = (heads + 2 * kv_heads) * d;
  const std::vector<int64_t> slots = {(1LL << 32) | 9, 3, -1, (1LL << 32) | 0, 15, (1LL << 32) | 4};
  for (auto type : {element_type::f32, element_type::bf16}) {
    INFO(static_cast<int>(type));
    std::mt19937 rng(31);
    const size_t esize = element_bytes(type);
    const auto product =
        random_elements(type, static_cast<size_t>(rows * columns * width), 1.0f, rng);
    const size_t chunk_bytes = static_cast<size_t>(kv_heads * slots_per_chunk * d) * esize;
    const size_t k_out_bytes = static_cast<size_t>(rows * kv_heads * columns * d) * esize;
    // Poison where nothing is written: it must be left as it is.
    const std::vector<uint8_t> poison(chunk_bytes, 0x5a);

    engine::rope_args a;
    a.type = type;
    a.rows = rows;
    a.columns = columns;
    a.heads = 0;
    a.kv_heads = kv_heads;
    a.head_dim = d;
    a.rotate = false;
    a.k_row_stride = a.v_row_stride = columns * width;
    a.k_column_stride = a.v_column_stride = width;
    a.cache_chunks = 2;

    auto on_host = a;
    std::vector<std::vector<uint8_t>> host_chunks(4, poison);
    std::vector<uint8_t> host_k_out(k_out_bytes);
    on_host.k = product.data() + static_cast<size_t>(heads * d) * esize;
    on_host.v = product.data() + static_cast<size_t>((heads + kv_heads) * d) * esize;
    on_host.k_out = host_k_out.data();
    on_host.cache_slots = slots.data();
    for (int c = 0; c < 2; ++c)
      on_host.cache[c] = {host_chunks[2 * c].data(), host_chunks[2 * c + 1].data(),
                          slots_per_chunk * d};
    REQUIRE(engine::rope_host_refusal(on_host) == nullptr);
    engine::rope_host(on_host, 0, rows * columns);

    auto product_mem = upload(*dev, product);
    auto slots_mem = upload(*dev, slots);
    std::vector<gpu::device_allocation> chunk_mem;
    for (int i = 0; i < 4; ++i) chunk_mem.push_back(upload(*dev, poison));
    std::vector<engine::paged_kv_chunk> cache_table;
    for (int c = 0; c < 2; ++c)
      cache_table.push_back(
          {chunk_mem[2 * c].data(), chunk_mem[2 * c + 1].data(), slots_per_chunk * d});
    auto table_mem = upload(*dev, cache_table);
    auto k_out_mem = dev->allocate(k_out_bytes);
    REQUIRE(k_out_mem);
    auto on_gpu = a;
    const auto* base = static_cast<const uint8_t*>(product_mem.data());
    on_gpu.k = base + static_cast<size_t>(heads * d) * esize;
    on_gpu.v = base + static_cast<size_t>((heads + kv_heads) * d) * esize;
    on_gpu.k_out = k_out_mem->data();
    on_gpu.cache_slots = static_cast<const int64_t*>(slots_mem.data());
    on_gpu.cache_table = static_cast<const engine::paged_kv_chunk*>(table_mem.data());
    const char* why = engine::cuda::rope_launch(on_gpu, nullptr);
    INFO((why ? why : ""));
    REQUIRE(why == nullptr);
    CHECK(download(*dev, *k_out_mem, k_out_bytes) == host_k_out);
    for (int i = 0; i < 4; ++i) {
      INFO((i % 2 == 0 ? "keys" : "values") << " of chunk " << i / 2);
      CHECK(download(*dev, chunk_mem[static_cast<size_t>(i)], chunk_bytes) ==
            host_chunks[static_cast<size_t>(i)]);
    }
  }
}
