#include "bench/forward_bench.hpp"

#include <algorithm>
#include <chrono>
#include <ostream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "gpu/backends.hpp"
#include "gpu/collective.hpp"
#include "models/sampling.hpp"
#include "models/weights.hpp"

namespace computron::bench {

namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

}  // namespace

caf::expected<forward_bench_result> run_forward_bench(const forward_bench_options& o) {
  auto spec = models::find_spec(o.model);
  if (!spec) return std::move(spec.error());
  auto type = gpu::parse_weight_dtype(o.dtype);
  if (!type) return std::move(type.error());
  if (o.batch < 1 || o.batch > 1024)
    return make_error(ec::invalid_request, "--batch must be 1..1024");
  // The counters' step (below) decodes once more after the timed ones.
  if (o.seq < 1 || o.seq + o.decode_tokens + 1 > spec->max_positions)
    return make_error(ec::invalid_request,
                      fmt::format("--seq plus --decode-tokens plus the one step the counters "
                                  "take must fit {}'s {} positions",
                                  spec->name, spec->max_positions));
  if (o.sampling != "none" && o.sampling != "host" && o.sampling != "device")
    return make_error(ec::invalid_request, "--sampling is none, host or device, not " + o.sampling);
  if (o.decode_tokens < 0 || o.repeats < 1 || o.threads < 0)
    return make_error(ec::invalid_request, "--decode-tokens >= 0, --repeats >= 1, --threads >= 0");
  auto table = models::shard_layout(*spec, *type, {1, 1}, {0, 0});
  if (!table) return std::move(table.error());
  int threads = o.threads > 0 ? o.threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  models::set_compute_threads(threads);

  gpu::device_options d;
  d.kind = o.device_kind;
  d.count = 1;
  d.emulated_capacity_bytes = table->total_bytes() + (64ull << 20);
  d.emulated_link_gbps = 16.0;
  auto devs = gpu::open_devices(d);
  if (!devs) return std::move(devs.error());
  auto shard = gpu::weight_shard::create(devs->front(), *table);
  if (!shard) return std::move(shard.error());
  if (auto err = models::fill_seeded(*spec, {1, 1}, {0, 0}, (*shard)->table(),
                                     (*shard)->host_data(), o.seed))
    return err;
  forward_bench_result r;
  r.model = spec->name;
  r.dtype = gpu::to_string(*type);
  r.device_kind = gpu::to_string(devs->front()->info().kind);
  r.sampling = o.sampling;
  r.fused = o.fused;
  r.batch = o.batch;
  r.seq = o.seq;
  r.threads = threads;
  r.weight_bytes = table->total_bytes();
  auto t0 = clock_type::now();
  if (auto err = (*shard)->load()) return err;
  if (auto err = (*shard)->wait_loaded(std::chrono::minutes{10})) return err;
  r.load_seconds = since(t0);

  auto solo = gpu::make_solo_collective();
  models::compute_options compute;
  compute.fused_norms = compute.fused_rope = o.fused;
  const bool on_cuda = devs->front()->info().kind == gpu::device_kind::cuda;
  compute.graph_max_batch = o.graphs >= 0 ? o.graphs : on_cuda ? 32 : 0;
  auto stage = models::decoder_stage::create(*spec, {1, 1}, {0, 0}, **shard, *solo, {}, compute);
  if (!stage) return std::move(stage.error());
  if (auto err = (*stage)->capture_graphs()) return err;
  // Zero-copy: what the forward reads is the weight store's device copy itself.
  auto base = (*shard)->device_data();
  r.zero_copy = true;
  for (auto& e : (*shard)->table().entries()) {
    auto addr = (*stage)->parameter_address(e.name);
    if (!addr || *addr != *base + e.offset_bytes) r.zero_copy = false;
  }

  std::mt19937_64 rng{o.seed};
  std::uniform_int_distribution<int64_t> tok{3, spec->vocab - 1};
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(o.batch));
  for (auto& p : prompts)
    for (int64_t i = 0; i < o.seq; ++i) p.push_back(tok(rng));
  std::vector<int64_t> next(static_cast<size_t>(o.batch), 5);
  // One decode step as the sampling mode runs it, next tokens included.
  std::vector<models::sampler> samplers;
  auto start_rows = [&] {
    next.assign(static_cast<size_t>(o.batch), 5);  // every round runs the same steps
    samplers.clear();
    for (int64_t r = 0; r < o.batch; ++r)
      samplers.emplace_back(
          models::sampling_params{0.8, 0, 0.95, o.seed + static_cast<uint64_t>(r)});
  };
  auto decode_step = [&](models::kv_cache& cache) -> caf::error {
    if (o.sampling == "none") {
      auto step = (*stage)->decode(next, nullptr, cache);
      return step ? caf::error{} : std::move(step.error());
    }
    std::vector<models::device_draw> draws;
    models::head_output head;
    if (o.sampling == "device") {
      for (auto& s : samplers) draws.push_back(*s.next_device_draw());
      head = models::head_output{0, true, &draws};
    }
    auto step = (*stage)->decode(next, nullptr, cache, head);
    if (!step) return std::move(step.error());
    auto* data = reinterpret_cast<const float*>(step->bytes.data());
    const auto width = step->shape.back() == 2 && step->shape.size() == 3 ? 2 : step->shape[1];
    for (size_t r = 0; r < samplers.size(); ++r) {
      const float* row = data + static_cast<int64_t>(r) * width;
      next[r] = width == 2 ? static_cast<int64_t>(row[1]) : samplers[r].next(row, width);
      if (width == 2) samplers[r].next(row, 1);  // the same number the device used
    }
    return {};
  };
  std::vector<double> prefills, decodes;
  for (int i = 0; i <= o.repeats; ++i) {  // round 0 warms up
    models::kv_cache cache;
    start_rows();
    auto p0 = clock_type::now();
    auto out = (*stage)->prefill(prompts, nullptr, cache);
    if (!out) return std::move(out.error());
    auto pt = since(p0);
    std::vector<double> steps;
    for (int64_t k = 0; k < o.decode_tokens; ++k) {
      auto d0 = clock_type::now();
      if (auto err = decode_step(cache)) return err;
      steps.push_back(since(d0));
    }
    if (i == 0) continue;
    prefills.push_back(pt);
    if (!steps.empty()) decodes.push_back(median(steps));
  }
  // One more step each for the counters and the profile, on a cache as long as the timed
  // steps left it (the prompt plus the decode tokens).
  {
    models::kv_cache cache;
    auto out = (*stage)->prefill(prompts, nullptr, cache);
    if (!out) return std::move(out.error());
    start_rows();
    for (int64_t k = 0; k < o.decode_tokens; ++k)
      if (auto err = decode_step(cache)) return err;
    int cuda =
        devs->front()->info().kind == gpu::device_kind::cuda ? devs->front()->info().ordinal : -1;
    auto one_step = [&]() -> caf::error { return decode_step(cache); };
    auto counts = count_step(cuda, one_step);
    if (!counts) return std::move(counts.error());
    r.decode_alloc_bytes_per_step = counts->alloc_bytes;
    r.decode_ops_per_step = counts->ops;
    r.decode_ops_per_layer = static_cast<double>(counts->ops) / static_cast<double>(spec->layers);
    if (o.profile) {
      auto p = profile_step(cuda, one_step);
      if (!p) return std::move(p.error());
      if (p->rows.size() > static_cast<size_t>(std::max(0, o.profile_rows)))
        p->rows.resize(static_cast<size_t>(std::max(0, o.profile_rows)));
      r.decode_profile = std::move(*p);
    }
  }
  auto graphs = (*stage)->graphs();
  r.graph_max_batch = graphs.buckets.empty() ? 0 : graphs.buckets.back();
  r.graph_replays = graphs.replays;
  r.graphs_off_because = graphs.off_because;
  r.prefill_seconds = median(prefills);
  r.prefill_tokens_per_second = static_cast<double>(o.batch * o.seq) / r.prefill_seconds;
  r.decode_seconds_per_token = decodes.empty() ? 0 : median(decodes);
  return r;
}

std::string to_json(const forward_bench_result& r) {
  nlohmann::json j{{"model", r.model},
                   {"dtype", r.dtype},
                   {"device_kind", r.device_kind},
                   {"sampling", r.sampling},
                   {"fused", r.fused},
                   {"graph_max_batch", r.graph_max_batch},
                   {"graph_replays", r.graph_replays},
                   {"graphs_off_because", r.graphs_off_because},
                   {"batch", r.batch},
                   {"seq", r.seq},
                   {"threads", r.threads},
                   {"weight_bytes", r.weight_bytes},
                   {"load_seconds", r.load_seconds},
                   {"prefill_seconds", r.prefill_seconds},
                   {"prefill_tokens_per_second", r.prefill_tokens_per_second},
                   {"decode_seconds_per_token", r.decode_seconds_per_token},
                   {"zero_copy", r.zero_copy},
                   {"decode_alloc_bytes_per_step", r.decode_alloc_bytes_per_step},
                   {"decode_ops_per_step", r.decode_ops_per_step},
                   {"decode_ops_per_layer", r.decode_ops_per_layer}};
  if (r.decode_profile) {
    auto rows = nlohmann::json::array();
    for (const auto& row : r.decode_profile->rows)
      rows.push_back(
          {{"name", row.name}, {"count", row.count}, {"micros", row.micros}, {"share", row.share}});
    j["decode_profile"] = {{"what", r.decode_profile->what},
                           {"busy_micros", r.decode_profile->busy_micros},
                           {"wall_micros", r.decode_profile->wall_micros},
                           {"rows", rows}};
  }
  return j.dump();
}

void print_table(std::ostream& out, const forward_bench_result& r) {
  out << fmt::format("{} {} on {} ({} threads), {:.0f} MiB of weights loaded in {:.3f} s\n",
                     r.model, r.dtype, r.device_kind, r.threads, r.weight_bytes / 1048576.0,
                     r.load_seconds);
  out << fmt::format("prefill  batch {} x {} tokens: {:.4f} s ({:.0f} tokens/s)\n", r.batch, r.seq,
                     r.prefill_seconds, r.prefill_tokens_per_second);
  out << fmt::format("decode   {:.4f} s per step ({} new tokens each; sampling: {}; fused: {})\n",
                     r.decode_seconds_per_token, r.batch, r.sampling, r.fused ? "on" : "off");
  if (r.graph_max_batch > 0)
    out << fmt::format("graphs   buckets up to {} rows, {} decode steps replayed one\n",
                       r.graph_max_batch, r.graph_replays);
  else if (!r.graphs_off_because.empty())
    out << fmt::format("graphs   off: {}\n", r.graphs_off_because);
  out << fmt::format("per step {} bytes allocated, {} ops ({:.1f} per layer)\n",
                     r.decode_alloc_bytes_per_step, r.decode_ops_per_step, r.decode_ops_per_layer);
  if (r.decode_profile) {
    const auto& p = *r.decode_profile;
    out << fmt::format("profile of one decode step ({}): {:.1f} us busy in {:.1f} us\n", p.what,
                       p.busy_micros, p.wall_micros);
    for (const auto& row : p.rows)
      out << fmt::format("  {:>6.1f}%  {:>9.1f} us  {:>5} x  {}\n", row.share * 100, row.micros,
                         row.count, row.name.substr(0, 110));
  }
  out << fmt::format("weights  {}\n", r.zero_copy
                                          ? "read in place from the weight store (zero-copy)"
                                          : "COPIED: parameters are not views of the store");
}

}  // namespace computron::bench
