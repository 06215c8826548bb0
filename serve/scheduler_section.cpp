// The serve config's scheduling sections: `scheduler` (the residency ledger and loads),
// `batching` (how requests become batches) and `frontend` (what is admitted).
#include <chrono>
#include <limits>

#include "serve/json_fields.hpp"
#include "serve/sections.hpp"

namespace computron::serve {

caf::error read_scheduler(const nlohmann::json& file, const std::string& where, serve_config& c) {
  auto s = file.find("scheduler");
  if (s == file.end()) return {};
  auto sw = where + " scheduler";
  auto& sched = c.runtime.scheduler;
  caf::error e;
  if ((e = check_keys(
           *s, sw,
           {"policy", "max_transfers_per_link", "workspace_mb", "load_timeout_s", "prefetch",
            "compute_while_loading", "kv_in_ledger", "kv_reserve_mb", "max_lora_rank"})))
    return e;
  double ws = 0, kv_reserve = 0;
  int64_t timeout_s = 300;
  if ((e = read(*s, "policy", sw, sched.ledger.policy)) ||
      (e = read(*s, "max_transfers_per_link", sw, sched.ledger.max_transfers_per_link)) ||
      (e = read(*s, "workspace_mb", sw, ws)) || (e = read(*s, "load_timeout_s", sw, timeout_s)) ||
      (e = read(*s, "prefetch", sw, sched.ledger.prefetch)) ||
      (e = read(*s, "compute_while_loading", sw, sched.ledger.compute_while_loading)) ||
      (e = read(*s, "kv_in_ledger", sw, c.runtime.registry.kv_in_ledger)) ||
      (e = read(*s, "kv_reserve_mb", sw, kv_reserve)) ||
      (e = read(*s, "max_lora_rank", sw, c.runtime.registry.max_lora_rank)))
    return e;
  if (c.runtime.registry.max_lora_rank < 1 || c.runtime.registry.max_lora_rank > 4096)
    return bad(sw, "max_lora_rank must be from 1 to 4096");
  if ((e = mib_to_bytes(kv_reserve, sw, "kv_reserve_mb", sched.ledger.kv_reserve_bytes))) return e;
  if ((e = mib_to_bytes(ws, sw, "workspace_mb", sched.workspace_bytes)) ||
      (e = check_time(timeout_s, 10'000'000, sw, "load_timeout_s")))
    return e;
  sched.load_timeout = std::chrono::seconds(timeout_s);
  return {};
}

caf::error read_batching(const nlohmann::json& file, const std::string& where, serve_config& c) {
  auto b = file.find("batching");
  if (b == file.end()) return {};
  auto bw = where + " batching";
  caf::error e;
  if ((e = check_keys(
           *b, bw,
           {"max_batch_size", "batch_window_ms", "dispatch", "max_wait_ms", "max_queue",
            "max_tokens", "deadline_ms", "continuous", "prefill_chunk", "late_grace_ms"})))
    return e;
  auto& m = c.runtime.manager;
  auto& bo = m.batching;
  auto ms = [](sched::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  int64_t window = ms(bo.batch_window), max_wait = ms(bo.max_wait),
          deadline = ms(bo.default_deadline), grace = ms(bo.late_grace);
  if ((e = read(*b, "max_batch_size", bw, bo.max_batch_size)) ||
      (e = read(*b, "batch_window_ms", bw, window)) ||
      (e = read(*b, "dispatch", bw, bo.dispatch)) || (e = read(*b, "max_wait_ms", bw, max_wait)) ||
      (e = read(*b, "max_queue", bw, bo.max_queue)) ||
      (e = read(*b, "max_tokens", bw, m.max_tokens_limit)) ||
      (e = read(*b, "deadline_ms", bw, deadline)) ||
      (e = read(*b, "continuous", bw, bo.continuous)) ||
      (e = read(*b, "prefill_chunk", bw, bo.prefill_chunk)) ||
      (e = read(*b, "late_grace_ms", bw, grace)))
    return e;
  if (window < 0 || max_wait < 0 || deadline <= 0 || grace < 0)
    return bad(bw, "times must be positive");
  if (m.max_tokens_limit < 0 || m.max_tokens_limit > std::numeric_limits<int32_t>::max())
    return bad(bw, "max_tokens must be 0 (no limit: each model's context) or a positive count");
  constexpr int64_t max_ms = 1'000'000'000;
  if ((e = check_time(window, max_ms, bw, "batch_window_ms")) ||
      (e = check_time(max_wait, max_ms, bw, "max_wait_ms")) ||
      (e = check_time(deadline, max_ms, bw, "deadline_ms")) ||
      (e = check_time(grace, max_ms, bw, "late_grace_ms")))
    return e;
  bo.late_grace = std::chrono::milliseconds(grace);
  bo.batch_window = std::chrono::milliseconds(window);
  bo.max_wait = std::chrono::milliseconds(max_wait);
  bo.default_deadline = std::chrono::milliseconds(deadline);
  return {};
}

caf::error read_frontend(const nlohmann::json& file, const std::string& where, serve_config& c) {
  auto f = file.find("frontend");
  if (f == file.end()) return {};
  auto fw = where + " frontend";
  auto& front = c.runtime.frontend;
  caf::error e;
  if ((e = check_keys(*f, fw, {"max_outstanding_per_model", "max_outstanding"}))) return e;
  if ((e = read(*f, "max_outstanding_per_model", fw, front.max_outstanding_per_model)) ||
      (e = read(*f, "max_outstanding", fw, front.max_outstanding)))
    return e;
  return {};
}

}  // namespace computron::serve
