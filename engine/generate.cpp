#include "engine/generate.hpp"

#include <future>
#include <string>
#include <utility>

#include "common/error.hpp"

namespace computron::engine {

caf::expected<std::vector<std::vector<int64_t>>> generate(
    const std::vector<std::vector<std::shared_ptr<runner>>>& stages,
    const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens,
    const row_sampling& sampling) {
  if (prompts.empty() || max_tokens < 1)
    return make_error(ec::invalid_request, "need at least one prompt and one token");
  if (stages.empty() || stages.front().empty())
    return make_error(ec::invalid_request, "a model of no stages runs nothing");
  const size_t tp = stages.front().size();
  for (auto& s : stages)
    if (s.size() != tp)
      return make_error(ec::invalid_request, "stages of different tensor-parallel widths");
  // The same plans the dispatch core makes: the rows' whole prompts, then one token each.
  std::vector<row_sampling> rows(prompts.size(), sampling);
  for (size_t r = 0; r < rows.size(); ++r) rows[r].seed = sampling.seed + r;
  auto in = prefill_step(1, prompts, std::move(rows));
  std::vector<std::vector<int64_t>> out(prompts.size());
  for (int64_t step = 0; step < max_tokens; ++step) {
    in.last = step + 1 == max_tokens;
    std::vector<step_output> hidden(tp);
    for (size_t stage = 0; stage < stages.size(); ++stage) {
      std::vector<std::future<caf::expected<step_output>>> runs;
      for (size_t r = 0; r < tp; ++r) {
        auto* s = stages[stage][r].get();
        const models::host_tensor* h = stage == 0 ? nullptr : &hidden[r].hidden;
        runs.push_back(std::async(std::launch::async, [s, &in, h] { return s->step(in, h); }));
      }
      caf::error first_error;
      for (size_t r = 0; r < tp; ++r) {
        auto res = runs[r].get();
        if (!res) {
          if (!first_error) first_error = res.error();
        } else {
          hidden[r] = std::move(*res);
        }
      }
      if (first_error) {
        // The runners that ran the step still hold the batch: it ends everywhere.
        for (auto& s : stages)
          for (auto& r : s) r->end_batch(in.plan.batch);
        return first_error;
      }
    }
    auto& next = hidden[0].tokens;
    if (next.size() != out.size())
      return make_error(ec::invalid_state, "a step sampled " + std::to_string(next.size()) +
                                               " tokens for " + std::to_string(out.size()) +
                                               " rows");
    for (size_t r = 0; r < out.size(); ++r) out[r].push_back(next[r]);
    next_decode_step(in, next);
  }
  return out;
}

}  // namespace computron::engine
