#pragma once

#include <cstdint>
#include <iterator>
#include <set>
#include <vector>

/// The names of a model's KV blocks, as the dispatch core hands them to rows (vLLM's block
/// ids): every step plan names the blocks each row gains (planned_row::blocks), and each
/// shard's runner keeps the rows' tables of them (engine/runner.hpp). One id space per
/// model: the same id names the block of every stage and rank of a replica, each in its own
/// pool. The ledger counts the blocks (sched/ledger.hpp); this only names them.
namespace computron::sched {

class kv_block_ids {
 public:
  /// `n` ids, the lowest free ones first (so that a pool's later chunks drain).
  std::vector<uint32_t> take(size_t n);
  /// The ids are free again. An id that is not held is ignored (a row's table given back
  /// twice costs nothing).
  void give_back(const std::vector<uint32_t>& ids);
  /// Ids held now.
  size_t held() const { return next_ - free_.size(); }
  /// One past the highest id ever named.
  uint32_t bound() const { return next_; }

 private:
  /// Free ids below next_ (ids from next_ on were never named).
  std::set<uint32_t> free_;
  uint32_t next_ = 0;
};

}  // namespace computron::sched
