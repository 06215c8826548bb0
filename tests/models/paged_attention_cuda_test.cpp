// On a real GPU: the paged-attention kernel (engine/cuda/paged_attention.cu) inside the
// decoder's decode steps against the gathered blocks on the same GPU, in f16, bf16 and f32,
// for one, four and eight query heads per kv head; histories that cross block boundaries
// as they decode, and one long enough that the kernel splits it (split-K) and merges. The
// f32 kernel also against the host build on the CPU. Tagged [cuda]: it runs only where a
// GPU is (tests/CMakeLists.txt; scripts/gpu-check).
#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "models/weights.hpp"
#include "tests/support/devices.hpp"
#include "tests/support/sharded_model.hpp"

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
  // Chunks of 7 tokens: after the first, each chunk is an extend step of 7 columns, which
  // the kernel takes (4 query heads per kv head x 7 x 16 elements fit a thread block).
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
        left = std::max<int64_t>(0, left - 7);
        out = m.stage->prefill_chunk(prompts, left, 7, nullptr, cache);
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
