#pragma once

#include <algorithm>
#include <cstdint>

/// The chunk window of a chunked prefill, the one rule the scheduler (which plans the
/// chunks and counts their tokens: sched/step_plan) and the forward pass (which computes
/// them: engine/torch/chunked_prefill.cpp) must agree on. It lives here, dependency-free, since
/// models/ sits below sched/ and both need it, as the KV block size is shared.
namespace computron {

/// Tokens [begin, end) of one prompt that a step computes.
struct token_window {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t tokens() const { return end - begin; }
};

/// The window of a prompt of `prompt_tokens` in a prefill step that leaves `left` tokens
/// of every prompt for later chunks and computes at most `chunk` (0: the whole prompt in
/// one step). The prompts end together, in the chunk with `left` 0, so a prompt shorter
/// than `left` computes nothing yet, and a chunk computes [n - left - chunk, n - left).
inline token_window prefill_window(int64_t prompt_tokens, int64_t chunk, int64_t left) {
  if (chunk <= 0) return {0, std::max<int64_t>(0, prompt_tokens)};
  return {std::max<int64_t>(0, prompt_tokens - left - chunk),
          std::max<int64_t>(0, prompt_tokens - left)};
}

}  // namespace computron
