#include "sched/placement.hpp"

#include <algorithm>
#include <string>

namespace computron::sched {

std::vector<int32_t> spread_placement(size_t shards, const std::vector<uint64_t>& usable_bytes,
                                      const std::vector<uint64_t>& placed_bytes) {
  std::vector<int32_t> candidates;
  for (size_t d = 0; d < usable_bytes.size(); ++d)
    if (usable_bytes[d] > 0) candidates.push_back(static_cast<int32_t>(d));
  if (shards == 0 || candidates.size() < shards) return {};
  auto room = [&](int32_t d) {
    auto i = static_cast<size_t>(d);
    auto placed = i < placed_bytes.size() ? placed_bytes[i] : 0;
    // Signed: a device already promised more than it holds has the least room.
    return static_cast<double>(usable_bytes[i]) - static_cast<double>(placed);
  };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int32_t a, int32_t b) { return room(a) > room(b); });
  candidates.resize(shards);
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

namespace {

std::string last_part(std::string p) {
  while (!p.empty() && p.back() == '/') p.pop_back();
  auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string trimmed(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

std::string match_base(const std::string& base, const std::vector<base_candidate>& served,
                       const std::vector<base_candidate>& coming) {
  for (auto& m : served)
    if (m.name == base) return base;
  std::vector<std::string> at_path, by_name;
  for (auto& m : served) {
    if (!m.weights_path.empty() && trimmed(m.weights_path) == trimmed(base))
      at_path.push_back(m.name);
    else if (m.name == last_part(base) ||
             (!m.weights_path.empty() && last_part(m.weights_path) == last_part(base)))
      by_name.push_back(m.name);
  }
  if (at_path.size() == 1) return at_path.front();
  if (at_path.empty() && by_name.size() == 1) return by_name.front();
  for (auto& m : coming)
    if (m.name == base || m.name == last_part(base) ||
        (!m.weights_path.empty() && (trimmed(m.weights_path) == trimmed(base) ||
                                     last_part(m.weights_path) == last_part(base))))
      return m.name;
  if (base.find('/') != std::string::npos && at_path.empty() && by_name.empty() &&
      served.size() == 1)
    return served.front().name;
  return {};
}

}  // namespace computron::sched
