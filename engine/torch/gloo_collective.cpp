#include "engine/torch/gloo_collective.hpp"

#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/error.hpp"

namespace computron::models {

namespace {

class tcp_store final : public gloo_store {
 public:
  explicit tcp_store(c10::intrusive_ptr<c10d::TCPStore> s) : store(std::move(s)) {}
  uint16_t port() const override { return store->getPort(); }
  /// The hosting (or first) connection; it keeps the server alive on rank 0.
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string host;
  int world_size = 1;
  std::chrono::milliseconds timeout{30000};
};

/// Ranks in one process share the map itself; port() is 0 (there is no socket).
class local_store final : public gloo_store {
 public:
  explicit local_store(std::chrono::milliseconds t)
      : store(c10::make_intrusive<c10d::HashStore>()), timeout(t) {
    store->setTimeout(t);
  }
  uint16_t port() const override { return 0; }
  c10::intrusive_ptr<c10d::HashStore> store;
  std::chrono::milliseconds timeout;
};

caf::expected<std::shared_ptr<gloo_store>> make_store(const std::string& host, uint16_t port,
                                                      int world_size, bool server,
                                                      std::chrono::milliseconds timeout) {
  if (world_size < 1)
    return make_error(ec::invalid_request, fmt::format("group of {} ranks", world_size));
  try {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = server;
    opts.numWorkers = world_size;
    opts.waitWorkers = false;
    opts.timeout = timeout;
    auto s = c10::make_intrusive<c10d::TCPStore>(host, opts);
    auto out = std::make_shared<tcp_store>(std::move(s));
    out->host = host;
    out->world_size = world_size;
    out->timeout = timeout;
    return std::shared_ptr<gloo_store>{out};
  } catch (const std::exception& e) {
    return make_error(ec::unavailable,
                      fmt::format("gloo rendezvous store at {}:{} ({}): {}", host, port,
                                  server ? "hosting" : "connecting", e.what()));
  }
}

class gloo_group final : public gpu::collective {
 public:
  gloo_group(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int size)
      : pg_(std::move(pg)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  caf::error all_reduce_sum(float* data, uint64_t count) override {
    try {
      std::vector<at::Tensor> t{at::from_blob(data, {static_cast<int64_t>(count)}, at::kFloat)};
      pg_->allreduce(t)->wait();
      return {};
    } catch (const std::exception& e) {
      return make_error(ec::device_error,
                        fmt::format("gloo all-reduce (rank {} of {}): {}", rank_, size_, e.what()));
    }
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_;
  int size_;
};

}  // namespace

caf::expected<std::shared_ptr<gloo_store>> host_gloo_store(const std::string& host, uint16_t port,
                                                           int world_size,
                                                           std::chrono::milliseconds timeout) {
  return make_store(host, port, world_size, true, timeout);
}

std::shared_ptr<gloo_store> local_gloo_store(std::chrono::milliseconds timeout) {
  return std::make_shared<local_store>(timeout);
}

caf::expected<std::shared_ptr<gloo_store>> connect_gloo_store(const std::string& host,
                                                              uint16_t port, int world_size,
                                                              std::chrono::milliseconds timeout) {
  return make_store(host, port, world_size, false, timeout);
}

caf::expected<std::unique_ptr<gpu::collective>> make_gloo_collective(
    std::shared_ptr<gloo_store> store, const std::string& prefix, int rank, int size,
    const std::string& bind_address) {
  auto* tcp = dynamic_cast<tcp_store*>(store.get());
  auto* local = dynamic_cast<local_store*>(store.get());
  if (tcp == nullptr && local == nullptr)
    return make_error(ec::invalid_request, "gloo collective without a store");
  if (rank < 0 || rank >= size)
    return make_error(ec::invalid_request,
                      fmt::format("rank {} outside a group of {}", rank, size));
  // c10d's flight recorder (on by default in torch 2.11, process-wide) crashed here inside
  // recordWithResetEnabled when process groups of one process ran collectives in several
  // threads at once (1 run in 4 of the tp=2 pp=2 forward tests, gdb's backtrace). It is a
  // debugging trace that we never dump: off before the first group reads the setting, unless
  // the environment asks for it.
  static const bool recorder_off = [] { return ::setenv("TORCH_FR_BUFFER_SIZE", "0", 0) == 0; }();
  (void)recorder_off;
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->timeout = tcp != nullptr ? tcp->timeout : local->timeout;
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(bind_address));
    opts->threads = 1;
    c10::intrusive_ptr<c10d::Store> own;
    if (local != nullptr) {
      own = local->store;
    } else {
      // A client connection of its own: a TCPStore socket is not safe to share between
      // ranks that rendezvous concurrently (seen here: interleaved replies, socket timeouts).
      c10d::TCPStoreOptions client;
      client.port = tcp->port();
      client.isServer = false;
      client.numWorkers = tcp->world_size;
      client.waitWorkers = false;
      client.timeout = tcp->timeout;
      own = c10::make_intrusive<c10d::TCPStore>(tcp->host, client);
    }
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, own);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
    return std::unique_ptr<gpu::collective>{
        std::make_unique<gloo_group>(std::move(pg), rank, size)};
  } catch (const std::exception& e) {
    return make_error(ec::unavailable, fmt::format("joining gloo group '{}' as rank {} of {}: {}",
                                                   prefix, rank, size, e.what()));
  }
}

namespace {

class gloo_provider final : public gpu::group_provider {
 public:
  caf::expected<std::string> host(const std::string& host, int size,
                                  std::chrono::milliseconds timeout) override {
    auto store = host_gloo_store(host, 0, size, timeout);
    if (!store) return store.error();
    auto address = host + ":" + std::to_string((*store)->port());
    std::lock_guard<std::mutex> guard{mtx_};
    hosted_[address] = *store;
    return address;
  }

  caf::expected<std::unique_ptr<gpu::collective>> join(const std::string& address,
                                                       const std::string& name, int rank, int size,
                                                       const std::string& bind_host,
                                                       std::chrono::milliseconds timeout) override {
    auto colon = address.rfind(':');
    if (colon == std::string::npos || colon + 1 == address.size())
      return make_error(ec::invalid_request, "group address '" + address + "' is not host:port");
    int port = 0;
    try {
      port = std::stoi(address.substr(colon + 1));
    } catch (const std::exception&) {
      port = -1;
    }
    if (port <= 0 || port > 65535)
      return make_error(ec::invalid_request, "group address '" + address + "' has a bad port");
    auto store =
        connect_gloo_store(address.substr(0, colon), static_cast<uint16_t>(port), size, timeout);
    if (!store) return store.error();
    return make_gloo_collective(*store, name, rank, size, bind_host);
  }

 private:
  std::mutex mtx_;
  /// Stores stay up for the process's lifetime: a group may be joined again (a restarted
  /// peer), and they are a few sockets each.
  std::map<std::string, std::shared_ptr<gloo_store>> hosted_;
};

}  // namespace

std::shared_ptr<gpu::group_provider> make_gloo_group_provider() {
  return std::make_shared<gloo_provider>();
}

}  // namespace computron::models
