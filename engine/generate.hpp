#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <caf/expected.hpp>

#include "engine/runner.hpp"
#include "engine/step.hpp"

/// The reference generate loop: a model's runners stepped in order without actors or a
/// scheduler, over the plans the dispatch core would make for one batch (prefill_step, then
/// next_decode_step). `computron generate` runs it, and the served outputs are compared with
/// it. actors::direct_generate builds the runners from a model kind.
namespace computron::engine {

/// Generates `max_tokens` tokens for every prompt. `stages[s][r]` is stage s's runner of
/// tensor-parallel rank r (every stage has the same ranks); the ranks of a stage run in
/// threads, each handing its hidden states to the same rank of the next stage. Row r samples
/// with `sampling`, its seed plus r. Errors: the first rank's error of the first stage that
/// fails; no prompt, or no token asked for (invalid_request).
caf::expected<std::vector<std::vector<int64_t>>> generate(
    const std::vector<std::vector<std::shared_ptr<runner>>>& stages,
    const std::vector<std::vector<int64_t>>& prompts, int64_t max_tokens,
    const row_sampling& sampling);

}  // namespace computron::engine
