#pragma once

#include <cstdint>

/// The size of a KV block, the unit in which the ledger counts KV memory and the block
/// store of models/ allocates it. Header-only and dependency-free, so that models/ and
/// sched/ share the one rule.
namespace computron::sched {

/// Tokens one KV block holds (vLLM's default block size): a sequence's keys and values
/// live in ceil(tokens / kv_block_tokens) blocks of each stage, listed in its block table.
inline constexpr int64_t kv_block_tokens = 16;

/// Blocks a sequence of `tokens` positions holds.
inline int64_t kv_blocks_for(int64_t tokens) {
  return tokens <= 0 ? 0 : (tokens + kv_block_tokens - 1) / kv_block_tokens;
}

}  // namespace computron::sched
