// A stage's decode graphs (compute_options::graph_max_batch): a decode step of up to a
// bucket's rows runs over buffers whose addresses never change (engine/graph_inputs.hpp),
// so that on CUDA one graph per bucket, captured once, replays every step: the layers'
// hundreds of launches become one, and the host does no per-layer work. What changes per
// step reaches the graph through memory it reads, never through its arguments:
// - the block table, limits, slots, positions and tokens: one copy into the bucket's
//   input buffer before each replay;
// - the KV pool's chunks, which come and go: a table of their addresses per layer
//   (kv_block_pool::chunk_table), copied again only when a chunk came or went;
// - the context length: attention's split-K count is the bucket's, fixed, and each row
//   divides its own reach (paged_attention_args::splits_by_reach);
// - the weights: their addresses are reserved once per shard, so a graph captured before
//   a load (even before the first) replays after any eviction and reload.
// On the CPU nothing is captured and the same step runs eagerly over the same buffers:
// that is how the tests check what a graph computes.
#include <algorithm>
#include <cstring>
#include <numeric>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "common/log.hpp"
#include "engine/torch/decoder_stage_impl.hpp"

#ifdef COMPUTRON_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace computron::models {

namespace {

/// Positions a bucket's rows may reach: longer rows decode eagerly. The block table is
/// copied to the device whole at every step, so its width costs per step.
constexpr int64_t graph_positions = 8192;

static_assert(sizeof(engine::paged_kv_chunk) == 3 * sizeof(int64_t),
              "the chunk table travels as int64 triples");

}  // namespace

std::shared_mutex& detail::capture_gate(int index) {
  static std::shared_mutex gates[64];
  return gates[static_cast<size_t>(std::clamp(index, 0, 63))];
}

void decoder_stage::impl::graphs_off(std::string why) {
  if (!graphs || !graphs->stats.off_because.empty()) return;
  log::warn("{} stage {} tp rank {}: decode steps run without CUDA graphs from now on: {}",
            spec.name, shard.pp_rank, shard.tp_rank, why);
  graphs->stats.off_because = std::move(why);
  graphs->ready = false;
  // The buffers, the graphs and their pool's memory go; nothing reads them any more.
  graphs->buckets.clear();
  graphs->chunk_table = at::Tensor{};
}

caf::expected<at::Tensor> decoder_stage::impl::graph_forward(detail::graph_bucket& g) {
  auto positions = g.inputs.narrow(0, g.host.positions_at(), g.rows).view({g.rows, 1});
  at::Tensor x;
  if (first()) {
    auto ids = g.inputs.narrow(0, g.host.tokens_at(), g.rows).view({g.rows, 1});
    auto e = block->embed(*this, ids, positions);
    if (!e) return std::move(e.error());
    x = std::move(*e);
  } else {
    x = g.hidden;
  }
  for (auto i = layer_begin; i < layer_end; ++i) {
    auto y = block->layer(*this, i, x, positions, g.kv);
    if (!y) return std::move(y.error());
    x = std::move(*y);
  }
  if (!last()) return x;
  return block->head(*this, x.select(1, 0));
}

caf::error decoder_stage::impl::setup_graphs() {
  auto& gs = *graphs;
  if (gs.ready || !gs.stats.off_because.empty()) return {};
  const auto dev = options.device();
  const auto long_on = at::TensorOptions().dtype(at::kLong).device(dev);
  gs.width = static_cast<int32_t>(
      (std::min(spec.max_positions, graph_positions) + kv_block_tokens - 1) / kv_block_tokens);
  gs.chunk_table = at::zeros({kv_pool->layers() * engine::paged_max_chunks * 3}, long_on);
  gs.chunk_version = ~uint64_t{0};
  // A graph holds the weights' addresses: those of the shard's reserved range, resident
  // or not.
  base = weights->reserved_address();
  std::vector<int32_t> every_chunk(engine::paged_max_chunks);
  std::iota(every_chunk.begin(), every_chunk.end(), 0);
  gs.buckets.clear();
  for (auto size : gs.stats.buckets) {
    detail::graph_bucket g;
    g.rows = size;
    engine::shape_graph_inputs(g.host, size, gs.width);
    engine::fill_graph_inputs(g.host, {}, static_cast<int32_t>(kv_block_tokens),
                              engine::paged_max_chunks, detail::pad_token);
    g.inputs = at::tensor(g.host.all, at::kLong).to(dev);
#ifdef COMPUTRON_TORCH_CUDA
    if (dev.is_cuda()) {
      g.staged = at::empty({g.host.size()}, at::kLong).pin_memory();
      g.copied = std::make_shared<at::cuda::CUDAEvent>();
    }
#endif
    if (!first()) g.hidden = at::zeros({size, 1, spec.hidden}, options);
    auto& kv = g.kv;
    kv.pool = kv_pool.get();
    kv.rows = size;
    kv.in_place = true;
    kv.chunks = every_chunk;
    kv.table.assign(static_cast<size_t>(g.host.limits_at()), 0);
    kv.limits.assign(static_cast<size_t>(size), 0);
    kv.slots.assign(static_cast<size_t>(size), -1);
    if (!dev.is_cpu()) kv.on_device = g.inputs;
    kv.read_blocks = gs.width;
    kv.read_positions = gs.width * kv_block_tokens;
    kv.chunk_table = reinterpret_cast<const engine::paged_kv_chunk*>(gs.chunk_table.data_ptr());
    gs.buckets.push_back(std::move(g));
  }
#ifdef COMPUTRON_TORCH_CUDA
  if (dev.is_cuda()) {
    at::NoGradGuard no_grad;
    // No other step on this device allocates while the captures run (capture_gate).
    std::unique_lock<std::shared_mutex> gate{detail::capture_gate(dev.index())};
    c10::cuda::CUDAGuard device_guard(dev.index());
    auto side = c10::cuda::getStreamFromPool(false, dev.index());
    c10::cuda::CUDAStreamGuard stream_guard(side);
    // First uses outside the capture: cuBLAS's workspace for this stream.
    auto probe = at::ones({8, 8}, options);
    (void)at::matmul(probe, probe);
    side.synchronize();
    auto pool = at::cuda::graph_pool_handle();
    // Largest first: the smaller buckets' activations fit in the memory the larger ones'
    // captures took from the shared pool.
    for (auto g = gs.buckets.rbegin(); g != gs.buckets.rend(); ++g) {
      auto graph = std::make_shared<at::cuda::CUDAGraph>();
      std::string failed;
      try {
        // Thread-local: the copy lanes' transfers on other threads go on while this
        // thread captures (their copies allocate nothing of libtorch's); other steps on
        // the device wait at the gate.
        graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
        caf::expected<at::Tensor> out = at::Tensor{};
        // A capture that CUDA invalidated throws from capture_end before libtorch ends its
        // allocation to the pool: the allocator would stay in capture mode (no frees of
        // other streams' blocks, no retry on a full device). Ending it again where it did
        // end throws, and is caught. (The pool's memory stays: graphs are off then.)
        auto end_capture = [&] {
          try {
            graph->capture_end();
          } catch (...) {
            try {
              c10::cuda::CUDACachingAllocator::endAllocateToPool(dev.index(), pool);
            } catch (...) {
            }
            throw;
          }
        };
        try {
          out = graph_forward(*g);
        } catch (...) {
          try {
            end_capture();
          } catch (...) {
          }
          throw;
        }
        end_capture();
        if (!out)
          failed = render(out.error());
        else
          g->out = std::move(*out);
      } catch (const std::exception& e) {
        failed = std::string{e.what()}.substr(0, 300);
      }
      if (!failed.empty()) {
        (void)cudaGetLastError();  // a failed capture leaves its error behind
        graphs_off(fmt::format("capturing the {}-row bucket failed: {}", g->rows, failed));
        gs.buckets.clear();
        return {};
      }
      g->graph = graph;
    }
    side.synchronize();
  }
#endif
  gs.ready = true;
  return {};
}

std::optional<caf::expected<host_tensor>> decoder_stage::impl::graph_decode(
    const std::vector<int64_t>& tokens, const host_tensor* hidden, detail::kv_cache_rows& c,
    head_output out) {
  auto& gs = *graphs;
  if (!gs.ready) return std::nullopt;
  const auto b = static_cast<int64_t>(c.rows.size());
  std::vector<int32_t> sizes;
  for (auto& g : gs.buckets) sizes.push_back(g.rows);
  const auto size = engine::graph_bucket_for(sizes, b);
  auto eager = [&]() -> std::optional<caf::expected<host_tensor>> {
    ++gs.stats.eager_steps;
    return std::nullopt;
  };
  // Rows with an adapter, rows past the table, a pool whose chunks (or its next one) lie
  // past the chunk table, a gpu-let's stream (a graph captured on the whole device does not
  // replay into a green context) and weights still loading (the eager step computes each
  // layer as its bytes arrive) run eagerly.
  if (size == 0 || (options.device().is_cuda() && detail::on_external_compute_stream()) ||
      weights->state() != gpu::residency::resident)
    return eager();
  for (auto& row : c.rows)
    if (row.adapter != 0 || row.length + 1 > int64_t{gs.width} * kv_block_tokens) return eager();
  if (kv_pool->slot_bound() > engine::paged_max_chunks) {
    if (!gs.told_slots)
      log::info(
          "{} stage {}: decode steps run eagerly while the KV pool's chunks lie past the "
          "{} a graph's chunk table holds",
          spec.name, shard.pp_rank, engine::paged_max_chunks);
    gs.told_slots = true;
    return eager();
  }
  auto& g =
      *std::find_if(gs.buckets.begin(), gs.buckets.end(), [&](auto& x) { return x.rows == size; });
  try {
    at::NoGradGuard no_grad;
    at::Tensor h;
    if (!first()) {
      auto in = hidden_input(hidden, b, 1);
      if (!in) return caf::expected<host_tensor>{std::move(in.error())};
      h = std::move(*in);
    }
    // The new positions' blocks: a pool without room fails the step here, with the cache
    // as it was (as the eager step's plan does).
    if (auto err = detail::extend_rows_by_one(c)) return caf::expected<host_tensor>{err};
    std::vector<engine::graph_row> rows;
    rows.reserve(c.rows.size());
    for (size_t r = 0; r < c.rows.size(); ++r)
      rows.push_back({&c.rows[r].blocks, c.rows[r].length, first() ? tokens[r] : 0});
    if (auto why = engine::fill_graph_inputs(g.host, rows, static_cast<int32_t>(kv_block_tokens),
                                             engine::paged_max_chunks, detail::pad_token))
      throw std::logic_error(fmt::format("a graph step's inputs: {}", why));
    const auto dev = options.device();
    if (auto v = kv_pool->chunk_version(); v != gs.chunk_version) {
      auto table = kv_pool->chunk_table();
      auto host = at::from_blob(table.data(), {static_cast<int64_t>(table.size()) * 3}, at::kLong);
      gs.chunk_table.copy_(host);  // blocking: `table` goes when this returns
      gs.chunk_version = v;
    }
    if (dev.is_cpu()) {
      std::memcpy(g.inputs.data_ptr<int64_t>(), g.host.all.data(),
                  g.host.all.size() * sizeof(int64_t));
      auto at = [&](int64_t i) { return g.host.all.begin() + i; };
      std::copy(at(g.host.table_at()), at(g.host.limits_at()), g.kv.table.begin());
      std::copy(at(g.host.limits_at()), at(g.host.slots_at()), g.kv.limits.begin());
      std::copy(at(g.host.slots_at()), at(g.host.positions_at()), g.kv.slots.begin());
    } else {
#ifdef COMPUTRON_TORCH_CUDA
      // The last copy out of `staged` must be done before it is written again (a step that
      // failed, or answered nothing, did not wait for its stream).
      auto* copied = static_cast<at::cuda::CUDAEvent*>(g.copied.get());
      copied->synchronize();
      std::memcpy(g.staged.data_ptr<int64_t>(), g.host.all.data(),
                  g.host.all.size() * sizeof(int64_t));
      g.inputs.copy_(g.staged, /*non_blocking=*/true);
      // On the stream of the inputs' device, which need not be the thread's current one.
      copied->record(c10::cuda::getCurrentCUDAStream(g.inputs.device().index()));
#endif
    }
    if (h.defined()) g.hidden.narrow(0, 0, b).copy_(h.view({b, 1, spec.hidden}));
#ifdef COMPUTRON_TORCH_CUDA
    if (g.graph) {
      try {
        static_cast<at::cuda::CUDAGraph*>(g.graph.get())->replay();
      } catch (const std::exception& e) {
        // A graph that cannot replay will not next time either: this step fails, the next
        // ones run eagerly.
        auto err = detail::compute_error(spec.name + " decode (a graph's replay)", e);
        graphs_off("a replay failed: " + std::string{e.what()}.substr(0, 300));
        return caf::expected<host_tensor>{std::move(err)};
      }
    } else
#endif
    {
      auto y = graph_forward(g);
      if (!y) return caf::expected<host_tensor>{std::move(y.error())};
      g.out = std::move(*y);
    }
    ++gs.stats.replays;
    auto rows_out = g.out.narrow(0, 0, b);
    if (!last()) return caf::expected<host_tensor>{detail::to_host(rows_out)};
    return head_result(rows_out, out, false);
  } catch (const std::exception& e) {
    return caf::expected<host_tensor>{detail::compute_error(spec.name + " decode", e)};
  }
}

}  // namespace computron::models
