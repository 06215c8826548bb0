#include "gpu/cuda/green_context.hpp"

#include <algorithm>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"

namespace computron::gpu::cuda {

namespace {

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
  decltype(&cuStreamDestroy) stream_destroy = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
  caf::error missing{};
};

template <class F>
caf::error lookup(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  auto status = cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    const char* why = found == cudaDriverEntryPointVersionNotSufficent
                          ? "the driver is older than the CUDA this build needs"
                      : found == cudaDriverEntryPointSymbolNotFound ? "the driver has no such call"
                      : status != cudaSuccess                       ? cudaGetErrorString(status)
                                                                    : "not found";
    return make_error(ec::device_error,
                      fmt::format("gpu-lets need CUDA green contexts (driver calls "
                                  "cuGreenCtxCreate, cuDevSmResourceSplitByCount, "
                                  "cuGreenCtxStreamCreate; CUDA 12.4+): {} is missing: {}",
                                  name, why));
  }
  fn = reinterpret_cast<F>(p);
  return {};
}

const driver_calls& calls() {
  static const driver_calls d = [] {
    driver_calls c;
    auto first = [&](caf::error e) {
      if (e && !c.missing) c.missing = std::move(e);
    };
    first(lookup("cuDeviceGet", c.device_get));
    first(lookup("cuDeviceGetDevResource", c.device_resource));
    first(lookup("cuDevSmResourceSplitByCount", c.split));
    first(lookup("cuDevResourceGenerateDesc", c.generate_desc));
    first(lookup("cuGreenCtxCreate", c.create));
    first(lookup("cuGreenCtxDestroy", c.destroy));
    first(lookup("cuGreenCtxGetDevResource", c.ctx_resource));
    first(lookup("cuGreenCtxStreamCreate", c.stream_create));
    first(lookup("cuStreamDestroy", c.stream_destroy));
    first(lookup("cuGetErrorString", c.error_string));
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

/// One gpu-let: its green context (and the helper that holds the SMs from its offset on,
/// which a split needs: the driver splits only what a device or green context reports).
struct green_partitions::entry {
  CUgreenCtx helper = nullptr;
  CUgreenCtx ctx = nullptr;
  CUstream stream = nullptr;
  unsigned sms = 0;
  unsigned first_sm = 0;

  ~entry() {
    auto& c = calls();
    if (stream) c.stream_destroy(stream);
    if (ctx && ctx != helper) c.destroy(ctx);
    if (helper) c.destroy(helper);
  }
};

caf::error green_contexts_available() {
  // The runtime initializes the driver on its first call; without one there is nothing
  // to look up.
  int n = 0;
  if (auto status = cudaGetDeviceCount(&n); status != cudaSuccess) {
    cudaGetLastError();
    return make_error(ec::device_error, fmt::format("gpu-lets on CUDA: no usable GPU ({})",
                                                    cudaGetErrorString(status)));
  }
  return calls().missing;
}

green_partitions::green_partitions(int ordinal) : ordinal_(ordinal) {}

green_partitions::~green_partitions() {
  std::lock_guard<std::mutex> g{mtx_};
  cudaSetDevice(ordinal_);
  entries_.clear();
}

unsigned green_partitions::total_sms() const {
  std::lock_guard<std::mutex> g{mtx_};
  return total_sms_;
}

caf::expected<green_stream> green_partitions::stream(int32_t offset, int32_t share) {
  if (share < 1 || share > 100 || offset < 0 || offset > 99)
    return make_error(ec::invalid_request,
                      fmt::format("a gpu-let of {}% from {}% of cuda:{}: shares are 1..100 and "
                                  "offsets 0..99 percent",
                                  share, offset, ordinal_));
  if (auto err = green_contexts_available()) return err;
  auto& c = calls();
  std::lock_guard<std::mutex> g{mtx_};
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
  total_sms_ = total;
  // Percent to SMs, on the granularity the GPU allows (8 on an H100, whose 132 SMs give
  // a 50/50 split of 64 and 68).
  unsigned count = round_down(total * static_cast<unsigned>(share) / 100, align);
  if (count < smallest) {
    if (share < 100)
      return make_error(ec::invalid_configuration,
                        fmt::format("a gpu-let of {}% of cuda:{} is {} of its {} SMs, fewer "
                                    "than the {} its smallest green context holds",
                                    share, ordinal_, total * share / 100, total, smallest));
    count = total;
  }
  unsigned first = round_down(total * static_cast<unsigned>(offset) / 100, align);
  if (first + count > total) first = total > count ? round_down(total - count, align) : 0;
  if (first == 0 && count >= total) return green_stream{nullptr, total, 0};
  auto key = std::make_pair(first, count);
  if (auto i = entries_.find(key); i != entries_.end())
    return green_stream{i->second->stream, i->second->sms, i->second->first_sm};

  auto e = std::make_unique<entry>();
  auto make_ctx = [&](CUdevResource& r, CUgreenCtx* out) -> caf::error {
    CUdevResourceDesc desc{};
    if (auto err = check(c.generate_desc(&desc, &r, 1), "cuDevResourceGenerateDesc", ordinal_))
      return err;
    return check(c.create(out, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate",
                 ordinal_);
  };
  CUdevResource input = all;
  if (first > 0) {
    // The SMs before the offset go to a group nobody uses here; a green context of the
    // rest gives a resource the driver splits again (it will not split a remainder).
    unsigned n = 1;
    CUdevResource skipped{}, rest{};
    if (auto err = check(c.split(&skipped, &n, &all, &rest, 0, first),
                         "cuDevSmResourceSplitByCount", ordinal_))
      return err;
    if (n < 1 || rest.sm.smCount == 0)
      return make_error(
          ec::device_error,
          fmt::format("cuda:{}: no SMs left after the first {} of {}", ordinal_, first, total));
    e->first_sm = skipped.sm.smCount;
    if (auto err = make_ctx(rest, &e->helper)) return err;
    if (auto err = check(c.ctx_resource(e->helper, &input, CU_DEV_RESOURCE_TYPE_SM),
                         "cuGreenCtxGetDevResource", ordinal_))
      return err;
  }
  if (count >= input.sm.smCount && e->helper) {
    e->ctx = e->helper;
    e->sms = input.sm.smCount;
  } else {
    unsigned n = 1;
    CUdevResource group{};
    if (auto err = check(c.split(&group, &n, &input, nullptr, 0, std::min(count, input.sm.smCount)),
                         "cuDevSmResourceSplitByCount", ordinal_))
      return err;
    if (n < 1)
      return make_error(ec::device_error,
                        fmt::format("cuda:{}: {} SMs could not be split into a group of {}",
                                    ordinal_, input.sm.smCount, count));
    e->sms = group.sm.smCount;
    if (auto err = make_ctx(group, &e->ctx)) return err;
  }
  if (auto err = check(c.stream_create(&e->stream, e->ctx, CU_STREAM_NON_BLOCKING, 0),
                       "cuGreenCtxStreamCreate", ordinal_))
    return err;
  log::info("cuda:{}: gpu-let of {}% from {}%: green context of {} SMs from SM {} of {}", ordinal_,
            share, offset, e->sms, e->first_sm, total);
  green_stream out{e->stream, e->sms, e->first_sm};
  entries_.emplace(key, std::move(e));
  return out;
}

}  // namespace computron::gpu::cuda
