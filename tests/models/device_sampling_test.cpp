// Sampling where the logits lie (engine/torch/device_sampling.hpp) against the host sampler
// (models/sampling.cpp): the same seeds give the same tokens, drawn from random rows with
// ties and -inf, and through a pipeline of runners whose last stage draws on its device.
#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "engine/generate.hpp"
#include "engine/runner.hpp"
#include "engine/torch/decoder_backend.hpp"
#include "models/decoder_spec.hpp"
#include "models/sampling.hpp"
#include "tests/support/devices.hpp"
#include "tests/support/sharded_model.hpp"

using namespace computron;

namespace {

/// Rows of logits [rows, vocab] with what a model gives now and then: equal logits (the
/// order among them decides) and -inf (suppressed or ruled out). No NaN: the host's sort
/// has no defined order for it (device_sampling.hpp).
std::vector<float> random_rows(std::mt19937_64& rng, int64_t rows, int64_t vocab) {
  std::normal_distribution<float> normal(0, 2.5f);
  std::uniform_int_distribution<int64_t> id(0, vocab - 1);
  std::vector<float> out(static_cast<size_t>(rows * vocab));
  for (auto& x : out) x = normal(rng);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out.data() + r * vocab;
    // A tie at the top and a run of equal values in the middle.
    auto best = *std::max_element(row, row + vocab);
    row[id(rng)] = best;
    auto mid = row[id(rng)];
    for (int i = 0; i < 5; ++i) row[id(rng)] = mid;
    for (int i = 0; i < 3; ++i) row[id(rng)] = -std::numeric_limits<float>::infinity();
  }
  return out;
}

/// Draws on `device` from random rows against the host sampler, over every combination of
/// temperature (greedy too), top_k, top_p and min_p, twelve steps each with its own seed.
void draws_match_host(int cuda_ordinal) {
  const int64_t vocab = 97;
  std::vector<models::sampling_params> settings;
  for (double t : {0.0, 0.5, 1.0, 1.7})
    for (int64_t k : {0, 1, 5, 50})
      for (double p : {1.0, 0.9, 0.3})
        for (double mp : {0.0, 0.05, 0.4}) {
          models::sampling_params s;
          s.temperature = t;
          s.top_k = k;
          s.top_p = p;
          s.min_p = mp;
          s.seed = settings.size() * 7919 + 1;
          settings.push_back(s);
        }
  const auto rows = static_cast<int64_t>(settings.size());
  std::vector<models::sampler> host, device;
  for (auto& s : settings) {
    host.emplace_back(s);
    device.emplace_back(s);
  }
  std::mt19937_64 rng{5};
  int64_t drawn = 0, differ = 0;
  for (int step = 0; step < 12; ++step) {
    auto logits = random_rows(rng, rows, vocab);
    std::vector<models::device_draw> draws;
    for (auto& d : device) {
      auto next = d.next_device_draw();
      REQUIRE(next);
      // Asked again before the draw: the same number, not the next one.
      CHECK(d.next_device_draw()->uniform == next->uniform);
      draws.push_back(*next);
    }
    auto before = logits;
    auto picked = models::draw_tokens(logits, rows, vocab, draws, cuda_ordinal);
    INFO((picked ? std::string{} : render(picked.error())));
    REQUIRE(picked);
    REQUIRE(picked->size() == static_cast<size_t>(rows));
    CHECK(std::memcmp(before.data(), logits.data(), logits.size() * sizeof(float)) == 0);
    for (int64_t r = 0; r < rows; ++r) {
      auto want = host[static_cast<size_t>(r)].next(logits.data() + r * vocab, vocab);
      float one = (*picked)[static_cast<size_t>(r)].first;
      auto got = (*picked)[static_cast<size_t>(r)].second;
      // The host sampler draws the one candidate again, with the number the device used.
      CHECK(device[static_cast<size_t>(r)].next(&one, 1) == 0);
      ++drawn;
      if (got != want) {
        ++differ;
        INFO("row " << r << " step " << step << " t " << settings[r].temperature << " k "
                    << settings[r].top_k << " p " << settings[r].top_p << " min_p "
                    << settings[r].min_p);
        CHECK(got == want);
      }
    }
  }
  CHECK(drawn == rows * 12);
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("a draw on the device picks the host sampler's token with the same seed",
          "[models][sampling][device_sampling]") {
  draws_match_host(-1);
}

// The same on a GPU: its sums run in parallel, in another order than the host's, which
// could move a number that lands within a rounding error of a boundary; over these 1,728
// draws none does.
TEST_CASE("a draw on a GPU picks the host sampler's token with the same seed",
          "[cuda][device_sampling]") {
  auto gpu_dev = test::cuda(0);
  REQUIRE(gpu_dev);
  draws_match_host(gpu_dev->info().ordinal);
}

TEST_CASE("rows of a large vocabulary are drawn in groups, each with its own number",
          "[models][sampling][device_sampling]") {
  // 2^20 ids: two rows a group (device_sampling.cpp), so five rows make three groups.
  const int64_t vocab = int64_t{1} << 20, rows = 5;
  std::mt19937_64 rng{9};
  auto logits = random_rows(rng, rows, vocab);
  std::vector<models::sampler> host, device;
  std::vector<models::device_draw> draws;
  for (int64_t r = 0; r < rows; ++r) {
    models::sampling_params p;
    p.temperature = r == 2 ? 0.0 : 1.0;
    p.top_p = 0.9;
    p.top_k = r == 4 ? 40 : 0;
    p.seed = 100 + static_cast<uint64_t>(r);
    host.emplace_back(p);
    device.emplace_back(p);
    draws.push_back(*device.back().next_device_draw());
  }
  auto picked = models::draw_tokens(logits, rows, vocab, draws);
  REQUIRE(picked);
  REQUIRE(picked->size() == static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    CHECK((*picked)[static_cast<size_t>(r)].second ==
          host[static_cast<size_t>(r)].next(logits.data() + r * vocab, vocab));
}

TEST_CASE("a row of -inf draws its first id on the device and uses no number",
          "[models][sampling][device_sampling]") {
  models::sampling_params s;
  s.temperature = 0.8;
  s.top_p = 0.5;
  s.seed = 3;
  models::sampler a(s), b(s);
  std::vector<float> dead(8, -std::numeric_limits<float>::infinity());
  auto d = b.next_device_draw();
  REQUIRE(d);
  auto picked = models::draw_tokens(dead, 1, 8, {*d});
  REQUIRE(picked);
  CHECK((*picked)[0].second == 0);
  CHECK(a.next(dead.data(), 8) == 0);
  float one = (*picked)[0].first;
  CHECK(b.next(&one, 1) == 0);
  // Neither used a number: the next real draw is the same for both.
  std::vector<float> live{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
  auto d2 = b.next_device_draw();
  REQUIRE(d2);
  CHECK(d2->uniform == d->uniform);
  CHECK(a.next(live.data(), 8) == b.next(live.data(), 8));
}

namespace {

/// Forwards to a backend and keeps the shape of what its last step returned.
class watched final : public engine::backend {
 public:
  explicit watched(std::unique_ptr<engine::backend> inner) : inner_(std::move(inner)) {}
  caf::expected<models::host_tensor> run(const engine::step_input& in,
                                         const std::vector<int32_t>& keep,
                                         const std::vector<std::vector<uint32_t>>& tables,
                                         const models::host_tensor* hidden,
                                         const std::vector<models::device_draw>* draws) override {
    auto out = inner_->run(in, keep, tables, hidden, draws);
    if (out) shapes.push_back(out->shape);
    return out;
  }
  void end_batch(uint64_t batch) override { inner_->end_batch(batch); }
  caf::error join_batch(uint64_t from, uint64_t into) override {
    return inner_->join_batch(from, into);
  }
  std::vector<std::vector<int64_t>> shapes;

 private:
  std::unique_ptr<engine::backend> inner_;
};

struct pipeline {
  test::sharded_model model;
  std::vector<std::vector<std::shared_ptr<engine::runner>>> runners;
  watched* sampling_rank = nullptr;
  watched* other_rank = nullptr;

  pipeline(const char* name, models::parallel_config par,
           engine::decoder_backend_options::sampling_on device_sampling)
      : model{*models::find_spec(name), gpu::dtype::f32, par,
              test::seeded_filler(*models::find_spec(name), 21)} {
    for (int s = 0; s < par.pp; ++s) {
      runners.emplace_back();
      for (int r = 0; r < par.tp; ++r) {
        auto i = static_cast<size_t>(s * par.tp + r);
        auto w = std::make_shared<watched>(
            engine::make_decoder_backend(std::move(model.stages[i]), {device_sampling}));
        bool last = s == par.pp - 1;
        if (last && r == 0) sampling_rank = w.get();
        if (last && r == 1) other_rank = w.get();
        runners.back().push_back(std::make_shared<engine::runner>(w, last, r == 0));
      }
    }
  }
};

}  // namespace

TEST_CASE("a pipeline whose last stage draws on its device gives the host's tokens",
          "[models][sampling][device_sampling]") {
  const std::vector<std::vector<int64_t>> prompts{{2, 100, 37, 5}, {2, 9}, {7, 7, 7, 7, 7, 8}};
  engine::row_sampling nucleus;
  nucleus.temperature = 0.9;
  nucleus.top_p = 0.8;
  nucleus.min_p = 0.02;
  nucleus.seed = 41;
  for (auto name : {"opt-tiny", "llama-tiny"})
    for (auto par : {models::parallel_config{1, 1}, models::parallel_config{2, 2}}) {
      INFO(name << " tp " << par.tp << " pp " << par.pp);
      using where = engine::decoder_backend_options::sampling_on;
      pipeline on{name, par, where::always}, off{name, par, where::never};
      // The default draws on GPUs only: on the CPU it gives whole rows, as `off` does.
      pipeline cpu_default{name, par, where::gpu};
      auto a = engine::generate(on.runners, prompts, 12, nucleus);
      auto b = engine::generate(off.runners, prompts, 12, nucleus);
      auto c = engine::generate(cpu_default.runners, prompts, 12, nucleus);
      REQUIRE(c);
      CHECK(*c == *b);
      for (auto& s : cpu_default.sampling_rank->shapes)
        CHECK(s == std::vector<int64_t>{3, on.model.spec.vocab});
      INFO((a ? std::string{} : render(a.error())) << (b ? std::string{} : render(b.error())));
      REQUIRE(a);
      REQUIRE(b);
      CHECK(*a == *b);
      // Every step of the sampling rank came back as one candidate per row; with device
      // sampling off, as whole rows of the vocabulary.
      REQUIRE(on.sampling_rank->shapes.size() == 12);
      for (auto& s : on.sampling_rank->shapes) CHECK(s == std::vector<int64_t>{3, 1, 2});
      for (auto& s : off.sampling_rank->shapes)
        CHECK(s == std::vector<int64_t>{3, on.model.spec.vocab});
      // The last stage's other rank joined the same collectives and brought nothing back.
      if (on.other_rank != nullptr)
        for (auto& s : on.other_rank->shapes) CHECK(s.empty());
    }
}
