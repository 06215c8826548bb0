#include "bench/startup_bench.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/files.hpp"
#include "models/checkpoint.hpp"
#include "models/weights.hpp"

namespace computron::bench {

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Best of three: start-up work is deterministic, the machine is not.
template <class F>
double best_seconds(F&& f) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    auto t0 = clock_type::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

}  // namespace

caf::expected<startup_bench_result> run_startup_bench(const startup_bench_options& o) {
  auto spec = models::find_spec(o.model);
  if (!spec) return std::move(spec.error());
  auto type = gpu::parse_weight_dtype(o.dtype);
  if (!type) return std::move(type.error());
  if (o.threads < 0 || o.files < 1 || o.files > 64)
    return make_error(ec::invalid_request, "--threads must be >= 0 and --files 1..64");
  auto table = models::shard_layout(*spec, *type, {1, 1}, {0, 0});
  if (!table) return std::move(table.error());
  startup_bench_result r;
  r.model = o.model;
  r.dtype = o.dtype;
  r.bytes = table->total_bytes();
  models::set_fill_threads(o.threads);
  r.threads = models::fill_threads();
  std::vector<std::byte> host(r.bytes);
  std::vector<std::byte> other(r.bytes);
  auto gbps = [&](double secs) { return static_cast<double>(r.bytes) / secs / 1e9; };
  auto fill = [&] {
    if (auto err = models::fill_seeded(*spec, {1, 1}, {0, 0}, *table, host.data(), 1))
      throw std::runtime_error(render(err));
  };
  try {
    fill();  // touches the pages once, outside the timings
    r.seeded_gbps = gbps(best_seconds(fill));
    models::set_fill_threads(1);
    r.seeded_gbps_one_thread = gbps(best_seconds(fill));
    models::set_fill_threads(o.threads);
  } catch (const std::exception& e) {
    models::set_fill_threads(0);
    return make_error(ec::unspecified, e.what());
  }
  // The reference: one seeded_value call and one conversion per element.
  {
    auto width = gpu::size_of(*type);
    auto n = std::min<uint64_t>(o.reference_elements, r.bytes / width);
    auto t0 = clock_type::now();
    for (uint64_t i = 0; i < n; ++i) {
      auto v = models::seeded_value(1, "layers.0.fc1.weight", i, models::init_kind::weight);
      uint16_t h = *type == gpu::dtype::f16 ? models::to_f16(v) : models::to_bf16(v);
      if (width == 4)
        std::memcpy(other.data() + i * 4, &v, 4);
      else
        std::memcpy(other.data() + i * 2, &h, 2);
    }
    r.reference_gbps_one_thread = static_cast<double>(n * width) / seconds_since(t0) / 1e9;
  }
  auto copy = [&](int threads) {
    std::vector<std::thread> pool;
    auto per = r.bytes / static_cast<uint64_t>(threads);
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        auto begin = per * static_cast<uint64_t>(t);
        auto end = t + 1 == threads ? r.bytes : begin + per;
        std::memcpy(other.data() + begin, host.data() + begin, end - begin);
      });
    for (auto& th : pool) th.join();
  };
  r.memcpy_gbps_one_thread = gbps(best_seconds([&] { copy(1); }));
  r.memcpy_gbps = gbps(best_seconds([&] { copy(r.threads); }));

  auto dir = o.dir.empty()
                 ? (fs::temp_directory_path() / ("computron-startup-" + std::to_string(::getpid())))
                       .string()
                 : o.dir;
  auto cleanup = [&] {
    if (o.dir.empty()) remove_tree(dir);
  };
  for (auto [ckpt_type, out] : {std::pair{*type, &r.checkpoint_gbps},
                                std::pair{gpu::dtype::f32, &r.checkpoint_convert_gbps}}) {
    auto folder = dir + "/" + gpu::to_string(ckpt_type);
    if (auto err = models::write_hf_opt_folder(folder, *spec, ckpt_type, 1, o.files)) {
      cleanup();
      return err;
    }
    auto ckpt = models::checkpoint::open(folder);
    if (!ckpt) {
      cleanup();
      return std::move(ckpt.error());
    }
    caf::error failure;
    auto read = [&] {
      if (auto err =
              models::fill_from_checkpoint(*spec, {1, 1}, {0, 0}, *table, other.data(), *ckpt))
        failure = err;
    };
    read();  // the page cache holds the files from here on
    *out = gbps(best_seconds(read));
    if (failure) {
      cleanup();
      return failure;
    }
  }
  cleanup();
  models::set_fill_threads(0);
  return r;
}

std::string to_json(const startup_bench_result& r) {
  nlohmann::json j{{"model", r.model},
                   {"dtype", r.dtype},
                   {"bytes", r.bytes},
                   {"threads", r.threads},
                   {"seeded_gbps_one_thread", r.seeded_gbps_one_thread},
                   {"seeded_gbps", r.seeded_gbps},
                   {"reference_gbps_one_thread", r.reference_gbps_one_thread},
                   {"checkpoint_gbps", r.checkpoint_gbps},
                   {"checkpoint_convert_gbps", r.checkpoint_convert_gbps},
                   {"memcpy_gbps_one_thread", r.memcpy_gbps_one_thread},
                   {"memcpy_gbps", r.memcpy_gbps}};
  return j.dump();
}

void print_table(std::ostream& out, const startup_bench_result& r) {
  out << fmt::format("start-up: host copy of {} {} ({:.2f} GB), best of 3\n\n", r.model, r.dtype,
                     r.bytes / 1e9);
  out << fmt::format("{:<44} {:>10} {:>12}\n", "", "GB/s", "vs memcpy");
  auto row = [&](const std::string& what, double g, double ceiling) {
    out << fmt::format("{:<44} {:>10.2f} {:>12.2f}\n", what, g, ceiling > 0 ? g / ceiling : 0);
  };
  row("seeded, per-element reference, 1 thread", r.reference_gbps_one_thread,
      r.memcpy_gbps_one_thread);
  row("seeded, 1 thread", r.seeded_gbps_one_thread, r.memcpy_gbps_one_thread);
  row(fmt::format("seeded, {} threads", r.threads), r.seeded_gbps, r.memcpy_gbps);
  row(fmt::format("safetensors folder, same dtype, {} threads", r.threads), r.checkpoint_gbps,
      r.memcpy_gbps);
  row(fmt::format("safetensors folder, f32 -> {}, {} threads", r.dtype, r.threads),
      r.checkpoint_convert_gbps, r.memcpy_gbps);
  row("memcpy, 1 thread", r.memcpy_gbps_one_thread, r.memcpy_gbps_one_thread);
  row(fmt::format("memcpy, {} threads", r.threads), r.memcpy_gbps, r.memcpy_gbps);
  out << fmt::format("\nseeded speed-up over the reference: {:.1f}x on one thread\n",
                     r.seeded_gbps_one_thread / r.reference_gbps_one_thread);
}

}  // namespace computron::bench
