#include "gpu/collective.hpp"

#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include "common/error.hpp"

namespace computron::gpu {

namespace {

class solo final : public collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  caf::error all_reduce_sum(float*, uint64_t) override { return {}; }
};

/// What the ranks of one in-process group share. The last rank to arrive sums every
/// buffer and writes the result back to all of them; the others wait for the round to
/// advance (a generation counter, so a fast rank cannot join the next round early).
struct local_group_state {
  explicit local_group_state(int n) : size(n), buffers(static_cast<size_t>(n), nullptr) {}
  const int size;
  std::mutex mtx;
  std::condition_variable cv;
  std::vector<float*> buffers;
  std::vector<bool> joined = std::vector<bool>(static_cast<size_t>(size), false);
  uint64_t count = 0;
  int arrived = 0;
  uint64_t generation = 0;
  bool broken = false;
  std::string why_broken;
};

class local_member final : public collective {
 public:
  local_member(std::shared_ptr<local_group_state> st, std::string name, int rank,
               std::chrono::milliseconds timeout)
      : st_(std::move(st)), name_(std::move(name)), rank_(rank), timeout_(timeout) {}

  ~local_member() override {
    std::lock_guard<std::mutex> guard{st_->mtx};
    st_->joined[static_cast<size_t>(rank_)] = false;
  }

  int rank() const override { return rank_; }
  int size() const override { return st_->size; }

  caf::error all_reduce_sum(float* data, uint64_t count) override {
    auto& s = *st_;
    std::unique_lock<std::mutex> lock{s.mtx};
    if (s.broken) return make_error(ec::device_error, s.why_broken);
    if (s.arrived == 0) {
      s.count = count;
    } else if (s.count != count) {
      s.broken = true;
      s.why_broken = "local group " + name_ + ": ranks passed different element counts";
      s.cv.notify_all();
      return make_error(ec::device_error, s.why_broken);
    }
    s.buffers[static_cast<size_t>(rank_)] = data;
    if (++s.arrived == s.size) {
      // Sum into the first buffer, then copy it to every other one.
      float* acc = s.buffers[0];
      for (size_t r = 1; r < s.buffers.size(); ++r)
        for (uint64_t i = 0; i < count; ++i) acc[i] += s.buffers[r][i];
      for (size_t r = 1; r < s.buffers.size(); ++r) std::copy(acc, acc + count, s.buffers[r]);
      s.arrived = 0;
      ++s.generation;
      s.cv.notify_all();
      return {};
    }
    auto gen = s.generation;
    if (!s.cv.wait_for(lock, timeout_, [&] { return s.generation != gen || s.broken; })) {
      s.broken = true;
      s.why_broken = "local group " + name_ + ": a rank did not arrive within " +
                     std::to_string(timeout_.count()) + " ms";
      s.cv.notify_all();
    }
    if (s.broken && s.generation == gen) return make_error(ec::device_error, s.why_broken);
    return {};
  }

 private:
  std::shared_ptr<local_group_state> st_;
  std::string name_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

std::mutex registry_mtx;
std::map<std::string, std::weak_ptr<local_group_state>> registry;

}  // namespace

std::unique_ptr<collective> make_solo_collective() {
  return std::make_unique<solo>();
}

caf::expected<std::unique_ptr<collective>> join_local_group(const std::string& name, int rank,
                                                            int size,
                                                            std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size)
    return make_error(ec::invalid_configuration, "local group " + name + ": rank " +
                                                     std::to_string(rank) + " of size " +
                                                     std::to_string(size));
  std::lock_guard<std::mutex> guard{registry_mtx};
  for (auto i = registry.begin(); i != registry.end();)
    i = i->second.expired() ? registry.erase(i) : std::next(i);
  auto& slot = registry[name];
  auto st = slot.lock();
  if (!st) {
    st = std::make_shared<local_group_state>(size);
    slot = st;
  }
  std::lock_guard<std::mutex> member_guard{st->mtx};
  if (st->size != size)
    return make_error(ec::invalid_configuration, "local group " + name + " has size " +
                                                     std::to_string(st->size) + ", not " +
                                                     std::to_string(size));
  if (st->joined[static_cast<size_t>(rank)])
    return make_error(ec::invalid_configuration,
                      "local group " + name + ": rank " + std::to_string(rank) + " joined twice");
  st->joined[static_cast<size_t>(rank)] = true;
  return std::unique_ptr<collective>{std::make_unique<local_member>(st, name, rank, timeout)};
}

}  // namespace computron::gpu
