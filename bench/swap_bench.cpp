#include "bench/swap_bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ostream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/random.hpp"
#include "gpu/backends.hpp"
#include "gpu/weight_store.hpp"
#include "models/decoder_spec.hpp"

namespace computron::bench {

namespace {

using clock_type = std::chrono::steady_clock;
using gpu::weight_shard;

constexpr auto load_timeout = std::chrono::minutes{10};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0 : xs[xs.size() / 2];
}

uint64_t available_host_bytes() {
  auto pages = ::sysconf(_SC_AVPHYS_PAGES);
  auto page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

/// Shards of one model, one per device (`sizes[i]` bytes on device i), host copies written.
caf::expected<std::vector<std::unique_ptr<weight_shard>>> make_shards(
    const std::vector<gpu::device_ptr>& devs, const std::vector<uint64_t>& sizes, uint64_t seed) {
  std::vector<std::unique_ptr<weight_shard>> shards;
  for (size_t i = 0; i < devs.size(); ++i) {
    gpu::tensor_table table;
    if (auto err = table.add("weights", gpu::dtype::u8, {static_cast<int64_t>(sizes[i])}))
      return err;
    auto s = weight_shard::create(devs[i], std::move(table));
    if (!s) return std::move(s.error());
    shards.push_back(std::move(*s));
  }
  std::vector<std::thread> fillers;
  for (size_t i = 0; i < shards.size(); ++i)
    fillers.emplace_back([&, i] { fill_random_bytes(shards[i]->host_data(), sizes[i], seed + i); });
  for (auto& t : fillers) t.join();
  return shards;
}

struct round_result {
  double load_seconds = 0;
  /// The slowest shard's load() call alone: allocation and queueing the chunks, before
  /// any waiting (where a load loses time besides the copy itself).
  double submit_ms = 0;
  std::vector<double> per_shard_seconds;
  double evict_ms = 0;
};

/// One model-parallel swap: every shard loads on its own thread (as every shard worker
/// does on its own GPU), the join is the slowest; then every shard is evicted.
caf::expected<round_result> swap_round(std::vector<std::unique_ptr<weight_shard>>& shards,
                                       uint64_t chunk_bytes, bool keep_resident) {
  round_result r;
  r.per_shard_seconds.resize(shards.size());
  std::vector<caf::error> errors(shards.size());
  std::vector<double> submit(shards.size());
  std::vector<std::thread> loaders;
  auto t0 = clock_type::now();
  for (size_t i = 0; i < shards.size(); ++i) {
    loaders.emplace_back([&, i] {
      auto s0 = clock_type::now();
      auto err = shards[i]->load(gpu::load_options{chunk_bytes});
      submit[i] = seconds_since(s0) * 1e3;
      if (!err) err = shards[i]->wait_loaded(load_timeout);
      r.per_shard_seconds[i] = seconds_since(t0);
      errors[i] = std::move(err);
    });
  }
  for (auto& t : loaders) t.join();
  r.load_seconds = seconds_since(t0);
  r.submit_ms = *std::max_element(submit.begin(), submit.end());
  for (auto& err : errors)
    if (err) return err;
  if (keep_resident) return r;
  for (auto& s : shards) {
    auto e0 = clock_type::now();
    if (auto err = s->evict()) return err;
    r.evict_ms = std::max(r.evict_ms, seconds_since(e0) * 1e3);
  }
  return r;
}

/// Compares the first and last few MiB of every shard's device copy with its host copy,
/// read back through the device (so a CUDA run checks real GPU memory).
caf::error verify_shards(std::vector<std::unique_ptr<weight_shard>>& shards) {
  for (auto& s : shards) {
    auto n = std::min<uint64_t>(4ull << 20, s->size_bytes());
    std::vector<std::byte> back(n);
    for (uint64_t off : {uint64_t{0}, s->size_bytes() - n}) {
      std::memset(back.data(), 0xA5, n);
      if (auto err = s->read_back(off, back.data(), n)) return err;
      if (std::memcmp(back.data(), s->host_data() + off, n) != 0)
        return make_error(ec::device_error,
                          fmt::format("verification failed on {}: device bytes at offset {} "
                                      "differ from the host copy",
                                      s->dev().info().name, off));
    }
  }
  return {};
}

caf::expected<std::vector<gpu::device_ptr>> open(const swap_bench_options& o, int count,
                                                 uint64_t capacity) {
  gpu::device_options d;
  d.kind = o.device_kind;
  d.count = count;
  // Whole pages of the largest page a device takes: a shard maps its bytes rounded up.
  d.emulated_capacity_bytes = gpu::align_up(capacity, gpu::device::default_page_bytes);
  d.emulated_link_gbps = o.link_gbps;
  return gpu::open_devices(d);
}

/// Times rounds on these devices: warm-up, then `repeats` timed rounds; leaves the
/// shards resident after the last one when `keep` is set.
struct measured {
  std::vector<double> loads;
  std::vector<std::vector<double>> per_shard;
  std::vector<double> evicts;
  std::vector<double> submits;
};

caf::expected<measured> measure(std::vector<std::unique_ptr<weight_shard>>& shards,
                                const swap_bench_options& o, bool keep_last) {
  measured m;
  if (auto w = swap_round(shards, o.chunk_bytes, false); !w) return std::move(w.error());
  for (int i = 0; i < o.repeats; ++i) {
    bool last = i + 1 == o.repeats;
    auto r = swap_round(shards, o.chunk_bytes, keep_last && last);
    if (!r) return std::move(r.error());
    m.loads.push_back(r->load_seconds);
    m.submits.push_back(r->submit_ms);
    m.per_shard.push_back(r->per_shard_seconds);
    if (!(keep_last && last)) m.evicts.push_back(r->evict_ms);
  }
  return m;
}

/// Peak of one link for CUDA: one plain copy of the whole shard from the same pinned
/// buffer, no chunking (what cudaMemcpyAsync alone achieves on this machine).
caf::expected<double> single_copy_gbps(weight_shard& s, int repeats) {
  auto mem = s.dev().allocate(s.size_bytes());
  if (!mem) return std::move(mem.error());
  std::vector<double> secs;
  for (int i = 0; i <= repeats; ++i) {
    auto t0 = clock_type::now();
    auto ev = s.dev().copy_to_device_async(*mem, 0, s.host_data(), s.size_bytes());
    if (!ev) return std::move(ev.error());
    if (auto err = (*ev)->wait(load_timeout)) return err;
    if (i > 0) secs.push_back(seconds_since(t0));  // the first is a warm-up
  }
  return static_cast<double>(s.size_bytes()) / median(secs) / 1e9;
}

/// Per-device bytes of a catalogue model split tp x pp (device i: tp rank i % tp, stage
/// i / tp), divided by o.divide and rounded down to the copy alignment; `replicated`: of
/// the layout before vocabulary-parallel embeddings.
caf::expected<std::vector<uint64_t>> model_shard_sizes(const swap_bench_options& o,
                                                       bool replicated) {
  auto spec = models::find_spec(o.model);
  if (!spec) return std::move(spec.error());
  auto type = gpu::parse_weight_dtype(o.dtype);
  if (!type) return std::move(type.error());
  std::vector<uint64_t> sizes;
  for (int s = 0; s < o.pp; ++s)
    for (int r = 0; r < o.tp; ++r) {
      auto b = replicated ? models::replicated_vocab_shard_bytes(*spec, *type, {o.tp, o.pp}, {r, s})
                          : models::shard_bytes(*spec, *type, {o.tp, o.pp}, {r, s});
      if (!b) return std::move(b.error());
      if (*b / static_cast<uint64_t>(o.divide) < (1u << 20))
        return make_error(ec::invalid_request,
                          fmt::format("--divide {} leaves shard (tp rank {}, stage {}) of {} under "
                                      "1 MiB; divide by less",
                                      o.divide, r, s, o.model));
      sizes.push_back(*b / static_cast<uint64_t>(o.divide) / 256 * 256);
    }
  return sizes;
}

caf::error validate(const swap_bench_options& o) {
  auto bad = [](std::string what) { return make_error(ec::invalid_request, std::move(what)); };
  if (!o.model.empty()) {
    if (o.tp < 1 || o.pp < 1 || o.tp > 64 || o.pp > 64 || o.tp * o.pp > 64)
      return bad(fmt::format("--tp x --pp must be 1..64 devices, got {} x {}", o.tp, o.pp));
    if (o.devices != o.tp * o.pp)
      return bad(
          fmt::format("--model puts one shard on each device: --devices must be tp x pp "
                      "= {}, got {}",
                      o.tp * o.pp, o.devices));
    if (o.divide < 1 || o.divide > 1 << 20) return bad("--divide must be 1..1048576");
  }
  if (o.devices < 1 || o.devices > 64)
    return bad(fmt::format("--devices must be 1..64, got {}", o.devices));
  if (o.size_bytes < (1ull << 20)) return bad("--size-mb must be at least 1");
  if (o.chunk_bytes < 4096) return bad("--chunk-mb must be at least 4 KiB (0.004)");
  if (!(o.link_gbps > 0) || o.link_gbps > 1e4)
    return bad(fmt::format("--link-gbps must be in (0, 10000], got {}", o.link_gbps));
  if (o.repeats < 1 || o.repeats > 1000) return bad("--repeats must be 1..1000");
  if (o.size_bytes / static_cast<uint64_t>(o.devices) < gpu::tensor_table::alignment)
    return bad("the model is too small to split over that many devices");
  return {};
}

}  // namespace

caf::expected<swap_bench_result> run_swap_bench(const swap_bench_options& o) {
  if (auto err = validate(o)) return err;
  std::vector<uint64_t> sizes, before;
  if (o.model.empty()) {
    sizes.assign(static_cast<size_t>(o.devices),
                 o.size_bytes / static_cast<uint64_t>(o.devices) / 256 * 256);
  } else {
    auto a = model_shard_sizes(o, false);
    if (!a) return std::move(a.error());
    auto b = model_shard_sizes(o, true);
    if (!b) return std::move(b.error());
    sizes = std::move(*a);
    before = std::move(*b);
  }
  auto sum = [](const std::vector<uint64_t>& xs) {
    uint64_t t = 0;
    for (auto x : xs) t += x;
    return t;
  };
  auto total = sum(sizes);
  // The host copies need `total` bytes of host memory, and emulated devices hold their
  // "device memory" in host memory too (two copies at once). Refuse up front rather than
  // be killed half-way. Emulated is what "auto" means only where no GPU is.
  bool emulated =
      o.device_kind == "emulated" || (o.device_kind != "cuda" && gpu::cuda_device_count() == 0);
  auto largest = std::max(total, sum(before));
  auto need = (emulated ? 2 : 1) * largest + (256ull << 20);
  auto avail = available_host_bytes();
  if (avail > 0 && need > avail)
    return make_error(
        ec::out_of_host_memory,
        fmt::format("a {:.0f} MiB model needs about {:.0f} MiB of host memory "
                    "({}); {:.0f} MiB free{}",
                    largest / 1048576.0, need / 1048576.0,
                    emulated ? "host copies plus emulated device memory" : "its pinned host copies",
                    avail / 1048576.0, o.model.empty() ? "" : " (--divide shrinks every shard)"));

  swap_bench_result res;
  res.devices = o.devices;
  res.bytes = total;
  res.chunk_bytes = o.chunk_bytes;
  res.repeats = o.repeats;
  const auto capacity = *std::max_element(sizes.begin(), sizes.end());
  {
    auto devs = open(o, o.devices, capacity);
    if (!devs) return std::move(devs.error());
    auto kind = (*devs)[0]->info().kind;
    res.device_kind = gpu::to_string(kind);
    auto shards = make_shards(*devs, sizes, o.seed);
    if (!shards) return std::move(shards.error());
    res.host_pinned = (*shards)[0]->host_pinned();
    if (kind == gpu::device_kind::emulated) {
      res.link_gbps = o.link_gbps;
      res.link_source = "configured emulated link";
    } else {
      auto peak = single_copy_gbps(*(*shards)[0], o.repeats);
      if (!peak) return std::move(peak.error());
      res.link_gbps = *peak;
      res.link_source = "one plain cudaMemcpyAsync of the shard, same pinned buffer";
    }
    auto m = measure(*shards, o, o.verify);
    if (!m) return std::move(m.error());
    if (o.verify) {
      if (auto err = verify_shards(*shards)) return err;
      res.verified = true;
      double worst = 0;
      for (auto& s : *shards) {
        auto e0 = clock_type::now();
        if (auto err = s->evict()) return err;
        worst = std::max(worst, seconds_since(e0) * 1e3);
      }
      m->evicts.push_back(worst);
    }
    res.load_seconds = median(m->loads);
    res.evict_ms = median(m->evicts);
    res.submit_ms = median(m->submits);
    {
      // Mapping alone, on device 0 (its shard evicted): two ranges of the largest shard
      // in turn, so that each map takes the pages from the other range (an emulated
      // device leaves unmapped pages where they are, and a range mapped again with the
      // same pages would move nothing).
      auto& dev = *(*devs)[0];
      if ((*shards)[0]->state() == gpu::residency::resident)
        if (auto err = (*shards)[0]->evict()) return err;
      auto one = dev.reserve(capacity);
      if (!one) return std::move(one.error());
      auto other = dev.reserve(capacity);
      if (!other) return std::move(other.error());
      std::vector<double> maps, unmaps;
      for (int r = 0; r < std::max(3, o.repeats); ++r) {
        auto& range = r % 2 == 0 ? *one : *other;
        auto t0 = clock_type::now();
        if (auto err = range.map()) return err;
        maps.push_back(seconds_since(t0));
        t0 = clock_type::now();
        range.unmap();
        unmaps.push_back(seconds_since(t0));
      }
      const double gib = static_cast<double>(dev.pages_of(capacity)) / double(1ull << 30);
      res.page_bytes = dev.page_bytes();
      res.map_ms_per_gib = median(maps) * 1e3 / gib;
      res.unmap_ms_per_gib = median(unmaps) * 1e3 / gib;
    }
    auto after = (*devs)[0]->stats();
    res.native_allocations = after.native_allocations;
    res.native_frees = after.native_frees;
    res.achieved_gbps = static_cast<double>(total) / res.load_seconds / 1e9;
    // Against what the links could do for these bytes: the largest shard bounds the join.
    res.efficiency = static_cast<double>(capacity) / res.link_gbps / 1e9 / res.load_seconds;
    if (o.model.empty()) res.efficiency = res.achieved_gbps / (o.devices * res.link_gbps);
    for (size_t i = 0; i < devs->size(); ++i) {
      std::vector<double> mine;
      for (auto& round : m->per_shard) mine.push_back(round[i]);
      device_result d;
      d.name = (*devs)[i]->info().name;
      d.bytes = sizes[i];
      d.load_seconds = median(mine);
      d.achieved_gbps = static_cast<double>(sizes[i]) / d.load_seconds / 1e9;
      res.per_device.push_back(d);
    }
  }  // devices and shards freed before the comparison needs the memory

  if (!o.model.empty()) {
    // The same model with the vocabulary replicated, on the same kind of devices.
    res.model = o.model;
    res.split = fmt::format("tp {} x pp {}, {}", o.tp, o.pp, o.dtype);
    res.divide = o.divide;
    auto spec = models::find_spec(o.model);
    auto type = gpu::parse_weight_dtype(o.dtype);
    res.weight_bytes = models::weight_bytes(*spec, *type) / static_cast<uint64_t>(o.divide);
    res.replicated_vocab_bytes = sum(before);
    auto devs = open(o, o.devices, *std::max_element(before.begin(), before.end()));
    if (!devs) return std::move(devs.error());
    auto shards = make_shards(*devs, before, o.seed);
    if (!shards) return std::move(shards.error());
    auto m = measure(*shards, o, false);
    if (!m) return std::move(m.error());
    res.replicated_vocab_seconds = median(m->loads);
    res.vocab_speedup = res.replicated_vocab_seconds / res.load_seconds;
  } else if (o.baseline && o.devices > 1) {
    auto devs = open(o, 1, total);
    if (!devs) return std::move(devs.error());
    auto shards = make_shards(*devs, {total}, o.seed);
    if (!shards) return std::move(shards.error());
    auto m = measure(*shards, o, false);
    if (!m) return std::move(m.error());
    res.single_device_seconds = median(m->loads);
    res.speedup = res.single_device_seconds / res.load_seconds;
  }
  return res;
}

std::string to_json(const swap_bench_result& r) {
  nlohmann::json j;
  j["device_kind"] = r.device_kind;
  j["devices"] = r.devices;
  j["bytes"] = r.bytes;
  j["chunk_bytes"] = r.chunk_bytes;
  j["repeats"] = r.repeats;
  j["link_gbps"] = r.link_gbps;
  j["link_source"] = r.link_source;
  j["load_seconds"] = r.load_seconds;
  j["achieved_gbps"] = r.achieved_gbps;
  j["efficiency"] = r.efficiency;
  j["evict_ms"] = r.evict_ms;
  j["submit_ms"] = r.submit_ms;
  j["page_bytes"] = r.page_bytes;
  j["map_ms_per_gib"] = r.map_ms_per_gib;
  j["unmap_ms_per_gib"] = r.unmap_ms_per_gib;
  j["native_allocations"] = r.native_allocations;
  j["native_frees"] = r.native_frees;
  j["host_pinned"] = r.host_pinned;
  j["verified"] = r.verified;
  j["single_device_seconds"] = r.single_device_seconds;
  j["speedup_vs_single_device"] = r.speedup;
  if (!r.model.empty()) {
    j["model"] = r.model;
    j["split"] = r.split;
    j["divide"] = r.divide;
    j["weight_bytes"] = r.weight_bytes;
    j["bytes_over_weights"] = static_cast<double>(r.bytes) / static_cast<double>(r.weight_bytes);
    j["replicated_vocab_bytes"] = r.replicated_vocab_bytes;
    j["replicated_vocab_seconds"] = r.replicated_vocab_seconds;
    j["speedup_vs_replicated_vocab"] = r.vocab_speedup;
  }
  auto& per = j["per_device"] = nlohmann::json::array();
  for (auto& d : r.per_device)
    per.push_back({{"name", d.name},
                   {"bytes", d.bytes},
                   {"load_seconds", d.load_seconds},
                   {"achieved_gbps", d.achieved_gbps}});
  return j.dump();
}

void print_table(std::ostream& out, const swap_bench_result& r) {
  out << fmt::format(
      "model-parallel swap: {:.0f} MiB over {} {} device(s), {:.0f} MiB chunks, "
      "median of {}\n",
      r.bytes / 1048576.0, r.devices, r.device_kind, r.chunk_bytes / 1048576.0, r.repeats);
  out << fmt::format("link reference: {:.2f} GB/s per device ({})\n", r.link_gbps, r.link_source);
  if (!r.model.empty())
    out << fmt::format(
        "model           {} ({}): {:.1f} MiB of weights, {:.1f} MiB on the devices ({:.3f}x){}\n",
        r.model, r.split, r.weight_bytes / 1048576.0, r.bytes / 1048576.0,
        static_cast<double>(r.bytes) / static_cast<double>(r.weight_bytes),
        r.divide > 1 ? fmt::format(", every shard divided by {}", r.divide) : std::string{});
  out << "\n";
  out << fmt::format("{:<24} {:>12} {:>12} {:>12}\n", "device", "MiB", "load s", "GB/s");
  for (auto& d : r.per_device)
    out << fmt::format("{:<24} {:>12.1f} {:>12.4f} {:>12.2f}\n", d.name, d.bytes / 1048576.0,
                       d.load_seconds, d.achieved_gbps);
  out << fmt::format("{:<24} {:>12.1f} {:>12.4f} {:>12.2f}\n\n", "all (join)", r.bytes / 1048576.0,
                     r.load_seconds, r.achieved_gbps);
  out << fmt::format("efficiency      {:.3f} of {} x {:.2f} GB/s\n", r.efficiency, r.devices,
                     r.link_gbps);
  out << fmt::format("evict           {:.3f} ms (slowest shard; nothing copied back)\n",
                     r.evict_ms);
  out << fmt::format("submit          {:.3f} ms (the load call: allocation and queueing)\n",
                     r.submit_ms);
  out << fmt::format("pages           {} KiB: map {:.3f} ms/GiB, unmap {:.3f} ms/GiB (no copies)\n",
                     r.page_bytes / 1024, r.map_ms_per_gib, r.unmap_ms_per_gib);
  out << fmt::format(
      "device allocator calls: {} allocations, {} frees (the pages made at open; none per "
      "load or eviction)\n",
      r.native_allocations, r.native_frees);
  if (!r.model.empty())
    out << fmt::format(
        "vocab replicated {:.4f} s for {:.1f} MiB ({:.3f}x the weights): the vocabulary-parallel "
        "layout swaps {:.2f}x faster\n",
        r.replicated_vocab_seconds, r.replicated_vocab_bytes / 1048576.0,
        static_cast<double>(r.replicated_vocab_bytes) / static_cast<double>(r.weight_bytes),
        r.vocab_speedup);
  if (r.single_device_seconds > 0)
    out << fmt::format("one device      {:.4f} s for the whole model: {:.2f}x faster over {}\n",
                       r.single_device_seconds, r.speedup, r.devices);
  out << fmt::format("host memory     {}\n", r.host_pinned ? "pinned" : "pageable");
  out << fmt::format("verified        {}\n",
                     r.verified ? "yes (device bytes equal host bytes)" : "no");
}

caf::error print_layout_table(std::ostream& out, const std::string& dtype) {
  auto type = gpu::parse_weight_dtype(dtype);
  if (!type) return std::move(type.error());
  out << fmt::format("{:<14} {:>6} {:>11} {:>11} {:>8} {:>15}\n", "model", "tp x pp", "weights GB",
                     "devices GB", "ratio", "vocab replicated");
  for (auto& spec : models::catalogue()) {
    if (spec.name.find("tiny") != std::string::npos || spec.name.find("mini") != std::string::npos)
      continue;
    const auto weights = static_cast<double>(models::weight_bytes(spec, *type));
    for (int pp : {1, 2})
      for (int tp : {1, 2, 4}) {
        if (models::validate(spec, {tp, pp})) continue;
        uint64_t now = 0, before = 0;
        for (int s = 0; s < pp; ++s)
          for (int r = 0; r < tp; ++r) {
            auto a = models::shard_bytes(spec, *type, {tp, pp}, {r, s});
            auto b = models::replicated_vocab_shard_bytes(spec, *type, {tp, pp}, {r, s});
            if (!a) return a.error();
            if (!b) return b.error();
            now += *a;
            before += *b;
          }
        out << fmt::format("{:<14} {:>6} {:>11.3f} {:>11.3f} {:>8.4f} {:>15.4f}\n", spec.name,
                           fmt::format("{}x{}", tp, pp), weights / 1e9, now / 1e9,
                           static_cast<double>(now) / weights,
                           static_cast<double>(before) / weights);
      }
  }
  return {};
}

}  // namespace computron::bench
