#include "gpu/cuda/green_context.hpp"

#include <algorithm>
#include <numeric>
#include <set>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "gpu/cuda/driver_entry.hpp"

namespace computron::gpu::cuda {

namespace {

/// Green contexts came with CUDA 12.4.
constexpr int first_version = 12040;

/// The driver calls green contexts need, looked up once. Through the runtime rather than
/// linked, so that no binary depends on libcuda.so.1 (CI's machines have no driver).
struct driver_calls {
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuDeviceGetDevResource) device_resource = nullptr;
  decltype(&cuDevSmResourceSplitByCount) split = nullptr;
  decltype(&cuDevResourceGenerateDesc) generate_desc = nullptr;
  decltype(&cuGreenCtxCreate) create = nullptr;
  decltype(&cuGreenCtxDestroy) destroy = nullptr;
  decltype(&cuGreenCtxGetDevResource) ctx_resource = nullptr;
  decltype(&cuGreenCtxStreamCreate) stream_create = nullptr;
  decltype(&cuStreamSynchronize) stream_synchronize = nullptr;
  decltype(&cuStreamDestroy) stream_destroy = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
  caf::error missing{};
};

caf::error missing_call(const char* name, const std::string& why) {
  return make_error(ec::device_error, fmt::format("gpu-lets need CUDA green contexts (driver calls "
                                                  "cuGreenCtxCreate, cuDevSmResourceSplitByCount, "
                                                  "cuGreenCtxStreamCreate; CUDA 12.4+): {}: {}",
                                                  name, why));
}

template <class F>
caf::error lookup(const char* name, F& fn, int version) {
  auto why = driver_entry(name, fn, version);
  return why.empty() ? caf::error{} : missing_call(name, why);
}

const driver_calls& calls() {
  static const driver_calls d = [] {
    driver_calls c;
    // The runtime initializes the driver on its first call; without one there is nothing
    // to look up.
    int n = 0, driver = 0;
    if (auto status = cudaGetDeviceCount(&n); status != cudaSuccess || n == 0) {
      cudaGetLastError();
      c.missing = make_error(
          ec::device_error,
          fmt::format("gpu-lets on CUDA: no usable GPU ({})",
                      status != cudaSuccess ? cudaGetErrorString(status) : "none found"));
      return c;
    }
    cudaDriverGetVersion(&driver);
    if (driver < first_version) {
      c.missing = missing_call(
          "the driver", fmt::format("it supports CUDA {}.{}", driver / 1000, (driver % 1000) / 10));
      return c;
    }
    const int version = std::min(CUDA_VERSION, driver);
    auto first = [&](caf::error e) {
      if (e && !c.missing) c.missing = std::move(e);
    };
    first(lookup("cuDeviceGet", c.device_get, version));
    first(lookup("cuDeviceGetDevResource", c.device_resource, version));
    first(lookup("cuDevSmResourceSplitByCount", c.split, version));
    first(lookup("cuDevResourceGenerateDesc", c.generate_desc, version));
    first(lookup("cuGreenCtxCreate", c.create, version));
    first(lookup("cuGreenCtxDestroy", c.destroy, version));
    first(lookup("cuGreenCtxGetDevResource", c.ctx_resource, version));
    first(lookup("cuGreenCtxStreamCreate", c.stream_create, version));
    first(lookup("cuStreamSynchronize", c.stream_synchronize, version));
    first(lookup("cuStreamDestroy", c.stream_destroy, version));
    first(lookup("cuGetErrorString", c.error_string, version));
    return c;
  }();
  return d;
}

caf::error check(CUresult r, const char* what, int ordinal) {
  if (r == CUDA_SUCCESS) return {};
  const char* msg = nullptr;
  if (calls().error_string) calls().error_string(r, &msg);
  return make_error(ec::device_error,
                    fmt::format("cuda:{}: {} failed: {} ({})", ordinal, what,
                                msg ? msg : "unknown error", static_cast<int>(r)));
}

unsigned round_down(unsigned n, unsigned align) {
  return align > 1 ? n / align * align : n;
}

}  // namespace

/// One partition's green contexts: a lane's own, and the helpers that hold what each
/// split left (the driver splits again only what a device or green context reports).
struct green_partitions::chain {
  std::vector<green_stream> lanes;
  std::set<CUgreenCtx> contexts;

  ~chain() {
    auto& c = calls();
    for (auto& l : lanes)
      if (l.stream) {
        // Work still queued there (a step a shutdown cut short) ends before its context.
        c.stream_synchronize(static_cast<CUstream>(l.stream));
        c.stream_destroy(static_cast<CUstream>(l.stream));
      }
    for (auto ctx : contexts) c.destroy(ctx);
  }
};

caf::error green_contexts_available() {
  return calls().missing;
}

green_partitions::green_partitions(int ordinal) : ordinal_(ordinal) {}

green_partitions::~green_partitions() {
  std::lock_guard<std::mutex> g{mtx_};
  if (chains_.empty()) return;
  cudaSetDevice(ordinal_);
  chains_.clear();
}

caf::expected<green_stream> green_partitions::stream(const std::vector<int32_t>& partition,
                                                     size_t lane) {
  std::lock_guard<std::mutex> g{mtx_};
  // Every step asks: the partition made before answers at once.
  if (auto i = chains_.find(partition); i != chains_.end()) {
    if (lane >= i->second->lanes.size())
      return make_error(ec::invalid_request,
                        fmt::format("cuda:{}: lane {} of a partition of {} lanes", ordinal_, lane,
                                    i->second->lanes.size()));
    return i->second->lanes[lane];
  }
  int32_t sum = 0;
  for (auto s : partition) {
    if (s < 1 || s > 100)
      return make_error(ec::invalid_request,
                        fmt::format("cuda:{}: a gpu-let of {}%: shares are 1..100", ordinal_, s));
    sum += s;
  }
  if (partition.empty() || sum > 100 || lane >= partition.size())
    return make_error(ec::invalid_request,
                      fmt::format("cuda:{}: lane {} of a partition of {} lanes summing to {}%",
                                  ordinal_, lane, partition.size(), sum));
  if (auto err = green_contexts_available()) return err;
  auto made = split(partition);
  if (!made) return std::move(made.error());
  auto out = (*made)->lanes[lane];
  chains_.emplace(partition, std::move(*made));
  return out;
}

caf::expected<std::unique_ptr<green_partitions::chain>> green_partitions::split(
    const std::vector<int32_t>& partition) {
  auto& c = calls();
  if (cudaSetDevice(ordinal_) != cudaSuccess) {
    cudaGetLastError();
    return make_error(ec::device_error, fmt::format("cuda:{}: cudaSetDevice failed", ordinal_));
  }
  CUdevice dev{};
  if (auto err = check(c.device_get(&dev, ordinal_), "cuDeviceGet", ordinal_)) return err;
  CUdevResource all{};
  if (auto err = check(c.device_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM),
                       "cuDeviceGetDevResource", ordinal_))
    return err;
  const unsigned total = all.sm.smCount;
  const unsigned align = std::max(1u, all.sm.smCoscheduledAlignment);
  const unsigned smallest = std::max(align, all.sm.minSmPartitionSize);
  const int32_t sum = std::accumulate(partition.begin(), partition.end(), 0);

  auto out = std::make_unique<chain>();
  auto make_ctx = [&](CUdevResource& r, CUgreenCtx* ctx) -> caf::error {
    CUdevResourceDesc desc{};
    if (auto err = check(c.generate_desc(&desc, &r, 1), "cuDevResourceGenerateDesc", ordinal_))
      return err;
    if (auto err = check(c.create(ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate",
                         ordinal_))
      return err;
    out->contexts.insert(*ctx);
    return {};
  };
  auto add_lane = [&](CUgreenCtx ctx, unsigned sms, unsigned first) -> caf::error {
    CUstream s = nullptr;
    if (auto err = check(c.stream_create(&s, ctx, CU_STREAM_NON_BLOCKING, 0),
                         "cuGreenCtxStreamCreate", ordinal_))
      return err;
    out->lanes.push_back({static_cast<void*>(s), sms, first});
    return {};
  };

  CUdevResource current = all;  // what the lanes so far left
  CUgreenCtx current_ctx = nullptr;
  unsigned first = 0;
  for (size_t i = 0; i < partition.size(); ++i) {
    const int32_t share = partition[i];
    const bool last = i + 1 == partition.size();
    if (last && sum == 100) {
      // The last lane of a whole partition takes all that is left.
      if (!current_ctx) {
        out->lanes.push_back({nullptr, total, 0});  // one lane: the whole GPU
        break;
      }
      if (auto err = add_lane(current_ctx, current.sm.smCount, first)) return err;
      break;
    }
    // Percent to SMs, on the granularity the GPU allows (an H100's 132 SMs split 50/50
    // give 64 and the 68 left).
    unsigned want = round_down(total * static_cast<unsigned>(share) / 100, align);
    if (want < smallest)
      return make_error(ec::invalid_configuration,
                        fmt::format("a gpu-let of {}% of cuda:{} is {} of its {} SMs, fewer than "
                                    "the {} its smallest green context holds",
                                    share, ordinal_, total * static_cast<unsigned>(share) / 100,
                                    total, smallest));
    want = std::min(want, current.sm.smCount);
    CUdevResource group{}, rest{};
    unsigned n = 1;
    CUresult r = c.split(&group, &n, &current, &rest, 0, want);
    if (r != CUDA_SUCCESS || n < 1) {
      // What is left may not split on its clusters' boundaries: each SM on its own then.
      n = 1;
      r = c.split(&group, &n, &current, &rest, CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING,
                  want);
    }
    if (auto err = check(r, "cuDevSmResourceSplitByCount", ordinal_)) return err;
    if (n < 1)
      return make_error(ec::device_error,
                        fmt::format("cuda:{}: {} SMs left could not give a group of {} for a "
                                    "gpu-let of {}%",
                                    ordinal_, current.sm.smCount, want, share));
    CUgreenCtx ctx = nullptr;
    if (auto err = make_ctx(group, &ctx)) return err;
    if (auto err = add_lane(ctx, group.sm.smCount, first)) return err;
    first += group.sm.smCount;
    if (last) break;
    if (rest.sm.smCount == 0)
      return make_error(ec::device_error,
                        fmt::format("cuda:{}: no SMs left after {} of {} for the gpu-lets after "
                                    "lane {}",
                                    ordinal_, first, total, i));
    // A split's remainder splits again only once it is a green context's.
    if (auto err = make_ctx(rest, &current_ctx)) return err;
    if (auto err = check(c.ctx_resource(current_ctx, &current, CU_DEV_RESOURCE_TYPE_SM),
                         "cuGreenCtxGetDevResource", ordinal_))
      return err;
  }
  std::string shares, got;
  for (auto s : partition) shares += (shares.empty() ? "" : "/") + std::to_string(s);
  for (auto& l : out->lanes) got += fmt::format(" {} SMs from SM {};", l.sms, l.first_sm);
  log::info("cuda:{}: gpu-lets {}: green contexts of{} {} SMs in all", ordinal_, shares, got,
            total);
  return out;
}

}  // namespace computron::gpu::cuda
