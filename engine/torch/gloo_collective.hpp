#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/expected.hpp>

#include "gpu/collective.hpp"

/// Tensor-parallel collectives on CPUs: Gloo through libtorch's c10d ProcessGroupGloo,
/// so ranks can live in different threads, processes or machines. Rendezvous goes
/// through a c10d TCP store that rank 0 hosts; its address is handed to the other ranks
/// by the caller (later: in CAF messages).
namespace computron::models {

/// The rendezvous store. Opaque here so that callers stay torch-free.
class gloo_store {
 public:
  virtual ~gloo_store() = default;
  /// The port the store listens on (useful when it was hosted on port 0).
  virtual uint16_t port() const = 0;
};

/// Hosts the store on `host`:`port` (0: any free port) for a group of `world_size`.
caf::expected<std::shared_ptr<gloo_store>> host_gloo_store(const std::string& host, uint16_t port,
                                                           int world_size,
                                                           std::chrono::milliseconds timeout);

/// A store for ranks that are threads of this process (c10d's in-memory HashStore): no
/// rendezvous socket, so nothing of c10d's TCP store (whose client connections to its
/// libuv server hung now and then here when several ranks connected at once) between them.
/// Gloo's own pairs still meet over TCP on the bind address.
std::shared_ptr<gloo_store> local_gloo_store(std::chrono::milliseconds timeout);

/// Connects to a store hosted by another rank.
caf::expected<std::shared_ptr<gloo_store>> connect_gloo_store(const std::string& host,
                                                              uint16_t port, int world_size,
                                                              std::chrono::milliseconds timeout);

/// Joins group `prefix` (several groups can share one store) as `rank` of `size`, with
/// Gloo's TCP transport bound to `bind_address`. Blocks until every rank joined or the
/// store's timeout passed.
caf::expected<std::unique_ptr<gpu::collective>> make_gloo_collective(
    std::shared_ptr<gloo_store> store, const std::string& prefix, int rank, int size,
    const std::string& bind_address = "127.0.0.1");

/// The cross-process group provider of shard workers (gpu::group_provider) over Gloo.
std::shared_ptr<gpu::group_provider> make_gloo_group_provider();

}  // namespace computron::models
