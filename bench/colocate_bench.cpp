#include "bench/colocate_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <ostream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "gpu/backends.hpp"
#include "gpu/collective.hpp"
#include "models/weights.hpp"

namespace computron::bench {

namespace {

using clock_type = std::chrono::steady_clock;

/// Untimed decode steps each run takes first (a thread's first kernels, cuBLAS handles).
constexpr int64_t warm_steps = 2;

double percentile(std::vector<double> xs, double p) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  auto k = static_cast<size_t>(std::ceil(p * static_cast<double>(xs.size())));
  return xs[std::min(xs.size() - 1, k > 0 ? k - 1 : 0)];
}

/// One model on the device.
struct member {
  std::unique_ptr<gpu::weight_shard> shard;
  std::unique_ptr<gpu::collective> group;
  std::unique_ptr<models::decoder_stage> stage;
  std::vector<std::vector<int64_t>> prompts;
};

/// Lets the runs of one way start their timed steps together.
struct start_gate {
  std::mutex mtx;
  std::condition_variable cv;
  int waiting = 0;
  int expected = 1;
  clock_type::time_point opened{};
  void arrive() {
    std::unique_lock<std::mutex> g{mtx};
    if (++waiting == expected) {
      opened = clock_type::now();
      cv.notify_all();
    } else {
      cv.wait(g, [&] { return waiting >= expected; });
    }
  }
};

/// A run's token times: when each timed step ended, after its start.
struct token_times {
  clock_type::time_point start{};
  std::vector<clock_type::time_point> ends;
  std::vector<double> gaps_ms() const {
    std::vector<double> out;
    auto last = start;
    for (auto& e : ends) {
      out.push_back(std::chrono::duration<double, std::milli>(e - last).count());
      last = e;
    }
    return out;
  }
};

/// Prefills `m` (on `stream`, this thread's from now on), warms up, waits at the gate,
/// then times `steps` decode steps.
caf::expected<token_times> decode_run(member& m, const gpu::device& dev, void* stream,
                                      int64_t steps, start_gate& gate) {
  // Arrives on every way out, so that a failed run never leaves its partner waiting.
  struct arrival {
    start_gate& g;
    bool done = false;
    void now() {
      if (!done) g.arrive();
      done = true;
    }
    ~arrival() { now(); }
  } at{gate};
  if (auto err = models::use_compute_stream(dev, stream)) return err;
  models::kv_cache cache;
  auto first = m.stage->prefill(m.prompts, nullptr, cache);
  if (!first) return std::move(first.error());
  std::vector<int64_t> next(m.prompts.size(), 5);
  for (int64_t k = 0; k < warm_steps; ++k)
    if (auto s = m.stage->decode(next, nullptr, cache); !s) return std::move(s.error());
  at.now();
  token_times t;
  t.start = clock_type::now();
  for (int64_t k = 0; k < steps; ++k) {
    auto s = m.stage->decode(next, nullptr, cache);
    if (!s) return std::move(s.error());
    t.ends.push_back(clock_type::now());
  }
  return t;
}

/// Both members at once, each on its own thread and stream.
caf::expected<std::pair<token_times, token_times>> side_by_side(std::vector<member>& ms,
                                                                const gpu::device& dev, void* s0,
                                                                void* s1, int64_t steps) {
  start_gate gate;
  gate.expected = 2;
  caf::expected<token_times> r0{token_times{}}, r1{token_times{}};
  std::thread other{[&] { r1 = decode_run(ms[1], dev, s1, steps, gate); }};
  r0 = decode_run(ms[0], dev, s0, steps, gate);
  other.join();
  if (!r0) return std::move(r0.error());
  if (!r1) return std::move(r1.error());
  return std::make_pair(std::move(*r0), std::move(*r1));
}

/// Each member's steps alone, one member after the other, on the given streams, ms.
struct alone_steps {
  double p50[2] = {0, 0};
  double p99[2] = {0, 0};
};

caf::expected<alone_steps> alone(std::vector<member>& ms, const gpu::device& dev, void* s0,
                                 void* s1, int64_t steps) {
  alone_steps out;
  void* streams[2] = {s0, s1};
  for (size_t i = 0; i < 2; ++i) {
    start_gate gate;
    auto r = decode_run(ms[i], dev, streams[i], steps, gate);
    if (!r) return std::move(r.error());
    out.p50[i] = percentile(r->gaps_ms(), 0.5);
    out.p99[i] = percentile(r->gaps_ms(), 0.99);
  }
  return out;
}

colocate_way way_of(std::string name, const token_times& a, const token_times& b, int64_t batch) {
  colocate_way w;
  w.name = std::move(name);
  const token_times* runs[2] = {&a, &b};
  auto first = std::min(a.start, b.start);
  auto last =
      std::max(a.ends.empty() ? a.start : a.ends.back(), b.ends.empty() ? b.start : b.ends.back());
  double wall = std::chrono::duration<double>(last - first).count();
  double tokens = static_cast<double>(batch) * static_cast<double>(a.ends.size() + b.ends.size());
  w.tokens_per_second = wall > 0 ? tokens / wall : 0;
  for (size_t i = 0; i < 2; ++i) {
    auto gaps = runs[i]->gaps_ms();
    w.p50_ms[i] = percentile(gaps, 0.5);
    w.p99_ms[i] = percentile(gaps, 0.99);
  }
  return w;
}

caf::expected<std::pair<int32_t, int32_t>> parse_split(const std::string& s) {
  int a = 0, b = 0;
  char slash = 0;
  if (std::sscanf(s.c_str(), "%d%c%d", &a, &slash, &b) != 3 || slash != '/' || a < 1 || b < 1 ||
      a + b > 100)
    return make_error(ec::invalid_request,
                      fmt::format("--splits: '{}' is not A/B percent with A + B <= 100", s));
  return std::make_pair(static_cast<int32_t>(a), static_cast<int32_t>(b));
}

}  // namespace

caf::expected<colocate_result> run_colocate_bench(const colocate_options& o) {
  auto spec = models::find_spec(o.model);
  if (!spec) return std::move(spec.error());
  auto type = gpu::parse_weight_dtype(o.dtype);
  if (!type) return std::move(type.error());
  if (o.batch < 1 || o.batch > 1024)
    return make_error(ec::invalid_request, "--batch must be 1..1024");
  if (o.steps < 1 || o.seq < 1 || o.seq + warm_steps + o.steps > spec->max_positions)
    return make_error(ec::invalid_request,
                      fmt::format("--seq plus --steps (at least 1 each) must fit {}'s {} positions",
                                  spec->name, spec->max_positions));
  if (o.threads < 0) return make_error(ec::invalid_request, "--threads must be >= 0");
  std::vector<std::pair<int32_t, int32_t>> splits;
  for (auto& s : o.splits) {
    auto p = parse_split(s);
    if (!p) return std::move(p.error());
    splits.push_back(*p);
  }
  auto table = models::shard_layout(*spec, *type, {1, 1}, {0, 0});
  if (!table) return std::move(table.error());
  int threads = o.threads > 0 ? o.threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  models::set_compute_threads(threads);

  gpu::device_options d;
  d.kind = o.device_kind;
  d.count = 1;
  d.emulated_capacity_bytes = 2 * table->total_bytes() + (64ull << 20);
  d.emulated_link_gbps = 16.0;
  auto devs = gpu::open_devices(d);
  if (!devs) return std::move(devs.error());
  auto& dev = *devs->front();
  std::vector<member> ms(2);
  std::mt19937_64 rng{o.seed};
  std::uniform_int_distribution<int64_t> tok{3, spec->vocab - 1};
  for (size_t i = 0; i < ms.size(); ++i) {
    auto& m = ms[i];
    auto shard = gpu::weight_shard::create(devs->front(), *table);
    if (!shard) return std::move(shard.error());
    m.shard = std::move(*shard);
    if (auto err = models::fill_seeded(*spec, {1, 1}, {0, 0}, m.shard->table(),
                                       m.shard->host_data(), o.seed + i))
      return err;
    if (auto err = m.shard->load()) return err;
    if (auto err = m.shard->wait_loaded(std::chrono::minutes{10})) return err;
    m.group = gpu::make_solo_collective();
    auto stage = models::decoder_stage::create(*spec, {1, 1}, {0, 0}, *m.shard, *m.group);
    if (!stage) return std::move(stage.error());
    m.stage = std::move(*stage);
    m.prompts.resize(static_cast<size_t>(o.batch));
    for (auto& p : m.prompts)
      for (int64_t k = 0; k < o.seq; ++k) p.push_back(tok(rng));
  }

  colocate_result r;
  r.model = spec->name;
  r.dtype = gpu::to_string(*type);
  r.device_kind = gpu::to_string(dev.info().kind);
  r.batch = o.batch;
  r.seq = o.seq;
  r.steps = o.steps;

  // Each alone on the whole device: the floor the others are read against.
  auto whole = alone(ms, dev, nullptr, nullptr, o.steps);
  if (!whole) return std::move(whole.error());
  colocate_way solo;
  solo.name = "alone";
  for (size_t i = 0; i < 2; ++i) {
    solo.p50_ms[i] = solo.alone_ms[i] = whole->p50[i];
    solo.p99_ms[i] = whole->p99[i];
  }
  // One model at a time: its batch per median step.
  solo.tokens_per_second = static_cast<double>(o.batch) * 1e3 / whole->p50[0];
  r.ways.push_back(solo);

  // Time sharing: one lane, the models' steps in turn.
  {
    if (auto err = models::use_compute_stream(dev, nullptr)) return err;
    token_times t[2];
    models::kv_cache caches[2];
    std::vector<int64_t> next(static_cast<size_t>(o.batch), 5);
    for (size_t i = 0; i < 2; ++i) {
      auto p = ms[i].stage->prefill(ms[i].prompts, nullptr, caches[i]);
      if (!p) return std::move(p.error());
    }
    t[0].start = t[1].start = clock_type::now();
    for (int64_t k = 0; k < o.steps; ++k)
      for (size_t i = 0; i < 2; ++i) {
        auto s = ms[i].stage->decode(next, nullptr, caches[i]);
        if (!s) return std::move(s.error());
        t[i].ends.push_back(clock_type::now());
      }
    r.ways.push_back(way_of("time-shared", t[0], t[1], o.batch));
  }

  // Two plain streams: every SM open to both, the hardware's own interleaving.
  {
    auto s0 = models::plain_compute_stream(dev);
    auto s1 = models::plain_compute_stream(dev);
    if (!s0) return std::move(s0.error());
    if (!s1) return std::move(s1.error());
    auto both = side_by_side(ms, dev, *s0, *s1, o.steps);
    if (!both) return std::move(both.error());
    r.ways.push_back(way_of("streams", both->first, both->second, o.batch));
  }

  // Gpu-lets: each model on its own share of the SMs, side by side.
  for (auto [a, b] : splits) {
    const std::vector<int32_t> partition{a, b};
    auto s0 = dev.gpulet_stream(partition, 0);
    if (!s0) return std::move(s0.error());
    auto s1 = dev.gpulet_stream(partition, 1);
    if (!s1) return std::move(s1.error());
    auto by_itself = alone(ms, dev, *s0, *s1, o.steps);
    if (!by_itself) return std::move(by_itself.error());
    auto both = side_by_side(ms, dev, *s0, *s1, o.steps);
    if (!both) return std::move(both.error());
    auto w = way_of(fmt::format("gpulets {}/{}", a, b), both->first, both->second, o.batch);
    w.alone_ms[0] = by_itself->p50[0];
    w.alone_ms[1] = by_itself->p50[1];
    for (size_t i = 0; i < 2; ++i)
      w.interference[i] = w.alone_ms[i] > 0 ? w.p50_ms[i] / w.alone_ms[i] : 0;
    r.ways.push_back(w);
  }
  if (auto err = models::use_compute_stream(dev, nullptr)) return err;
  return r;
}

std::string to_json(const colocate_result& r) {
  nlohmann::json ways = nlohmann::json::array();
  for (auto& w : r.ways)
    ways.push_back({{"name", w.name},
                    {"tokens_per_second", w.tokens_per_second},
                    {"p50_ms", {w.p50_ms[0], w.p50_ms[1]}},
                    {"p99_ms", {w.p99_ms[0], w.p99_ms[1]}},
                    {"alone_ms", {w.alone_ms[0], w.alone_ms[1]}},
                    {"interference", {w.interference[0], w.interference[1]}}});
  nlohmann::json j{{"model", r.model}, {"dtype", r.dtype}, {"device_kind", r.device_kind},
                   {"batch", r.batch}, {"seq", r.seq},     {"steps", r.steps},
                   {"ways", ways}};
  return j.dump();
}

void print_table(std::ostream& out, const colocate_result& r) {
  out << fmt::format("two {} {} models on one {} device, batch {}, {} prompt tokens, {} steps\n",
                     r.model, r.dtype, r.device_kind, r.batch, r.seq, r.steps);
  out << fmt::format("{:<14} {:>12} {:>18} {:>18} {:>16} {:>14}\n", "way", "tokens/s",
                     "p50 ms (a, b)", "p99 ms (a, b)", "alone ms (a, b)", "interference");
  for (auto& w : r.ways) {
    auto pair = [](const double* x) { return fmt::format("{:.2f}, {:.2f}", x[0], x[1]); };
    out << fmt::format("{:<14} {:>12.0f} {:>18} {:>18} {:>16} {:>14}\n", w.name,
                       w.tokens_per_second, pair(w.p50_ms), pair(w.p99_ms),
                       w.name.rfind("gpulets", 0) == 0 || w.name == "alone" ? pair(w.alone_ms) : "",
                       w.interference[0] > 0 ? pair(w.interference) : "");
  }
}

}  // namespace computron::bench
