// A prefill in chunks: each step computes the next `chunk` tokens of every prompt (the
// prompts end together), so that a running batch's decode steps go between the chunks.
// The first chunk is a prefill of the prompts' first tokens (the cache is empty); a later
// chunk extends the rows' blocks as decode does with one token (kv_cache.cpp's
// plan_extend), its queries reading the rows' gathered keys.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>

#include "common/prefill_window.hpp"
#include "engine/torch/decoder_stage.hpp"
#include "engine/torch/decoder_stage_impl.hpp"

namespace computron::models {

using detail::bad;

namespace {

int64_t longest(const std::vector<std::vector<int64_t>>& prompts) {
  size_t n = 0;
  for (auto& p : prompts) n = std::max(n, p.size());
  return static_cast<int64_t>(n);
}

}  // namespace

bool first_prefill_chunk(const std::vector<std::vector<int64_t>>& prompts, int64_t left,
                         int64_t chunk) {
  return left + chunk >= longest(prompts);
}

caf::expected<host_tensor> decoder_stage::prefill_chunk(
    const std::vector<std::vector<int64_t>>& prompts, int64_t left, int64_t chunk,
    const host_tensor* hidden, kv_cache& cache, head_output out,
    const std::vector<int64_t>& adapters) {
  auto& m = *impl_;
  auto& c = *cache.impl_;
  if (prompts.empty()) return bad("empty batch");
  if (auto err = m.check_adapters(adapters, prompts.size())) return err;
  if (chunk <= 0)
    return bad(fmt::format("a prefill chunk needs at least one token, not {}", chunk));
  if (left < 0) return bad(fmt::format("a prefill chunk cannot leave {} tokens", left));
  for (auto& pr : prompts) {
    if (pr.empty()) return bad("empty prompt");
    if (m.first())
      if (auto err = m.check_tokens(pr)) return err;
  }
  if (longest(prompts) > m.spec.max_positions)
    return bad(fmt::format("prompt of {} tokens exceeds {}'s {} positions", longest(prompts),
                           m.spec.name, m.spec.max_positions));
  const auto b = static_cast<int64_t>(prompts.size());
  const bool fresh = first_prefill_chunk(prompts, left, chunk);
  if (!fresh) {
    if (c.rows.empty()) return bad("a later prefill chunk before the first: the cache is empty");
    if (c.pool != m.kv_pool) return bad("a prefill chunk with a cache of another stage");
    if (static_cast<int64_t>(c.rows.size()) != b)
      return bad(
          fmt::format("a prefill chunk of {} prompts with a cache of {} rows", b, c.rows.size()));
    // The first chunk set the rows' adapters: a later one may repeat them, not change them.
    for (size_t i = 0; i < adapters.size(); ++i)
      if (adapters[i] != c.rows[i].adapter)
        return bad(fmt::format(
            "a prefill chunk runs prompt {} with adapter {}, but its first chunk set adapter {}", i,
            adapters[i], c.rows[i].adapter));
  }
  // Each row's tokens [begin, end) in this chunk (the scheduler's window, common/
  // prefill_window.hpp); a later chunk starts where the cache ends.
  std::vector<int64_t> begin, end, added;
  int64_t t = 0;
  for (int64_t i = 0; i < b; ++i) {
    const auto w =
        prefill_window(static_cast<int64_t>(prompts[static_cast<size_t>(i)].size()), chunk, left);
    begin.push_back(w.begin);
    end.push_back(w.end);
    added.push_back(end.back() - begin.back());
    t = std::max(t, added.back());
    const auto held = fresh ? 0 : c.rows[static_cast<size_t>(i)].length;
    if (held != begin.back())
      return bad(fmt::format("prefill chunk starts prompt {} at token {}, but its cache holds {}",
                             i, begin.back(), held));
  }
  if (t == 0)
    return bad(
        fmt::format("a prefill chunk leaving {} tokens computes none of prompts of {} at most",
                    left, longest(prompts)));
  if (auto err = m.bind()) return err;
  auto gate = m.step_gate();
  try {
    at::NoGradGuard no_grad;
    auto in = detail::left_padded(prompts, begin, end, t);
    auto dev_pos = in.positions.to(m.options.device());
    auto input = m.step_input(in, dev_pos, hidden, b, t);
    if (!input) return std::move(input.error());
    at::Tensor x = std::move(*input);
    // A later chunk's rows run with the adapters their first chunk set.
    auto lora = fresh ? m.lora_rows(adapters) : m.lora_rows(c);
    if (!lora) return std::move(lora.error());
    // The chunk's blocks are taken before any layer runs: a pool without room fails the
    // step here, with a later chunk's cache as it was.
    auto kv = fresh ? detail::plan_prefill(c, m.kv_pool, end, t, m.prefill_visible(in.valid))
                    : detail::plan_extend(c, added, t, m.in_place(t));
    if (!kv) return std::move(kv.error());
    if (fresh)
      for (size_t i = 0; i < adapters.size(); ++i) c.rows[i].adapter = adapters[i];
    return m.run(x, dev_pos, *kv, *lora, out, {}, /*logits=*/left == 0);
  } catch (const std::exception& e) {
    return detail::compute_error(m.spec.name + " prefill chunk", e);
  }
}

}  // namespace computron::models
