// On a real GPU, against the CPU: the Llama family's forward (Llama, Mistral, Qwen2, Qwen3)
// in f16, bf16 and f32 as OPT's is checked in opt_cuda_test.cpp; and a gpu-let's forward
// (its green context's stream) against the whole GPU's. Tagged [cuda]: they run only where
// a GPU is (tests/CMakeLists.txt; scripts/gpu-check).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "models/checkpoint.hpp"
#include "models/weights.hpp"
#include "tests/support/devices.hpp"
#include "tests/support/llama_reference.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::models;
using namespace std::chrono_literals;

namespace {

const std::vector<std::vector<int64_t>> prompts = {{1, 100, 37, 5, 200, 12}, {1, 7, 30}, {1, 9}};
const std::vector<int64_t> fed = {5, 6, 7};
constexpr int decode_steps = 8;

using filler = std::function<caf::error(const shard_index&, gpu::weight_shard&)>;

/// One whole model on `dev`: its shard, solo group and stage.
struct single {
  std::unique_ptr<gpu::weight_shard> shard;
  std::unique_ptr<gpu::collective> group;
  std::unique_ptr<decoder_stage> stage;

  single(const decoder_spec& spec, gpu::dtype type, gpu::device_ptr dev, const filler& fill,
         compute_options compute = {}) {
    auto table = shard_layout(spec, type, {1, 1}, {0, 0});
    REQUIRE(table);
    auto s = gpu::weight_shard::create(std::move(dev), *table);
    REQUIRE(s);
    shard = std::move(*s);
    REQUIRE_FALSE(fill({0, 0}, *shard));
    REQUIRE_FALSE(shard->load());
    REQUIRE_FALSE(shard->wait_loaded(60s));
    group = gpu::make_solo_collective();
    auto st = decoder_stage::create(spec, {1, 1}, {0, 0}, *shard, *group, {}, compute);
    REQUIRE(st);
    stage = std::move(*st);
  }

  /// The logits of a prefill and of decode_steps steps fed the same tokens (so that every
  /// dtype computes the same positions), each [rows, vocab] f32.
  std::vector<host_tensor> run() {
    std::vector<host_tensor> out;
    kv_cache cache;
    auto first = stage->prefill(prompts, nullptr, cache);
    REQUIRE(first);
    out.push_back(*first);
    for (int k = 0; k < decode_steps; ++k) {
      auto next = stage->decode(fed, nullptr, cache);
      REQUIRE(next);
      out.push_back(*next);
    }
    return out;
  }
};

/// A tiny Llama-family folder as save_pretrained writes it, its spec, and a filler of
/// whole-model shards from its files.
struct tiny_folder {
  test::temp_dir dir;
  decoder_spec spec;
  std::shared_ptr<checkpoint> file;
  filler fill;

  explicit tiny_folder(const test::tiny_llama_options& opts) {
    test::write_tiny_llama_folder(dir.path(), opts);
    auto config = read_hf_config(dir.path());
    REQUIRE(config);
    spec = config->spec;
    auto f = checkpoint::open(dir.path());
    REQUIRE(f);
    file = std::make_shared<checkpoint>(std::move(*f));
    fill = [spec = spec, file = file](const shard_index& idx, gpu::weight_shard& w) {
      return fill_from_checkpoint(spec, {1, 1}, idx, w.table(), w.host_data(), *file);
    };
  }
};

/// Largest difference relative to the reference's largest magnitude.
double relative_error(const host_tensor& ref, const host_tensor& got) {
  auto a = ref.to_floats();
  auto b = got.to_floats();
  REQUIRE(a.size() == b.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(a[i])));
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return diff / std::max(scale, 1e-6);
}

}  // namespace

TEST_CASE("the Llama family's f16, bf16 and f32 CUDA forward agree with the CPU f32 forward",
          "[cuda][llama]") {
  auto gpu_dev = test::cuda(0);
  auto cpu_dev = test::emulated(0);
  for (auto& [what, opts] : test::llama_variants()) {
    SECTION(what) {
      tiny_folder folder{opts};
      const auto& spec = folder.spec;
      const auto& fill = folder.fill;
      single ref{spec, gpu::dtype::f32, cpu_dev, fill};
      auto expected = ref.run();
      for (auto type : {gpu::dtype::f16, gpu::dtype::bf16, gpu::dtype::f32}) {
        single m{spec, type, gpu_dev, fill};
        auto got = m.run();
        REQUIRE(got.size() == expected.size());
        // The bounds OPT's forward meets (opt_cuda_test.cpp): half precision stays within
        // 5% of the logits' range for bf16, 1% for f16, and f32 within 0.1%.
        double bound = type == gpu::dtype::bf16 ? 0.05 : type == gpu::dtype::f16 ? 0.01 : 1e-3;
        for (size_t k = 0; k < got.size(); ++k) {
          auto e = relative_error(expected[k], got[k]);
          INFO(what << " " << gpu::to_string(type) << " step " << k << ": " << e);
          CHECK(e <= bound);
        }
        WARN(what << " " << gpu::to_string(type) << " vs CPU f32: last step "
                  << relative_error(expected.back(), got.back()));
      }
    }
  }
}

TEST_CASE("the fused residual-add, RMSNorm and rotary kernels equal libtorch's ops on a GPU",
          "[cuda][llama][norms][rope]") {
  // engine/cuda/norms.cu and rope.cu against the same stage computed by ops
  // (compute_options), on the same GPU, in every dtype, for every variant (o_proj biases,
  // q/k norms, rope scalings).
  auto gpu_dev = test::cuda(0);
  for (auto& [what, opts] : test::llama_variants()) {
    tiny_folder folder{opts};
    const auto& spec = folder.spec;
    const auto& fill = folder.fill;
    for (auto type : {gpu::dtype::f16, gpu::dtype::bf16, gpu::dtype::f32}) {
      single fused{spec, type, gpu_dev, fill};
      single plain{spec, type, gpu_dev, fill, compute_options{false, false}};
      auto a = fused.run();
      auto b = plain.run();
      REQUIRE(a.size() == b.size());
      // The kernels ran (not the ops' fallback): two norms and a rotation a layer, at least.
      CHECK(fused.stage->fused_calls() >= 3 * static_cast<uint64_t>(spec.layers));
      CHECK(plain.stage->fused_calls() == 0);
      // The kernel's sum of squares runs in another order than torch's reduction, and its
      // rsqrt, cos and sin are CUDA's: an element may round to the neighbouring
      // half-precision value.
      double bound = type == gpu::dtype::f32 ? 1e-5 : type == gpu::dtype::f16 ? 5e-3 : 3e-2;
      for (size_t k = 0; k < a.size(); ++k) {
        auto e = relative_error(b[k], a[k]);
        INFO(what << " " << gpu::to_string(type) << " step " << k << ": " << e);
        CHECK(e <= bound);
      }
    }
  }
}

TEST_CASE("a gpu-let's forward on its green context equals the whole GPU's forward",
          "[cuda][gpulets]") {
  auto dev = test::cuda(0);
  REQUIRE_FALSE(dev->check_gpulets());
  auto spec = *find_spec("opt-125m");
  filler fill = [&](const shard_index& idx, gpu::weight_shard& w) {
    return fill_seeded(spec, {1, 1}, idx, w.table(), w.host_data(), 7);
  };
  for (auto type : {gpu::dtype::f32, gpu::dtype::f16}) {
    single m{spec, type, dev, fill};
    REQUIRE_FALSE(use_compute_stream(*dev, nullptr));
    auto whole = m.run();
    for (auto [partition, lane] : std::vector<std::pair<std::vector<int32_t>, size_t>>{
             {{50, 50}, 0}, {{50, 50}, 1}, {{30, 70}, 1}}) {
      auto stream = dev->gpulet_stream(partition, lane);
      INFO((stream ? std::string{} : render(stream.error())));
      REQUIRE(stream);
      REQUIRE(*stream != nullptr);
      REQUIRE_FALSE(use_compute_stream(*dev, *stream));
      auto part = m.run();
      REQUIRE_FALSE(use_compute_stream(*dev, nullptr));
      // Fewer SMs may choose other kernels (split-K) and sum in another order: equal
      // within rounding, not bit for bit.
      double bound = type == gpu::dtype::f32 ? 1e-4 : 5e-3;
      for (size_t k = 0; k < part.size(); ++k) {
        auto e = relative_error(whole[k], part[k]);
        INFO(gpu::to_string(type) << " lane " << lane << " of " << partition[0] << "/"
                                  << partition[1] << ", step " << k << ": " << e);
        CHECK(e <= bound);
      }
    }
  }
}
