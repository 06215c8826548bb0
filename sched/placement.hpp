#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

/// Where a model goes that names no devices of its own: the scheduler's choice, a plain
/// function of what is placed where, so that the runtime and the simulator agree.
namespace computron::sched {

/// `shards` distinct devices for a model's shards: those with the most room left after
/// the shards already placed there (usable_bytes[d] - placed_bytes[d], counted by the
/// shards' bytes whether resident or not), ties to the lower index. Returned in
/// ascending order, so that a stage's tensor-parallel ranks sit on neighbouring devices.
/// Devices whose usable_bytes is 0 (gone, or unknown) are never chosen. Empty when fewer
/// than `shards` devices qualify (or shards is 0).
std::vector<int32_t> spread_placement(size_t shards, const std::vector<uint64_t>& usable_bytes,
                                      const std::vector<uint64_t>& placed_bytes);

/// A whole model an adapter may name as its base: its name and where its weights are.
struct base_candidate {
  std::string name;
  std::string weights_path;
};

/// The model a LoRA adapter's `base` names, among `served` (whole models registered) and
/// `coming` (being registered): one by that name; else one whose weights are at that path;
/// else one named as the path's last part (a hub id such as "org/Llama-3.2-1B" names the
/// model served as Llama-3.2-1B), or whose folder is so named. PEFT's
/// base_model_name_or_path is whatever the trainer had, so a model stands for it only when
/// exactly one fits. One being registered that fits is the answer too (its adapter waits
/// for it). Where none fits, `base` is a path or hub id (it holds a '/') and one model is
/// served, that one: vLLM's rule (its adapters are all of the one model it serves; a wrong
/// base is still refused by the adapter's shapes). A plain name is the operator's own word
/// and must name a model. Empty: none, or several.
std::string match_base(const std::string& base, const std::vector<base_candidate>& served,
                       const std::vector<base_candidate>& coming = {});

}  // namespace computron::sched
