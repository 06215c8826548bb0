#include "gpu/cuda/nccl_collective.hpp"

#include <cstring>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "common/error.hpp"

namespace computron::gpu::cuda {

namespace {

caf::error check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return {};
  return make_error(ec::device_error, fmt::format("{} failed: {}", what, ncclGetErrorString(r)));
}

caf::error check(cudaError_t r, const char* what) {
  if (r == cudaSuccess) return {};
  cudaGetLastError();
  return make_error(ec::device_error, fmt::format("{} failed: {}", what, cudaGetErrorString(r)));
}

class nccl_group final : public collective {
 public:
  nccl_group(ncclComm_t comm, cudaStream_t stream, int rank, int size, int device)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), device_(device) {}
  ~nccl_group() override {
    cudaSetDevice(device_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  caf::error all_reduce_sum(float* data, uint64_t count) override {
    if (auto err = check(cudaSetDevice(device_), "cudaSetDevice")) return err;
    if (auto err = check(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_),
                         "ncclAllReduce"))
      return err;
    return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_;
  int size_;
  int device_;
};

}  // namespace

caf::expected<std::string> nccl_unique_id() {
  ncclUniqueId id;
  if (auto err = check(ncclGetUniqueId(&id), "ncclGetUniqueId")) return err;
  return std::string(id.internal, sizeof(id.internal));
}

caf::expected<std::unique_ptr<collective>> make_nccl_collective(const std::string& unique_id,
                                                                int rank, int size, int device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal))
    return make_error(ec::invalid_request, fmt::format("NCCL unique id must be {} bytes, got {}",
                                                       sizeof(id.internal), unique_id.size()));
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  if (rank < 0 || rank >= size)
    return make_error(ec::invalid_request,
                      fmt::format("rank {} outside a group of {}", rank, size));
  if (auto err = check(cudaSetDevice(device), "cudaSetDevice")) return err;
  cudaStream_t stream;
  if (auto err =
          check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"))
    return err;
  ncclComm_t comm;
  if (auto err = check(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank")) {
    cudaStreamDestroy(stream);
    return err;
  }
  return std::unique_ptr<collective>{
      std::make_unique<nccl_group>(comm, stream, rank, size, device)};
}

}  // namespace computron::gpu::cuda
