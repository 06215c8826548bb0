#include "bench/runtime_bench.hpp"

#include <algorithm>
#include <atomic>
#include <thread>

#include <fmt/format.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/node.hpp"
#include "common/error.hpp"
#include "net/client/http_client.hpp"
#include "net/http/http_server.hpp"
#include "net/metrics.hpp"

namespace computron::bench {

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using namespace computron::actors;

double percentile(std::vector<double> xs, double p) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  return xs[std::min(xs.size() - 1,
                     static_cast<size_t>(p * static_cast<double>(xs.size() - 1) + 0.5))];
}

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

model_config toy(const std::string& name, int tp, std::vector<int32_t> devices,
                 uint64_t shard_bytes) {
  model_config m;
  m.name = name;
  m.kind = "toy";
  m.tp = tp;
  m.devices = std::move(devices);
  m.toy_shard_bytes = shard_bytes;
  return m;
}

caf::error add(caf::scoped_actor& self, const runtime& rt, const model_config& m) {
  caf::error err;
  self->request(rt.registry, caf::timespan{std::chrono::minutes(10)}, register_atom_v, m)
      .receive([](model_info&) {}, [&](caf::error& e) { err = e; });
  return err;
}

caf::expected<double> timed(caf::scoped_actor& self, const runtime& rt, bool load,
                            const std::string& model) {
  auto t0 = clock_type::now();
  caf::error err;
  auto h =
      load ? self->request(rt.manager, caf::timespan{std::chrono::minutes(10)}, load_atom_v, model)
           : self->request(rt.manager, caf::timespan{std::chrono::minutes(10)}, unload_atom_v,
                           model);
  std::move(h).receive([](model_info&) {}, [&](caf::error& e) { err = e; });
  if (err) return err;
  return since(t0);
}

/// Shuts the runtime down however its part ends (an early error return too: the actor
/// system's destructor would otherwise wait for the runtime's actors forever).
struct running {
  runtime rt;
  ~running() { rt.shutdown(); }
};

caf::expected<std::unique_ptr<running>> start(caf::actor_system& sys, const runtime_options& ro) {
  auto rt = start_runtime(sys, ro, torch_free_engines());
  if (!rt) return rt.error();
  auto r = std::make_unique<running>();  // no temporary whose destructor would shut it down
  r->rt = std::move(*rt);
  return r;
}

}  // namespace

caf::expected<runtime_bench_result> run_runtime_bench(const runtime_bench_options& o) {
  if (o.clients < 1 || !(o.seconds > 0) || o.latency_requests < 1 || o.swap_repeats < 1 ||
      o.swap_bytes < (4u << 20) || o.decode_tokens < 1 || o.decode_tokens > 4000 ||
      o.decode_rows < 1 || o.decode_rows > 64 || o.decode_repeats < 1)
    return make_error(ec::invalid_request,
                      "clients, seconds, requests and repeats must be positive; decode tokens "
                      "1-4000 (the toy's 4096 positions); decode rows 1-64; swap >= 4 MiB");
  runtime_bench_result res;
  res.caf_polling = o.caf_polling;
  system_config cfg{o.caf_polling ? idle_polling::caf : idle_polling::prompt};
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  // Parts 1 and 2: a resident toy model on one device; batches of up to 8.
  {
    runtime_options ro;
    ro.devices.kind = "emulated";
    ro.devices.count = 1;
    ro.devices.emulated_capacity_bytes = 64ull << 20;
    ro.manager.batching.max_batch_size = 8;
    ro.manager.batching.batch_window = 0ms;
    ro.frontend.max_outstanding_per_model = 100000;
    auto metrics = std::make_shared<net::metrics>();
    ro.obs = metrics;
    auto started = start(sys, ro);
    if (!started) return started.error();
    auto& rt = (*started)->rt;
    if (auto err = add(self, rt, toy("m", 1, {0}, 4096))) return err;
    if (auto t = timed(self, rt, true, "m"); !t) return t.error();
    // Added latency: one request at a time; what the actors add on top of the compute.
    std::vector<double> added;
    for (int i = 0; i < o.latency_requests; ++i) {
      infer_request r;
      r.model = "m";
      r.tokens = {1, 2, 3};
      auto t0 = clock_type::now();
      caf::error err;
      double compute_ms = 0;
      self->request(rt.frontend, 10s, infer_atom_v, r)
          .receive([&](infer_reply& rep) { compute_ms = rep.compute_ms; },
                   [&](caf::error& e) { err = e; });
      if (err) return err;
      added.push_back(since(t0) * 1e3 - compute_ms);
    }
    res.added_p50_ms = percentile(added, 0.5);
    res.added_p99_ms = percentile(added, 0.99);
    // Dispatch rate: closed loop, `clients` requests always in flight.
    std::atomic<uint64_t> done{0};
    std::atomic<uint64_t> batches{0};
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> rows_sum{0};
    std::vector<std::thread> ts;
    auto t0 = clock_type::now();
    for (int c = 0; c < o.clients; ++c)
      ts.emplace_back([&, c] {
        caf::scoped_actor me{sys};
        while (!stop) {
          infer_request r;
          r.model = "m";
          r.tokens = {c + 1, 2};
          me->request(rt.frontend, 10s, infer_atom_v, r)
              .receive(
                  [&](infer_reply& rep) {
                    ++done;
                    rows_sum += rep.batch_size;
                  },
                  [&](caf::error&) { stop = true; });
        }
      });
    std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
    stop = true;
    for (auto& t : ts) t.join();
    auto wall = since(t0);
    (void)batches;
    res.requests_per_s = static_cast<double>(done) / wall;
    // Each reply carries its batch's size: batches = sum over requests of 1/size.
    res.mean_batch_rows = done > 0 ? static_cast<double>(rows_sum) / static_cast<double>(done) : 0;
    res.batches_per_s = res.mean_batch_rows > 0 ? res.requests_per_s / res.mean_batch_rows : 0;

    // HTTP: the same model behind the real server, keep-alive connections.
    net::http_options ho;
    ho.port = 0;
    auto srv = net::http_server::start(sys, rt.frontend, metrics, nullptr, ho);
    if (!srv) return srv.error();
    std::atomic<uint64_t> http_done{0};
    std::vector<std::vector<double>> lat(static_cast<size_t>(o.clients));
    stop = false;
    ts.clear();
    t0 = clock_type::now();
    std::string body =
        R"({"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,3],"data":[1,2,3]}]})";
    for (int c = 0; c < o.clients; ++c)
      ts.emplace_back([&, c] {
        auto conn = net::http_client::connect("127.0.0.1", (*srv)->port(), 5s);
        if (!conn) return;
        while (!stop) {
          auto s = clock_type::now();
          auto r = (*conn)->request("POST", "/v2/models/m/infer", body, 10s);
          if (!r || r->status != 200) break;
          lat[static_cast<size_t>(c)].push_back(since(s) * 1e3);
          ++http_done;
        }
      });
    std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
    stop = true;
    for (auto& t : ts) t.join();
    res.http_requests_per_s = static_cast<double>(http_done) / since(t0);
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    res.http_p50_ms = percentile(all, 0.5);
    (*srv)->stop();
  }

  // Part 3: decode. What the actors add to each decode step of a running batch (the toy
  // computes nothing): batch 1, then `decode_rows` rows taken into one batch together (the
  // batch window waits for them), so that no row joins a batch already running.
  {
    runtime_options ro;
    ro.devices.kind = "emulated";
    ro.devices.count = 1;
    ro.devices.emulated_capacity_bytes = 64ull << 20;
    ro.manager.batching.max_batch_size = std::max(8, o.decode_rows);
    ro.manager.batching.batch_window = 50ms;
    auto started = start(sys, ro);
    if (!started) return started.error();
    auto& rt = (*started)->rt;
    if (auto err = add(self, rt, toy("m", 1, {0}, 4096))) return err;
    if (auto t = timed(self, rt, true, "m"); !t) return t.error();
    auto decode_once = [&](int rows) -> caf::expected<double> {
      std::vector<std::thread> gen;
      std::vector<caf::error> errs(static_cast<size_t>(rows));
      std::vector<double> per_step(static_cast<size_t>(rows));
      std::vector<uint32_t> together(static_cast<size_t>(rows));
      for (int c = 0; c < rows; ++c)
        gen.emplace_back([&, c] {
          caf::scoped_actor me{sys};
          infer_request r;
          r.model = "m";
          r.tokens = {c + 1, 2, 3};
          r.max_tokens = o.decode_tokens;
          me->request(rt.frontend, 60s, infer_atom_v, r)
              .receive(
                  [&](infer_reply& rep) {
                    per_step[static_cast<size_t>(c)] =
                        (rep.total_ms - rep.queue_ms - rep.compute_ms) /
                        static_cast<double>(std::max<size_t>(1, rep.tokens.size()));
                    together[static_cast<size_t>(c)] = rep.batch_size;
                  },
                  [&](caf::error& e) { errs[static_cast<size_t>(c)] = e; });
        });
      for (auto& t : gen) t.join();
      for (auto& e : errs)
        if (e) return e;
      // Rows that joined a running batch would charge it steps they did not take.
      if (*std::min_element(together.begin(), together.end()) != static_cast<uint32_t>(rows))
        return make_error(ec::unavailable,
                          fmt::format("the decode part's {} rows did not run as one batch", rows));
      return percentile(per_step, 0.5);
    };
    // A loaded machine may start a row after the window closed: that round runs again.
    auto decode = [&](int rows) -> caf::expected<double> {
      caf::expected<double> r{0.0};
      for (int attempt = 0; attempt < 3; ++attempt) {
        r = decode_once(rows);
        if (r || !is(r.error(), ec::unavailable)) return r;
      }
      return r;
    };
    std::vector<double> one, many;
    for (int i = 0; i < o.decode_repeats; ++i) {
      auto a = decode(1);
      if (!a) return a.error();
      one.push_back(*a);
      auto b = decode(o.decode_rows);
      if (!b) return b.error();
      many.push_back(*b);
    }
    res.decode_host_ms_1 = percentile(one, 0.5);
    res.decode_host_ms_many = percentile(many, 0.5);
    res.decode_rows = o.decode_rows;
  }

  // Part 4: a swap through the actors: 4 shards on 4 links against 1 shard on 1 link.
  {
    runtime_options ro;
    ro.devices.kind = "emulated";
    ro.devices.count = 4;
    ro.devices.emulated_capacity_bytes = o.swap_bytes + (64ull << 20);
    ro.devices.emulated_link_gbps = o.link_gbps;
    auto started = start(sys, ro);
    if (!started) return started.error();
    auto& rt = (*started)->rt;
    if (auto err = add(self, rt, toy("four", 4, {0, 1, 2, 3}, o.swap_bytes / 4))) return err;
    if (auto err = add(self, rt, toy("one", 1, {0}, o.swap_bytes))) return err;
    std::vector<double> four, one;
    for (int i = 0; i < o.swap_repeats + 1; ++i)
      for (auto [name, out] : {std::pair{"four", &four}, std::pair{"one", &one}}) {
        auto t = timed(self, rt, true, name);
        if (!t) return t.error();
        if (i > 0) out->push_back(*t);  // the first round faults the memory in
        if (auto u = timed(self, rt, false, name); !u) return u.error();
      }
    res.load_4_shards_s = percentile(four, 0.5);
    res.load_1_shard_s = percentile(one, 0.5);
    res.swap_speedup = res.load_4_shards_s > 0 ? res.load_1_shard_s / res.load_4_shards_s : 0;
  }
  return res;
}

std::string to_json(const runtime_bench_result& r) {
  return nlohmann::json{{"batches_per_s", r.batches_per_s},
                        {"requests_per_s", r.requests_per_s},
                        {"mean_batch_rows", r.mean_batch_rows},
                        {"added_latency_p50_ms", r.added_p50_ms},
                        {"added_latency_p99_ms", r.added_p99_ms},
                        {"decode_host_ms_per_step_batch_1", r.decode_host_ms_1},
                        {"decode_host_ms_per_step_batch_n", r.decode_host_ms_many},
                        {"decode_rows", r.decode_rows},
                        {"http_requests_per_s", r.http_requests_per_s},
                        {"http_p50_ms", r.http_p50_ms},
                        {"load_4_shards_s", r.load_4_shards_s},
                        {"load_1_shard_s", r.load_1_shard_s},
                        {"swap_speedup", r.swap_speedup},
                        {"idle_polling", r.caf_polling ? "caf" : "prompt"},
                        {"emulated", true}}
      .dump();
}

std::string to_table(const runtime_bench_result& r) {
  return fmt::format(
      "actor path (toy model, emulated device, {} idle polling)\n"
      "  dispatch         {:.0f} batches/s, {:.0f} requests/s (mean batch {:.2f} rows)\n"
      "  added latency    p50 {:.3f} ms, p99 {:.3f} ms (round trip minus compute)\n"
      "  decode step      {:.3f} ms host time at batch 1, {:.3f} ms at batch {}\n"
      "http (keep-alive)  {:.0f} requests/s, p50 {:.2f} ms\n"
      "swap via actors    4 shards {:.3f} s, 1 shard {:.3f} s: {:.2f}x\n",
      r.caf_polling ? "CAF's" : "prompt", r.batches_per_s, r.requests_per_s, r.mean_batch_rows,
      r.added_p50_ms, r.added_p99_ms, r.decode_host_ms_1, r.decode_host_ms_many, r.decode_rows,
      r.http_requests_per_s, r.http_p50_ms, r.load_4_shards_s, r.load_1_shard_s, r.swap_speedup);
}

}  // namespace computron::bench
