// LoRA adapters in the forward pass (issue 47): a stage attaches adapters cut for its
// rank (slice_lora_adapter, in a weight shard of its device) and reads them in place; each
// step groups its rows by adapter once, and every adapted projection adds, per group, the
// delta (x A^T) B^T to the rows of that group (S-LoRA's and Punica's batching of many
// adapters in one step, written with gathers and matrix products instead of their kernels).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string_view>

#include "common/error.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "engine/torch/decoder_stage_impl.hpp"
#include "engine/torch/kv_blocks.hpp"
#include "engine/torch/torch_interop.hpp"
#include "models/lora_adapter.hpp"

namespace computron::models {

namespace {

caf::error bad_adapter(int64_t id, const std::string& what) {
  return make_error(ec::invalid_configuration,
                    fmt::format("LoRA adapter {} does not fit this stage: {}", id, what));
}

/// The layer a tensor named "layers.<n>...." belongs to, or -1.
int64_t layer_of(const std::string& name) {
  constexpr std::string_view prefix = "layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  int64_t n = 0;
  size_t i = prefix.size();
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) n = n * 10 + (name[i] - '0');
  return n;
}

std::string shape_string(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, " x "));
}

/// Above this many bytes a step's adapters are stacked per projection and step instead of
/// kept: the kept copy lies outside the ledger's accounting (a few rank-16 adapters of a
/// small base are a few MB; 8B-class ones, 84 MB each in bf16, are not kept).
constexpr uint64_t max_stacked_bytes = 64ull << 20;

}  // namespace

std::pair<at::Tensor, at::Tensor> detail::stack_site(const std::vector<lora_group>& groups,
                                                     size_t site) {
  std::vector<at::Tensor> as, bs;
  for (auto& g : groups) {
    const auto& [a, b] = (*g.pairs)[site];
    if (!a.defined()) continue;
    as.push_back(a);
    bs.push_back(b);
  }
  if (as.empty()) return {};
  return {at::cat(as, 0), at::cat(bs, 1)};
}

at::Tensor detail::stage_state::project(const at::Tensor& x, int64_t i, const char* proj,
                                        const at::Tensor& w, const at::Tensor* bias) const {
  auto y = bias != nullptr ? at::linear(x, w, *bias) : at::linear(x, w);
  add_lora(y, x, i, proj);
  return y;
}

std::vector<at::Tensor> detail::stage_state::project_fused(
    const at::Tensor& x, int64_t i, std::initializer_list<const char*> projs,
    std::initializer_list<std::string> weights, std::initializer_list<std::string> biases) const {
  auto w = fused(weights);
  auto b = biases.size() > 0 ? fused(biases) : at::Tensor{};
  std::vector<at::Tensor> out;
  if (!w.defined() || (biases.size() > 0 && !b.defined())) {
    // Not side by side (a layout of another order): one product each.
    auto wi = weights.begin();
    auto bi = biases.begin();
    for (auto proj : projs) {
      auto bias = bi != biases.end() ? param(*bi++) : at::Tensor{};
      out.push_back(project(x, i, proj, param(*wi++), bias.defined() ? &bias : nullptr));
    }
    return out;
  }
  auto y = b.defined() ? at::linear(x, w, b) : at::linear(x, w);
  std::vector<int64_t> rows;
  for (auto& name : weights) rows.push_back(this->weights->table().find(name)->shape[0]);
  out = y.split_with_sizes(rows, -1);
  // Each slice is a view of y: its adapter delta is added in place.
  auto proj = projs.begin();
  for (auto& part : out) add_lora(part, x, i, *proj++);
  return out;
}

void detail::stage_state::add_lora(at::Tensor& y, const at::Tensor& x, int64_t i,
                                   const char* proj) const {
  if (lora == nullptr) return;  // a step without adapter rows: the plain projection
  size_t p = 0;
  while (p < lora_projs.size() && lora_projs[p] != proj) ++p;
  if (p == lora_projs.size()) return;
  const auto at = static_cast<size_t>(i - layer_begin) * lora_projs.size() + p;
  auto& groups = lora->groups;
  if (groups.size() >= 2 && groups.size() <= 64) {
    // Several adapters: one pass for all of them (BGMV's shape, with library products).
    // x [A_1; A_2; ...]^T gives every row every adapter's r columns; a row keeps its own
    // adapter's (the mask), and the product with [B_1 B_2 ...]^T adds exactly its delta.
    // Four operators per projection whatever the number of adapters, where a group each
    // costs four (a gather, two products, a scatter): the extra columns are r-wide, a
    // small price beside the projection itself.
    uint64_t key = 0;
    for (size_t g = 0; g < groups.size(); ++g)
      if ((*groups[g].pairs)[at].first.defined()) key |= uint64_t{1} << g;
    if (key == 0) return;
    auto [a_all, b_all] = lora->stacks ? lora->stacks->sites[at] : stack_site(groups, at);
    // The columns each row drops (true: another adapter's), set to exactly zero: a
    // product would turn another adapter's overflow (inf) into NaN in the row.
    auto& drop = lora->masks[key];
    if (!drop.defined()) {
      drop = at::ones({x.size(0), a_all.size(0)}, x.options().dtype(at::kBool));
      int64_t col = 0;
      for (size_t g = 0; g < groups.size(); ++g) {
        if ((key >> g & 1) == 0) continue;
        const auto r = (*groups[g].pairs)[at].first.size(0);
        auto cols = drop.narrow(1, col, r);
        if (groups[g].rows.defined())
          cols.index_fill_(0, groups[g].rows, false);
        else
          cols.fill_(false);
        col += r;
      }
      // Rows of x are batch positions; any middle dimensions (a prompt's tokens) share
      // their row's mask.
      for (int64_t d = 2; d < x.dim(); ++d) drop = drop.unsqueeze(1);
    }
    y.add_(at::linear(at::linear(x, a_all).masked_fill_(drop, 0), b_all));
    return;
  }
  for (auto& g : groups) {
    const auto& [a, b] = (*g.pairs)[at];
    if (!a.defined()) continue;
    // In the activations' dtype, which is the stage's and the adapter's (attach_adapter
    // refuses another): as PEFT's forward runs lora_A and lora_B in the adapter's dtype
    // and adds their product to the base's output. f32 on CPUs; bf16/f16 round the
    // r-wide intermediate once more than a merged weight would.
    if (!g.rows.defined()) {
      y.add_(at::linear(at::linear(x, a), b));
    } else {
      // Rows are distinct, so each output element receives one sum: deterministic on
      // every device (no two atomics meet).
      y.index_add_(0, g.rows, at::linear(at::linear(x.index_select(0, g.rows), a), b));
    }
  }
}

caf::error decoder_stage::impl::check_adapters(const std::vector<int64_t>& ids, size_t rows) const {
  if (ids.empty()) return {};
  if (ids.size() != rows)
    return detail::bad(fmt::format("{} adapter ids for a batch of {} prompts", ids.size(), rows));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == 0) continue;
    if (ids[i] < 0)
      return detail::bad(
          fmt::format("prompt {} names adapter {}: ids are positive (0: the base)", i, ids[i]));
    if (adapters.count(ids[i]) == 0)
      return detail::bad(
          fmt::format("prompt {} names LoRA adapter {}, which is not attached to {} "
                      "stage {} tp rank {}",
                      i, ids[i], spec.name, shard.pp_rank, shard.tp_rank));
  }
  return {};
}

caf::expected<detail::lora_batch> decoder_stage::impl::lora_rows(const std::vector<int64_t>& ids) {
  detail::lora_batch out;
  if (std::all_of(ids.begin(), ids.end(), [](int64_t id) { return id == 0; })) return out;
  // Rows by adapter, in the order adapters first appear; rows ascending in each.
  std::vector<std::pair<int64_t, std::vector<int64_t>>> by_id;
  for (size_t r = 0; r < ids.size(); ++r) {
    if (ids[r] == 0) continue;
    auto g = std::find_if(by_id.begin(), by_id.end(), [&](auto& e) { return e.first == ids[r]; });
    if (g == by_id.end()) g = by_id.insert(by_id.end(), {ids[r], {}});
    g->second.push_back(static_cast<int64_t>(r));
  }
  std::vector<int64_t> all_rows;
  std::vector<std::pair<int64_t, int64_t>> spans;  // per group: (begin, count), count 0: all
  for (auto& [id, rows] : by_id) {
    auto found = adapters.find(id);
    if (found == adapters.end())
      return detail::bad(fmt::format(
          "row {} runs with LoRA adapter {}, which is no longer attached to {} stage {} tp rank {}",
          rows.front(), id, spec.name, shard.pp_rank, shard.tp_rank));
    auto& a = found->second;
    // Its bytes must be on the device before any layer reads them.
    if (auto err = a.weights->wait_loaded(detail::layer_wait))
      return with_context(err, fmt::format("LoRA adapter {} is not loaded", id));
    auto p = a.weights->device_data();
    if (!p) return with_context(p.error(), fmt::format("LoRA adapter {} is not loaded", id));
    if (*p != a.bound) {
      a.pairs.assign(a.entries.size(), {});
      for (size_t k = 0; k < a.entries.size(); ++k) {
        auto [ea, eb] = a.entries[k];
        if (ea == nullptr) continue;
        a.pairs[k] = {detail::device_view(*p + ea->offset_bytes, ea->shape, options),
                      detail::device_view(*p + eb->offset_bytes, eb->shape, options)};
      }
      a.bound = *p;
    }
    out.groups.push_back({at::Tensor{}, &a.pairs});
    if (rows.size() == ids.size()) {
      spans.emplace_back(0, 0);  // every row: no gather, no scatter
    } else {
      spans.emplace_back(static_cast<int64_t>(all_rows.size()), static_cast<int64_t>(rows.size()));
      all_rows.insert(all_rows.end(), rows.begin(), rows.end());
    }
  }
  if (out.groups.size() >= 2 && out.groups.size() <= 64) {
    // Decode steps of one batch run the same adapters in the same order step after step:
    // their stacks are made once and kept while they do.
    std::vector<std::pair<int64_t, const std::byte*>> key;
    uint64_t bytes = 0;
    for (auto& [id, rows] : by_id) {
      auto& a = adapters.at(id);
      key.emplace_back(id, a.bound);
      bytes += a.weights->size_bytes();
    }
    if (lora_stacked && lora_stacked->key == key) {
      out.stacks = lora_stacked;
    } else if (bytes <= max_stacked_bytes) {
      auto made = std::make_shared<detail::lora_stacks>();
      made->key = std::move(key);
      const auto sites = adapters.at(by_id.front().first).pairs.size();
      for (size_t k = 0; k < sites; ++k) made->sites.push_back(detail::stack_site(out.groups, k));
      lora_stacked = made;
      out.stacks = std::move(made);
    } else {
      lora_stacked.reset();
    }
  }
  if (!all_rows.empty()) {
    // One copy to the device for every group's rows.
    auto dev = at::tensor(all_rows, at::kLong).to(options.device());
    for (size_t g = 0; g < spans.size(); ++g)
      if (spans[g].second > 0) out.groups[g].rows = dev.narrow(0, spans[g].first, spans[g].second);
  }
  return out;
}

caf::expected<detail::lora_batch> decoder_stage::impl::lora_rows(
    const detail::kv_cache_rows& cache) {
  auto adapted = [](const detail::kv_cache_rows::row& r) { return r.adapter != 0; };
  if (std::none_of(cache.rows.begin(), cache.rows.end(), adapted)) return detail::lora_batch{};
  std::vector<int64_t> ids;
  for (auto& r : cache.rows) ids.push_back(r.adapter);
  return lora_rows(ids);
}

caf::error decoder_stage::attach_adapter(int64_t id, gpu::weight_shard& weights, int64_t rank) {
  auto& m = *impl_;
  if (id <= 0)
    return detail::bad(
        fmt::format("a LoRA adapter id must be positive (0 is the base), not {}", id));
  if (m.adapters.count(id) != 0)
    return detail::bad(fmt::format("LoRA adapter id {} is attached already", id));
  if (rank <= 0)
    return detail::bad(fmt::format("LoRA adapter {}: rank {} is not positive", id, rank));
  if (&weights.dev() != &m.weights->dev())
    return bad_adapter(id, "its weight shard is on another device than the stage's weights");
  // This stage's adapted projections: the stem of each base weight ("layers.3.mlp.up_proj")
  // with its place in lora_group::pairs and the base tensor it adapts.
  struct site {
    size_t slot;
    const gpu::tensor_entry* base;
  };
  std::map<std::string, site> sites;
  const auto nproj = m.lora_projs.size();
  for (auto i = m.layer_begin; i < m.layer_end; ++i)
    for (size_t p = 0; p < nproj; ++p) {
      auto name = detail::lora_param_name(m.spec, i, m.lora_projs[p]);
      auto* e = m.weights->table().find(name);
      if (e == nullptr) continue;
      sites[name.substr(0, name.size() - std::string_view(".weight").size())] = {
          static_cast<size_t>(i - m.layer_begin) * nproj + p, e};
    }
  detail::attached_adapter a;
  a.weights = &weights;
  a.rank = rank;
  a.entries.assign(static_cast<size_t>(m.layer_end - m.layer_begin) * nproj, {nullptr, nullptr});
  for (auto& e : weights.table().entries()) {
    const auto& name = e.name;
    constexpr std::string_view suffix_a = ".lora_A", suffix_b = ".lora_B";
    auto ends = [&](std::string_view s) {
      return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    const bool is_a = ends(suffix_a);
    if (!is_a && !ends(suffix_b))
      return bad_adapter(id, fmt::format("tensor '{}' is no LoRA A or B (names end in .lora_A "
                                         "or .lora_B)",
                                         name));
    auto stem = name.substr(0, name.size() - suffix_a.size());
    auto s = sites.find(stem);
    if (s == sites.end()) {
      auto layer = layer_of(name);
      if (layer >= 0 && (layer < m.layer_begin || layer >= m.layer_end))
        return bad_adapter(id,
                           fmt::format("tensor '{}' is of layer {}, outside this stage's layers "
                                       "[{}, {}) (another pipeline stage's slice?)",
                                       name, layer, m.layer_begin, m.layer_end));
      return bad_adapter(id, fmt::format("tensor '{}' adapts no projection of {} ({})", name,
                                         m.spec.name, fmt::join(m.lora_projs, ", ")));
    }
    if (e.type != m.type)
      return bad_adapter(id, fmt::format("tensor '{}' is {}, the stage runs {}", name,
                                         gpu::to_string(e.type), gpu::to_string(m.type)));
    auto& base = *s->second.base;
    // This rank's cut of the base weight [out x in]: A [r x in], B [out x r].
    std::vector<int64_t> want = is_a ? std::vector<int64_t>{rank, base.shape[1]}
                                     : std::vector<int64_t>{base.shape[0], rank};
    if (e.shape != want)
      return bad_adapter(id, fmt::format("tensor '{}' is {}, this rank's {} {} with r {} needs {}",
                                         name, shape_string(e.shape), base.name,
                                         shape_string(base.shape), rank, shape_string(want)));
    auto& slot = a.entries[s->second.slot];
    (is_a ? slot.first : slot.second) = &e;
  }
  for (auto& [stem, s] : sites) {
    auto [ea, eb] = a.entries[s.slot];
    if ((ea == nullptr) != (eb == nullptr))
      return bad_adapter(id, fmt::format("{} has {} without {}", stem, ea ? "lora_A" : "lora_B",
                                         ea ? "lora_B" : "lora_A"));
  }
  m.adapters.emplace(id, std::move(a));
  return {};
}

caf::error decoder_stage::detach_adapter(int64_t id) {
  if (impl_->adapters.erase(id) == 0)
    return detail::bad(fmt::format("LoRA adapter {} is not attached to this stage", id));
  // The id may be attached again with other bytes at the same address.
  impl_->lora_stacked.reset();
  return {};
}

void decoder_stage::drop_adapter_stacks() {
  impl_->lora_stacked.reset();
}

std::vector<int64_t> decoder_stage::adapters() const {
  std::vector<int64_t> out;
  for (auto& [id, a] : impl_->adapters) out.push_back(id);
  return out;
}

}  // namespace computron::models
