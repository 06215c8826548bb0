#include "bench/step_probe.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include "common/error.hpp"

namespace computron::bench {

namespace {

/// Wraps libtorch's CPU allocator and counts the bytes asked of it. Installed once, on first
/// use, at a priority above the default's; frees go to the wrapped allocator's deleter, so
/// memory allocated before it was installed is freed as before.
class counting_cpu_allocator final : public c10::Allocator {
 public:
  explicit counting_cpu_allocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    bytes.fetch_add(n, std::memory_order_relaxed);
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  std::atomic<uint64_t> bytes{0};

 private:
  c10::Allocator* inner_;
};

counting_cpu_allocator& cpu_counter() {
  static counting_cpu_allocator* a = [] {
    auto* c = new counting_cpu_allocator(c10::GetCPUAllocator());  // lives as long as torch
    c10::SetCPUAllocator(c, /*priority=*/100);
    return c;
  }();
  return *a;
}

uint64_t cuda_allocated(int device) {
  auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return static_cast<uint64_t>(
      stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
          .allocated);
}

/// RecordFunction takes plain function pointers: the count lives here, one probe at a time.
std::atomic<uint64_t> g_ops{0};
std::mutex g_probe_mutex;

std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction&) {
  g_ops.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

}  // namespace

caf::expected<step_counts> count_step(int cuda_device, const std::function<caf::error()>& step) {
  std::lock_guard<std::mutex> one_at_a_time(g_probe_mutex);
  auto& cpu = cpu_counter();
  g_ops.store(0);
  auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&count_op).scopes({at::RecordScope::FUNCTION}));
  uint64_t cpu0 = cpu.bytes.load();
  uint64_t cuda0 = cuda_device >= 0 ? cuda_allocated(cuda_device) : 0;
  auto err = step();
  uint64_t cpu1 = cpu.bytes.load();
  uint64_t cuda1 = cuda_device >= 0 ? cuda_allocated(cuda_device) : 0;
  at::removeCallback(handle);
  if (err) return err;
  step_counts c;
  c.ops = g_ops.load();
  c.alloc_bytes = cuda_device >= 0 ? cuda1 - cuda0 : cpu1 - cpu0;
  return c;
}

caf::expected<step_profile> profile_step(int cuda_device, const std::function<caf::error()>& step) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda_device >= 0) activities.insert(ActivityType::CUDA);
  ProfilerConfig config(ProfilerState::KINETO);
  std::unique_ptr<prof::ProfilerResult> result;
  caf::error err;
  auto t0 = std::chrono::steady_clock::now();
  try {
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    t0 = std::chrono::steady_clock::now();
    err = step();
  } catch (const std::exception& e) {
    return make_error(ec::device_error, std::string("profiler: ") + e.what());
  }
  auto wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
  try {
    result = prof::disableProfiler();
  } catch (const std::exception& e) {
    return make_error(ec::device_error, std::string("profiler: ") + e.what());
  }
  if (err) return err;
  step_profile p;
  p.wall_micros = wall.count();
  p.what = cuda_device >= 0 ? "cuda kernels" : "cpu ops";
  std::map<std::string, profile_row> by_name;
  for (const auto& e : result->events()) {
    bool device_event = e.deviceType() == c10::DeviceType::CUDA;
    if (cuda_device >= 0
            ? !device_event
            : (device_event || e.scope() != static_cast<uint8_t>(at::RecordScope::FUNCTION)))
      continue;
    auto& row = by_name[e.name()];
    row.name = e.name();
    row.count += 1;
    row.micros += static_cast<double>(e.durationNs()) / 1e3;
  }
  for (auto& [name, row] : by_name) {
    p.busy_micros += row.micros;
    p.rows.push_back(row);
  }
  for (auto& row : p.rows) row.share = p.busy_micros > 0 ? row.micros / p.busy_micros : 0;
  std::sort(p.rows.begin(), p.rows.end(),
            [](const profile_row& a, const profile_row& b) { return a.micros > b.micros; });
  return p;
}

}  // namespace computron::bench
