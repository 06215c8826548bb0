#include "gpu/collective.hpp"

namespace computron::gpu {

namespace {

class solo final : public collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  caf::error all_reduce_sum(float*, uint64_t) override { return {}; }
};

}  // namespace

std::unique_ptr<collective> make_solo_collective() {
  return std::make_unique<solo>();
}

}  // namespace computron::gpu
