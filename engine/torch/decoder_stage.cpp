#include "engine/torch/decoder_stage.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/error.hpp"
#include "engine/torch/decoder_block.hpp"
#include "engine/torch/decoder_stage_impl.hpp"
#include "engine/torch/kv_blocks.hpp"
#include "engine/torch/torch_interop.hpp"
#include "models/lora_adapter.hpp"
#include "models/weights.hpp"

namespace computron::models {

using detail::bad;
using detail::to_torch;

detail::step_inputs detail::left_padded(const std::vector<std::vector<int64_t>>& prompts,
                                        const std::vector<int64_t>& begin,
                                        const std::vector<int64_t>& end, int64_t t) {
  const auto b = static_cast<int64_t>(prompts.size());
  std::vector<int64_t> ids(static_cast<size_t>(b * t), pad_token), pos(ids.size(), 0);
  auto valid = at::zeros({b, t}, at::kBool);
  for (int64_t i = 0; i < b; ++i) {
    const auto r = static_cast<size_t>(i);
    const auto n = end[r] - begin[r];
    const auto pad = t - n;
    for (int64_t j = 0; j < n; ++j) {
      const auto cell = static_cast<size_t>(i * t + pad + j);
      ids[cell] = prompts[r][static_cast<size_t>(begin[r] + j)];
      pos[cell] = begin[r] + j;
    }
    valid.narrow(0, i, 1).narrow(1, pad, n).fill_(true);
  }
  return {at::tensor(ids, at::kLong).view({b, t}), at::tensor(pos, at::kLong).view({b, t}), valid};
}

std::vector<float> host_tensor::to_floats() const {
  auto n = bytes.size() / gpu::size_of(type);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (type == gpu::dtype::f32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      out[i] = type == gpu::dtype::bf16 ? from_bf16(b) : from_f16(b);
    }
  }
  return out;
}

at::Tensor detail::stage_state::param(const std::string& name) const {
  auto e = weights->table().find(name);
  return device_view(base + e->offset_bytes, e->shape, options);
}

at::Tensor detail::stage_state::fused(std::initializer_list<std::string> names) const {
  const gpu::tensor_entry* first = nullptr;
  const gpu::tensor_entry* prev = nullptr;
  int64_t rows = 0;
  for (auto& name : names) {
    auto e = weights->table().find(name);
    if (e == nullptr || e->shape.empty()) return {};
    if (prev != nullptr && (prev->offset_bytes + prev->size_bytes != e->offset_bytes ||
                            !std::equal(prev->shape.begin() + 1, prev->shape.end(),
                                        e->shape.begin() + 1, e->shape.end())))
      return {};
    if (first == nullptr) first = e;
    rows += e->shape[0];
    prev = e;
  }
  if (first == nullptr) return {};
  auto shape = first->shape;
  shape[0] = rows;
  return device_view(base + first->offset_bytes, shape, options);
}

caf::error detail::stage_state::all_reduce(at::Tensor& t) const {
  if (tp->size() == 1) return {};
  auto f = t.to(at::kFloat).contiguous();
  // The collective runs on its own stream (NCCL's), which does not wait for this thread's
  // compute stream (a gpu-let's, or the default one): the sum must read finished values.
  detail::finish_compute(f.device());
  if (auto err = tp->all_reduce_sum(f.data_ptr<float>(), static_cast<uint64_t>(f.numel())))
    return err;
  t = f.to(t.scalar_type());
  return {};
}

at::Tensor detail::stage_state::vocab_lookup(const std::string& name, const at::Tensor& ids) const {
  auto table = param(name);
  if (par.tp == 1) return at::embedding(table, ids);
  auto mine = (ids >= vocab_begin) & (ids < vocab_begin + vocab_rows);
  // Ids outside the slice read row 0 and are zeroed after.
  auto local = at::where(mine, ids - vocab_begin, at::zeros_like(ids));
  return at::embedding(table, local).masked_fill_(mine.logical_not().unsqueeze(-1), 0);
}

caf::expected<at::Tensor> detail::stage_state::gather_vocab(const at::Tensor& local) const {
  if (par.tp == 1) return local;
  auto full = at::zeros({local.size(0), vocab_rows * par.tp},
                        at::TensorOptions().dtype(at::kFloat).device(local.device()));
  full.narrow(1, vocab_begin, vocab_rows).copy_(local);
  if (auto err = all_reduce(full)) return err;
  return full.narrow(1, 0, spec.vocab);
}

namespace {

/// A row's best `k` of [n, m] logits as (logit, column) pairs [n, k, 2] in f32: the first
/// maximum alone for k = 1, otherwise a stable sort, so equal logits keep the lower column
/// first (torch's topk leaves their order open). NaN (a broken model's logit) ranks as
/// -inf: torch would rank it above every number, and the merge needs a strict order. In
/// place: `logits` is the head's own output, and a copy would cost a row per step.
at::Tensor best_columns(at::Tensor logits, int64_t k) {
  // Infinities stay what they are (nan_to_num would make them the largest finite floats):
  // a row of -inf must reach the sampler as -inf, which then draws no number.
  constexpr double inf = std::numeric_limits<double>::infinity();
  logits.nan_to_num_(-inf, inf, -inf);
  at::Tensor values, columns;
  if (k == 1) {
    columns = logits.argmax(1, true);
    values = logits.gather(1, columns);
  } else {
    auto sorted = logits.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
    values = std::get<0>(sorted).narrow(1, 0, k);
    columns = std::get<1>(sorted).narrow(1, 0, k);
  }
  return at::stack({values, columns.to(at::kFloat)}, 2);
}

}  // namespace

caf::expected<at::Tensor> detail::stage_state::top_vocab(const at::Tensor& local, int64_t k) const {
  k = std::clamp<int64_t>(k, 1, spec.vocab);
  // Ids travel as floats, exact up to 2^24: a larger vocabulary gives its whole rows.
  if (spec.vocab >= (int64_t{1} << 24)) return gather_vocab(local);
  if (par.tp == 1) return best_columns(local, k).to(at::kCPU);
  const auto n = local.size(0);
  const auto real = std::clamp<int64_t>(spec.vocab - vocab_begin, 0, vocab_rows);
  const auto mine_k = std::min(k, real);
  auto pairs =
      at::zeros({n, par.tp, k, 2}, at::TensorOptions().dtype(at::kFloat).device(local.device()));
  auto mine = pairs.select(1, shard.tp_rank);
  // Places this rank has no candidate for: -inf with an id past every vocabulary, so they
  // sort after every real one (k <= vocab leaves enough real ones).
  mine.select(2, 0).fill_(-std::numeric_limits<float>::infinity());
  mine.select(2, 1).fill_(static_cast<float>((int64_t{1} << 24) - 1));
  if (mine_k > 0) {
    auto best = best_columns(local.narrow(1, 0, real), mine_k);
    best.select(2, 1).add_(static_cast<float>(vocab_begin));
    mine.narrow(1, 0, mine_k).copy_(best);
  }
  // Every other rank's slot is zeros here, so the sum leaves each rank's pairs as they are.
  if (auto err = all_reduce(pairs)) return err;
  auto host = pairs.to(at::kCPU).contiguous();
  auto out = at::empty({n, k, 2}, at::kFloat);
  const float* p = host.data_ptr<float>();
  float* o = out.data_ptr<float>();
  std::vector<std::pair<float, float>> all(static_cast<size_t>(par.tp * k));
  for (int64_t i = 0; i < n; ++i) {
    for (size_t c = 0; c < all.size(); ++c)
      all[c] = {p[(i * par.tp * k) * 2 + 2 * static_cast<int64_t>(c)],
                p[(i * par.tp * k) * 2 + 2 * static_cast<int64_t>(c) + 1]};
    // Most likely first, the lower id first among equals (a stable sort of the row's
    // logits). No value is NaN (best_columns ranked those as -inf), so this is a strict
    // order.
    std::partial_sort(all.begin(), all.begin() + k, all.end(), [](auto& a, auto& b) {
      return a.first > b.first || (!(b.first > a.first) && a.second < b.second);
    });
    for (int64_t c = 0; c < k; ++c) {
      o[(i * k + c) * 2] = all[static_cast<size_t>(c)].first;
      o[(i * k + c) * 2 + 1] = all[static_cast<size_t>(c)].second;
    }
  }
  return out;
}

decoder_stage::decoder_stage(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
decoder_stage::~decoder_stage() = default;
bool decoder_stage::first() const {
  return impl_->first();
}
bool decoder_stage::last() const {
  return impl_->last();
}
bool decoder_stage::on_gpu() const {
  return impl_->options.device().is_cuda();
}
uint64_t decoder_stage::fused_calls() const {
  return impl_->fused_calls;
}

caf::expected<std::unique_ptr<decoder_stage>> decoder_stage::create(
    const decoder_spec& spec, const parallel_config& par, const shard_index& shard,
    gpu::weight_shard& weights, gpu::collective& tp_group, kv_pool_options kv,
    compute_options compute) {
  if (weights.table().entries().empty()) return bad("the weight shard has no tensors");
  auto type = weights.table().entries().front().type;
  auto layout = shard_layout(spec, type, par, shard);
  if (!layout) return std::move(layout.error());
  // The shard must hold exactly this layout: same names, shapes and offsets.
  const auto& have = weights.table().entries();
  const auto& want = layout->entries();
  if (have.size() != want.size())
    return bad(fmt::format("weight shard has {} tensors, {} expects {}", have.size(), spec.name,
                           want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    if (have[i].name != want[i].name || have[i].shape != want[i].shape ||
        have[i].type != want[i].type || have[i].offset_bytes != want[i].offset_bytes)
      return bad(fmt::format("weight shard tensor {} ('{}') does not match {}'s layout ('{}')", i,
                             have[i].name, spec.name, want[i].name));
  if (tp_group.size() != par.tp || tp_group.rank() != shard.tp_rank)
    return bad(fmt::format("collective is rank {} of {}, the shard is tp rank {} of {}",
                           tp_group.rank(), tp_group.size(), shard.tp_rank, par.tp));
  auto kind = weights.dev().info().kind;
  if (type == gpu::dtype::f16 && kind != gpu::device_kind::cuda)
    return make_error(ec::invalid_configuration,
                      "fp16 needs a CUDA device: use bf16 or f32 on CPUs and emulated devices");
  if (type != gpu::dtype::f32 && type != gpu::dtype::bf16 && type != gpu::dtype::f16)
    return bad(
        fmt::format("decoder weights must be f32, bf16 or f16, not {}", gpu::to_string(type)));
  auto p = std::make_unique<impl>();
  p->spec = spec;
  p->par = par;
  p->shard = shard;
  p->weights = &weights;
  p->tp = &tp_group;
  p->type = type;
  auto device =
      kind == gpu::device_kind::cuda
          ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(weights.dev().info().ordinal))
          : at::Device(at::kCPU);
  p->options = at::TensorOptions().dtype(to_torch(type)).device(device);
  // Activations and KV caches stay inside the workspace the weights' arena left free.
  if (kind == gpu::device_kind::cuda)
    if (auto err = detail::cap_cuda_workspace(weights.dev())) return err;
  std::tie(p->layer_begin, p->layer_end) = stage_layers(spec, par.pp, shard.pp_rank);
  p->local_heads = spec.heads / par.tp;
  // Key/value heads split where tp divides them; otherwise each rank holds one.
  p->local_kv_heads = local_kv_heads(spec, par);
  p->head_dim = spec.head_size();
  p->vocab_rows = vocab_rows(spec.vocab, par.tp);
  p->vocab_begin = shard.tp_rank * p->vocab_rows;
  p->lora_projs = lora_projections(spec);
  for (auto i = p->layer_begin; i < p->layer_end; ++i) {
    auto prefix = fmt::format("layers.{}.", i);
    uint64_t end = 0;
    for (auto& e : want) {
      if (e.name.rfind(prefix, 0) == 0) end = std::max(end, e.offset_bytes + e.size_bytes);
      if (e.name.rfind("embed_", 0) == 0 && p->first())
        end = std::max(end, e.offset_bytes + e.size_bytes);
    }
    p->layer_ready_bytes.push_back(end);
  }
  p->block =
      spec.family == model_family::opt ? detail::make_opt_block(*p) : detail::make_llama_block(*p);
  // Extend steps read the KV blocks in place wherever a build of the kernel runs on the
  // stage's device (stage_state::in_place says for which steps).
  if (kv.paged_attention) {
    if (p->options.device().is_cpu() && type != gpu::dtype::f16)
      p->paged = detail::stage_state::paged_kernel::host;
    else if (p->options.device().is_cuda())
      p->paged = detail::stage_state::paged_kernel::cuda;
  }
  // The fused ops run where a build of them does: the host build on the CPU (not f16),
  // the kernels on CUDA.
  auto build = [&](bool on) {
    if (on && p->options.device().is_cpu() && type != gpu::dtype::f16)
      return detail::stage_state::paged_kernel::host;
    if (on && p->options.device().is_cuda()) return detail::stage_state::paged_kernel::cuda;
    return detail::stage_state::paged_kernel::none;
  };
  p->norms = build(compute.fused_norms);
  p->rope = build(compute.fused_rope);
  if (compute.graph_max_batch > 0) {
    auto& g = *(p->graphs = std::make_unique<detail::graph_state>());
    g.stats.buckets = engine::graph_buckets(compute.graph_max_batch);
    // What a graph's step needs: no collective inside it, attention over the blocks in
    // place, and the keys written by slot (the fused rotary build, or its write alone).
    if (par.tp != 1)
      g.stats.off_because = "the tensor-parallel all-reduce is not captured";
    else if (!p->in_place(1))
      g.stats.off_because = "decode steps do not read the KV blocks in place here";
    else if (p->rope == detail::stage_state::paged_kernel::none)
      g.stats.off_because = "no build of the fused rotary and KV write here";
  }
  p->kv_pool = std::make_shared<detail::kv_block_pool>(
      fmt::format("{} stage {} tp rank {}", spec.name, shard.pp_rank, shard.tp_rank),
      p->layer_end - p->layer_begin, p->local_kv_heads, p->head_dim, p->options, std::move(kv));
  return std::unique_ptr<decoder_stage>{new decoder_stage(std::move(p))};
}

kv_pool_stats decoder_stage::kv_blocks() const {
  return impl_->kv_pool->stats();
}

bool decoder_stage::reads_kv_in_place(int64_t columns) const {
  return impl_->in_place(columns);
}

void decoder_stage::set_kv_spare(int64_t blocks) {
  impl_->kv_pool->set_spare(blocks);
}

namespace {

/// Rows `rows` of a host tensor whose first dimension is the batch, in that order.
host_tensor select_rows(const host_tensor& t, const std::vector<int64_t>& rows) {
  host_tensor out;
  out.type = t.type;
  out.shape = t.shape;
  out.shape[0] = static_cast<int64_t>(rows.size());
  auto row_bytes = t.bytes.size() / static_cast<size_t>(t.shape[0]);
  out.bytes.resize(row_bytes * rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.bytes.data() + i * row_bytes,
                t.bytes.data() + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  return out;
}

}  // namespace

caf::expected<host_tensor> decoder_stage::prefill(const std::vector<std::vector<int64_t>>& prompts,
                                                  const host_tensor* hidden, kv_cache& cache,
                                                  const std::vector<bool>& score, head_output out,
                                                  const std::vector<int64_t>& adapters) {
  if (auto err = impl_->check_adapters(adapters, prompts.size())) return err;
  if (std::find(score.begin(), score.end(), true) != score.end())
    return prefill_rows(prompts, hidden, cache, score, head_output{}, adapters);
  // Each distinct (adapter, prompt) once; `expand` maps every row to its distinct one. The
  // same prompt under another adapter computes other keys and values: never shared.
  std::map<std::pair<int64_t, std::vector<int64_t>>, int64_t> seen;
  std::vector<int64_t> first_rows, expand;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto key = std::make_pair(adapters.empty() ? 0 : adapters[i], prompts[i]);
    auto [at, fresh] = seen.emplace(std::move(key), static_cast<int64_t>(first_rows.size()));
    if (fresh) first_rows.push_back(static_cast<int64_t>(i));
    expand.push_back(at->second);
  }
  if (first_rows.size() == prompts.size())
    return prefill_rows(prompts, hidden, cache, score, out, adapters);
  std::vector<std::vector<int64_t>> distinct;
  std::vector<int64_t> distinct_adapters;
  for (auto r : first_rows) {
    distinct.push_back(prompts[static_cast<size_t>(r)]);
    if (!adapters.empty()) distinct_adapters.push_back(adapters[static_cast<size_t>(r)]);
  }
  host_tensor sub;
  if (hidden != nullptr) {
    if (hidden->shape.empty() || hidden->shape[0] != static_cast<int64_t>(prompts.size()))
      return bad("hidden states do not match the batch");
    sub = select_rows(*hidden, first_rows);
  }
  // Draws are per row, not per distinct prompt: the sampling rank gets the distinct rows'
  // logits whole and its samplers draw from them on the host (a prefill's one step).
  static const std::vector<device_draw> host_draws;
  if (out.draw && out.draws != nullptr) out.draws = &host_draws;
  auto rows = prefill_rows(distinct, hidden ? &sub : nullptr, cache, {}, out, distinct_adapters);
  if (!rows) return rows;
  if (auto err = cache.keep_rows(expand)) return err;
  if (rows->shape.empty()) return rows;  // a rank that does not sample: nothing to expand
  return select_rows(*rows, expand);
}

caf::expected<host_tensor> decoder_stage::prefill_rows(
    const std::vector<std::vector<int64_t>>& prompts, const host_tensor* hidden, kv_cache& cache,
    const std::vector<bool>& score, head_output out, const std::vector<int64_t>& adapters) {
  auto& m = *impl_;
  if (prompts.empty()) return bad("empty batch");
  int64_t t = 0;
  for (auto& pr : prompts) {
    if (pr.empty()) return bad("empty prompt");
    if (m.first())
      if (auto err = m.check_tokens(pr)) return err;
    t = std::max<int64_t>(t, static_cast<int64_t>(pr.size()));
  }
  if (t > m.spec.max_positions)
    return bad(fmt::format("prompt of {} tokens exceeds {}'s {} positions", t, m.spec.name,
                           m.spec.max_positions));
  auto b = static_cast<int64_t>(prompts.size());
  if (auto err = m.bind()) return err;
  auto gate = m.step_gate();
  try {
    at::NoGradGuard no_grad;
    cache.impl_->clear();  // a prefill starts the batch afresh, whatever happens below
    std::vector<int64_t> lengths;
    for (auto& pr : prompts) lengths.push_back(static_cast<int64_t>(pr.size()));
    auto in = detail::left_padded(prompts, std::vector<int64_t>(prompts.size(), 0), lengths, t);
    auto visible = m.prefill_visible(in.valid);
    auto dev_pos = in.positions.to(m.options.device());
    auto input = m.step_input(in, dev_pos, hidden, b, t);
    if (!input) return std::move(input.error());
    at::Tensor x = std::move(*input);
    std::vector<std::pair<int64_t, int64_t>> scored;
    for (size_t i = 0; i < score.size() && i < prompts.size(); ++i)
      if (score[i]) scored.emplace_back(static_cast<int64_t>(i), prompts[i].size());
    auto lora = m.lora_rows(adapters);
    if (!lora) return std::move(lora.error());
    // The prompts' blocks are taken before any layer runs: a pool without room fails the
    // step here, with the cache empty.
    auto kv = detail::plan_prefill(*cache.impl_, m.kv_pool, lengths, t, visible);
    if (!kv) return std::move(kv.error());
    for (size_t i = 0; i < adapters.size(); ++i) cache.impl_->rows[i].adapter = adapters[i];
    return m.run(x, dev_pos, *kv, *lora, out, scored);
  } catch (const std::exception& e) {
    return detail::compute_error(m.spec.name + " prefill", e);
  }
}

caf::expected<host_tensor> decoder_stage::decode(const std::vector<int64_t>& tokens,
                                                 const host_tensor* hidden, kv_cache& cache,
                                                 head_output out) {
  auto& m = *impl_;
  auto& c = *cache.impl_;
  if (c.rows.empty()) return bad("decode before prefill: the cache is empty");
  if (c.pool != m.kv_pool) return bad("decode with a cache of another stage");
  auto b = static_cast<int64_t>(c.rows.size());
  if (static_cast<int64_t>(tokens.size()) != b)
    return bad(fmt::format("decode needs one token per sequence: {} given for a batch of {}",
                           tokens.size(), b));
  if (m.first())
    if (auto err = m.check_tokens(tokens)) return err;
  std::vector<int64_t> next_position;  // each row's new token goes at its length
  for (auto& row : c.rows) {
    if (row.length >= m.spec.max_positions)
      return bad(
          fmt::format("sequence reached {}'s {} positions", m.spec.name, m.spec.max_positions));
    next_position.push_back(row.length);
  }
  if (auto err = m.bind()) return err;
  auto gate = m.step_gate();
  if (m.graphs)
    if (auto done = m.graph_decode(tokens, hidden, c, out)) return std::move(*done);
  try {
    at::NoGradGuard no_grad;
    auto dev = m.options.device();
    auto pos = at::tensor(next_position, at::kLong).view({b, 1}).to(dev);
    at::Tensor x;
    if (m.first()) {
      auto ids = at::tensor(tokens, at::kLong).view({b, 1}).to(dev);
      auto e = m.block->embed(m, ids, pos);
      if (!e) return std::move(e.error());
      x = std::move(*e);
    } else {
      auto h = m.hidden_input(hidden, b, 1);
      if (!h) return std::move(h.error());
      x = *h;
    }
    // A row whose adapter went (detach_adapter) fails the step here, before the plan
    // extends the rows: the cache stays as it was.
    auto lora = m.lora_rows(c);
    if (!lora) return std::move(lora.error());
    // The new positions' blocks are taken before any layer runs: a pool without room
    // fails the step here, with the cache as it was (a bad input above leaves it too).
    auto kv = detail::plan_decode(c, m.in_place(1));
    if (!kv) return std::move(kv.error());
    return m.run(x, pos, *kv, *lora, out);
  } catch (const std::exception& e) {
    return detail::compute_error(m.spec.name + " decode", e);
  }
}

caf::error decoder_stage::capture_graphs() {
  if (!impl_->graphs) return {};
  try {
    return impl_->setup_graphs();
  } catch (const std::exception& e) {
    // Buffers that could not be had (device memory): every step eagerly, as after a
    // failed capture.
    impl_->graphs_off(std::string{"setting the graphs up failed: "} + e.what());
    return {};
  }
}

graph_stats decoder_stage::graphs() const {
  if (!impl_->graphs) return {};
  auto s = impl_->graphs->stats;
  if (!impl_->graphs->ready) s.buckets.clear();
  return s;
}

caf::expected<const void*> decoder_stage::parameter_address(const std::string& name) {
  auto e = impl_->weights->table().find(name);
  if (e == nullptr) return bad(fmt::format("no parameter '{}' in this stage", name));
  if (auto err = impl_->bind()) return err;
  return static_cast<const void*>(impl_->param(name).data_ptr());
}

void set_compute_threads(int threads) {
  if (threads > 0) at::set_num_threads(threads);
}

caf::expected<host_tensor> prefill_logits(const std::vector<decoder_stage*>& stages,
                                          const std::vector<std::vector<int64_t>>& prompts) {
  if (stages.empty()) return bad("no stages");
  std::vector<kv_cache> caches(stages.size());
  host_tensor h;
  for (size_t s = 0; s < stages.size(); ++s) {
    auto out = stages[s]->prefill(prompts, s == 0 ? nullptr : &h, caches[s]);
    if (!out) return out;
    h = std::move(*out);
  }
  return h;
}

caf::expected<std::vector<std::vector<int64_t>>> generate(
    const std::vector<decoder_stage*>& stages, const std::vector<std::vector<int64_t>>& prompts,
    const generate_options& opts) {
  if (stages.empty() || !stages.front()->first() || !stages.back()->last())
    return bad("generate needs the whole pipeline, first stage to last");
  if (opts.max_tokens < 1)
    return bad(fmt::format("max_tokens must be at least 1, got {}", opts.max_tokens));
  if (auto err = validate(opts.sampling)) return err;
  if (!opts.adapters.empty() && opts.adapters.size() != prompts.size())
    return bad(fmt::format("{} adapters for {} prompts", opts.adapters.size(), prompts.size()));
  std::vector<kv_cache> caches(stages.size());
  std::vector<sampler> samplers;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto p = opts.sampling;
    p.seed += i;
    samplers.emplace_back(p);
  }
  std::vector<std::vector<int64_t>> out(prompts.size());
  std::vector<int64_t> next(prompts.size());
  for (int64_t step = 0; step < opts.max_tokens; ++step) {
    host_tensor h;
    for (size_t s = 0; s < stages.size(); ++s) {
      auto* in = s == 0 ? nullptr : &h;
      auto r = step == 0 ? stages[s]->prefill(prompts, in, caches[s], {}, {}, opts.adapters)
                         : stages[s]->decode(next, in, caches[s]);
      if (!r) return std::move(r.error());
      h = std::move(*r);
    }
    auto logits = h.to_floats();
    auto vocab = h.shape.back();
    for (size_t i = 0; i < prompts.size(); ++i) {
      next[i] = samplers[i].next(logits.data() + static_cast<int64_t>(i) * vocab, vocab);
      out[i].push_back(next[i]);
    }
  }
  return out;
}

}  // namespace computron::models
