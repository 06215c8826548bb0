#pragma once

// A decoder loaded shard by shard onto emulated devices, one stage per shard, for the
// forward tests of every family. Tensor-parallel ranks run in threads and meet through real
// Gloo on 127.0.0.1. Include from torch test binaries only (after Catch2).
#include <algorithm>
#include <cmath>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "engine/torch/gloo_collective.hpp"
#include "gpu/emulated_device.hpp"
#include "models/weights.hpp"

namespace computron::test {

inline bool same_bytes(const models::host_tensor& a, const models::host_tensor& b);
inline bool equal_results(const models::host_tensor& a, const models::host_tensor& b) {
  return same_bytes(a, b);
}
template <class T>
bool equal_results(const T& a, const T& b) {
  return a == b;
}

using namespace std::chrono_literals;
using models::decoder_spec;
using models::host_tensor;
using models::parallel_config;

/// Fills one shard's host copy (seeded values, or a checkpoint's slices).
using shard_filler = std::function<caf::error(const parallel_config&, const models::shard_index&,
                                              gpu::weight_shard&)>;

/// Seeded weights with `seed`.
inline shard_filler seeded_filler(const decoder_spec& spec, uint64_t seed) {
  return [spec, seed](const parallel_config& par, const models::shard_index& idx,
                      gpu::weight_shard& w) {
    return models::fill_seeded(spec, par, idx, w.table(), w.host_data(), seed);
  };
}

/// max |a - b| / max |b| of two equally long lists (infinite when their sizes differ, so
/// that a tolerance check fails).
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

inline gpu::device_ptr emulated_device(int ordinal, double gbps = 8.0) {
  gpu::emulated_device_options o;
  o.ordinal = ordinal;
  o.capacity_bytes = 64ull << 20;
  o.link_gbps = gbps;
  auto d = gpu::emulated_device::make(o);
  REQUIRE(d);
  return *d;
}

/// Every shard of a model, loaded onto its own emulated device, with one stage each.
struct sharded_model {
  decoder_spec spec;
  parallel_config par;
  std::vector<gpu::device_ptr> devices;                        // index: pp * tp + tp_rank
  std::vector<std::unique_ptr<gpu::weight_shard>> shards;      // same index
  std::vector<std::unique_ptr<gpu::collective>> groups;        // same index
  std::vector<std::unique_ptr<models::decoder_stage>> stages;  // same index

  sharded_model(decoder_spec s, gpu::dtype type, parallel_config p, const shard_filler& fill,
                bool load = true)
      : spec(std::move(s)), par(p) {
    for (int s = 0; s < par.pp; ++s)
      for (int r = 0; r < par.tp; ++r) {
        auto table = shard_layout(spec, type, par, {r, s});
        REQUIRE(table);
        devices.push_back(emulated_device(s * par.tp + r));
        auto shard = gpu::weight_shard::create(devices.back(), *table);
        REQUIRE(shard);
        auto filled = fill(par, {r, s}, **shard);
        INFO((filled ? render(filled) : std::string{}));
        REQUIRE_FALSE(filled);
        if (load) {
          REQUIRE_FALSE((*shard)->load({1ull << 20}));
          REQUIRE_FALSE((*shard)->wait_loaded(30s));
        }
        shards.push_back(std::move(*shard));
      }
    make_groups();
    for (int s = 0; s < par.pp; ++s)
      for (int r = 0; r < par.tp; ++r) {
        auto i = static_cast<size_t>(s * par.tp + r);
        auto st = models::decoder_stage::create(spec, par, {r, s}, *shards[i], *groups[i]);
        REQUIRE(st);
        stages.push_back(std::move(*st));
      }
  }

  /// One Gloo group per pipeline stage, all through one store on loopback.
  void make_groups() {
    groups.resize(static_cast<size_t>(par.tp * par.pp));
    if (par.tp == 1) {
      for (auto& g : groups) g = gpu::make_solo_collective();
      return;
    }
    // Ranks are threads here: an in-process store (c10d's TCP store hung or crashed the
    // binary now and then when several threads connected at once); Gloo's pairs still
    // meet over TCP on 127.0.0.1.
    auto store = models::local_gloo_store(30s);
    std::vector<std::future<caf::expected<std::unique_ptr<gpu::collective>>>> joins;
    for (int s = 0; s < par.pp; ++s)
      for (int r = 0; r < par.tp; ++r)
        joins.push_back(std::async(std::launch::async, [&, s, r] {
          return models::make_gloo_collective(store, "stage" + std::to_string(s), r, par.tp);
        }));
    // Collect every join before asserting: a REQUIRE that throws with futures pending
    // would block in their destructors.
    std::vector<caf::expected<std::unique_ptr<gpu::collective>>> joined;
    for (auto& j : joins) joined.push_back(j.get());
    for (size_t i = 0; i < joined.size(); ++i) {
      INFO((joined[i] ? std::string{"ok"} : render(joined[i].error())));
      REQUIRE(joined[i]);
      groups[i] = std::move(*joined[i]);
    }
  }

  std::vector<models::decoder_stage*> chain(int tp_rank) {
    std::vector<models::decoder_stage*> c;
    for (int s = 0; s < par.pp; ++s)
      c.push_back(stages[static_cast<size_t>(s * par.tp + tp_rank)].get());
    return c;
  }

  /// Runs `f(chain)` for every tp rank in its own thread (collectives block until all
  /// ranks arrive) and returns rank 0's result; the others must agree bitwise.
  template <class F>
  auto on_all_ranks(F f) {
    using result = decltype(f(chain(0)));
    std::vector<std::future<result>> runs;
    for (int r = 0; r < par.tp; ++r)
      runs.push_back(std::async(std::launch::async, [this, r, &f] { return f(chain(r)); }));
    std::vector<result> results;
    for (auto& run : runs) results.push_back(run.get());
    for (auto& r : results) REQUIRE(r);
    for (size_t r = 1; r < results.size(); ++r) CHECK(equal_results(*results[r], *results[0]));
    return std::move(*results[0]);
  }
};

/// Bitwise equality, for the checks that demand it.
inline bool same_bytes(const host_tensor& a, const host_tensor& b) {
  return a.type == b.type && a.shape == b.shape && a.bytes == b.bytes;
}

/// Greedy decoding's tokens and the logits each was chosen from.
struct greedy_run {
  std::vector<std::vector<int64_t>> tokens;             // per row
  std::vector<std::vector<std::vector<float>>> logits;  // per step, per row
};

inline bool operator==(const greedy_run& a, const greedy_run& b) {
  return a.tokens == b.tokens && a.logits == b.logits;
}

/// One step's logits [rows, vocab] into `out`, and each row's greedy token (the first
/// maximum) into `next` and `out`.
inline void take_greedy(const host_tensor& h, greedy_run& out, std::vector<int64_t>& next) {
  auto f = h.to_floats();
  auto vocab = h.shape.back();
  out.logits.emplace_back();
  for (size_t i = 0; i < next.size(); ++i) {
    const float* row = f.data() + static_cast<int64_t>(i) * vocab;
    out.logits.back().emplace_back(row, row + vocab);
    next[i] = std::max_element(row, row + vocab) - row;
    out.tokens[i].push_back(next[i]);
  }
}

/// One decode step of `next` through the chain: the last stage's output.
inline caf::expected<host_tensor> decode_chain(const std::vector<models::decoder_stage*>& chain,
                                               const std::vector<int64_t>& next,
                                               std::vector<models::kv_cache>& caches) {
  host_tensor h;
  for (size_t s = 0; s < chain.size(); ++s) {
    auto r = chain[s]->decode(next, s == 0 ? nullptr : &h, caches[s]);
    if (!r) return r;
    h = std::move(*r);
  }
  return h;
}

/// `steps` tokens of greedy decoding on every rank (a prefill, each prompt with its
/// LoRA adapter in `adapters` if any, then decode steps).
inline greedy_run run_greedy(sharded_model& m, const std::vector<std::vector<int64_t>>& prompts,
                             int steps, const std::vector<int64_t>& adapters = {}) {
  return m.on_all_ranks(
      [&](std::vector<models::decoder_stage*> chain) -> caf::expected<greedy_run> {
        greedy_run out;
        out.tokens.resize(prompts.size());
        std::vector<models::kv_cache> caches(chain.size());
        std::vector<int64_t> next(prompts.size());
        for (int step = 0; step < steps; ++step) {
          host_tensor h;
          if (step == 0) {
            for (size_t s = 0; s < chain.size(); ++s) {
              auto r =
                  chain[s]->prefill(prompts, s == 0 ? nullptr : &h, caches[s], {}, {}, adapters);
              if (!r) return std::move(r.error());
              h = std::move(*r);
            }
          } else {
            auto r = decode_chain(chain, next, caches);
            if (!r) return std::move(r.error());
            h = std::move(*r);
          }
          take_greedy(h, out, next);
        }
        return out;
      });
}

}  // namespace computron::test
