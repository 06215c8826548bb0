#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/type_id.hpp>
#include <caf/typed_actor.hpp>

#include "actors/atoms.hpp"
#include "actors/step_messages.hpp"

/// Every message struct of the actor protocol. Each has an inspect() so that it crosses
/// processes unchanged (distribution reuses these actors over CAF's middleman).
namespace computron::actors {

/// A model as an operator declares it (repository config.json or the serve config).
struct model_config {
  std::string name;
  /// "opt" (the OPT decoder, models/), "llama" (the Llama family: Llama, Mistral, Qwen2,
  /// Qwen3) or "toy" (a tiny deterministic model for tests and overhead benchmarks; no
  /// torch).
  std::string kind = "opt";
  /// Catalogue shape for "opt" and "llama" (opt-125m, llama-3.2-1b, ...); ignored by
  /// "toy". With `shape` or `arch` set it only names the shape (a Hugging Face folder's
  /// model).
  std::string spec;
  /// An OPT shape outside the catalogue (read from a Hugging Face config.json):
  /// {hidden, layers, heads, ffn, vocab, max_positions}; empty: `spec` names a catalogue
  /// entry.
  std::vector<int64_t> shape;
  /// A decoder shape of any family outside the catalogue, as the JSON object of
  /// models::to_json(decoder_spec) (a Hugging Face Llama-family folder's config.json,
  /// read at registration); empty: `shape` or `spec` says it.
  std::string arch;
  /// "f32", "bf16" or "f16" (f16 needs CUDA devices), or "auto": the checkpoint's dtype
  /// where the devices run it, else bf16 (settled at registration, see resolve_dtype).
  std::string dtype = "bf16";
  /// The dtype the checkpoint stores ("f16", ...); weights are converted once at
  /// registration when it differs from `dtype`. Empty when unknown or seeded.
  std::string checkpoint_dtype;
  int32_t tp = 1;
  int32_t pp = 1;
  /// Device of each shard, index pp_rank * tp + tp_rank; distinct devices. Empty: the
  /// registry places it (sched::spread_placement, the devices with the most room left).
  std::vector<int32_t> devices;
  /// Seed of the random weights when there is no checkpoint.
  uint64_t seed = 0;
  /// Optional checkpoint of the unsharded model (empty: seeded weights): one of our
  /// safetensors files, or a Hugging Face OPT folder (config.json, model.safetensors or
  /// shards with model.safetensors.index.json).
  std::string weights_path;
  /// Bytes of each shard of a "toy" model.
  uint64_t toy_shard_bytes = 1 << 20;
  /// Emulated compute of a "toy" model: one forward step holds the model's devices this
  /// long in all (each pipeline stage 1/pp of it), as a GPU would be busy. Lets the
  /// experiments reproduce the original's measured exec time without its GPUs.
  double toy_compute_ms = 0;
  /// Never chosen as an eviction victim.
  bool pinned = false;
  /// Priority class: a higher class is evicted after every lower one and its queue is
  /// served first (0 by default).
  int32_t priority = 0;
  /// Its tokenizer (models/tokenizer): a folder with tokenizer.json or vocab.json +
  /// merges.txt, a tokenizer.json file, or "bytes" (the built-in byte-level one). Empty:
  /// none, and the model takes token ids only.
  std::string tokenizer;
  /// Its latency objective for one request, milliseconds (0: none): what automatic
  /// gpu-lets size its share for (sched::plan_gpulets).
  int64_t slo_ms = 0;
  /// A LoRA adapter's: the registered model it adapts; `weights_path` is then its PEFT
  /// folder (adapter_config.json, adapter_model.safetensors), or nothing for a toy base.
  /// The registry gives it the base's kind, shape, dtype, split and devices: it is a
  /// resident of the same ledger beside its base (sched::placement::base). Empty: a whole
  /// model.
  std::string base;
  /// A LoRA adapter's largest rank accepted (vLLM's --max-lora-rank): the registry sets it
  /// from its options, so that every worker that reads the folder refuses the same ranks.
  /// 0: models::lora_limits' default.
  int32_t max_lora_rank = 0;
  /// Decode steps of up to this many rows replay a CUDA graph captured per batch-size
  /// bucket (engine/graph_inputs.hpp) at registration; larger batches, and every step where
  /// a capture failed, run eagerly. 0: every step eagerly. CUDA devices only; at most 256.
  int32_t cuda_graph_max_batch = 32;
};

/// model_config's fields, listed once: the members in order (fields) and, at the same
/// index, each one's name and whether it decides the shards' bytes (model_config_fields).
/// inspect (what crosses processes), same_weights and the field names come from here, so a
/// new field is added in these two lists and nowhere else.
struct config_field {
  const char* name;
  /// Its value decides what a shard holds: a worker keeps a prepared shard of the same
  /// name only when every such field is equal (same_weights).
  bool shapes_weights;
};
inline constexpr std::array<config_field, 21> model_config_fields{{
    {"name", false},
    {"kind", true},
    {"spec", true},
    {"shape", true},
    {"arch", true},
    {"dtype", true},
    {"checkpoint_dtype", true},
    {"tp", true},
    {"pp", true},
    {"devices", true},
    {"seed", true},
    {"weights_path", true},
    {"toy_shard_bytes", true},
    {"toy_compute_ms", true},
    {"pinned", false},
    {"priority", false},
    {"tokenizer", false},
    {"slo_ms", false},
    {"base", true},
    {"max_lora_rank", false},
    {"cuda_graph_max_batch", false},
}};

template <class Config>
auto fields(Config& x) {
  return std::tie(x.name, x.kind, x.spec, x.shape, x.arch, x.dtype, x.checkpoint_dtype, x.tp, x.pp,
                  x.devices, x.seed, x.weights_path, x.toy_shard_bytes, x.toy_compute_ms, x.pinned,
                  x.priority, x.tokenizer, x.slo_ms, x.base, x.max_lora_rank,
                  x.cuda_graph_max_batch);
}
static_assert(std::tuple_size_v<decltype(fields(std::declval<model_config&>()))> ==
                  model_config_fields.size(),
              "model_config: fields() and model_config_fields list the same members");

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_config& x) {
  return std::apply(
      [&](auto&... member) { return f(caf::meta::type_name("model_config"), member...); },
      fields(x));
}

namespace detail {
template <size_t... I>
bool same_weights(const model_config& a, const model_config& b, std::index_sequence<I...>) {
  auto x = fields(a);
  auto y = fields(b);
  return ((!model_config_fields[I].shapes_weights || std::get<I>(x) == std::get<I>(y)) && ...);
}
}  // namespace detail

/// Equal in every field that decides the shards' bytes (config_field::shapes_weights):
/// the name, pinning, priority and tokenizer may differ.
inline bool same_weights(const model_config& a, const model_config& b) {
  return detail::same_weights(a, b, std::make_index_sequence<model_config_fields.size()>{});
}

/// One shard of a model, as handed to the worker that will hold it.
struct shard_spec {
  model_config model;
  int32_t tp_rank = 0;
  int32_t pp_rank = 0;
  /// Where the tensor-parallel group meets when its ranks live on different nodes
  /// ("host:port" of the rendezvous store rank 0's worker hosts); empty when every rank
  /// is in one process (they meet in memory).
  std::string group_address;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_spec& x) {
  return f(caf::meta::type_name("shard_spec"), x.model, x.tp_rank, x.pp_rank, x.group_address);
}

/// What a worker reports after preparing a shard's host copy.
struct shard_report {
  std::string model;
  int32_t device = 0;
  uint64_t bytes = 0;
  /// False when pinned host memory was not available (loads run slower).
  bool host_pinned = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_report& x) {
  return f(caf::meta::type_name("shard_report"), x.model, x.device, x.bytes, x.host_pinned);
}

/// One shard's part of a load or an eviction.
struct transfer_report {
  std::string model;
  int32_t device = 0;
  uint64_t bytes = 0;
  /// Wall time on the worker, queueing behind earlier transfers excluded.
  double seconds = 0;
  /// The device's largest free block after the transfer (the scheduler plans with it:
  /// a shard needs one block); -1 when unknown.
  int64_t largest_free_bytes = -1;
  /// Bytes of pages the device has mapped after the transfer (weights and KV of every
  /// model): what the ledger's figure for the device is checked against.
  uint64_t mapped_bytes = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, transfer_report& x) {
  return f(caf::meta::type_name("transfer_report"), x.model, x.device, x.bytes, x.seconds,
           x.largest_free_bytes, x.mapped_bytes);
}

/// A device as its worker sees it.
struct device_report {
  int32_t device = 0;
  std::string name;
  /// "emulated" or "cuda".
  std::string kind;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  /// Of the scheduler's budget for the device: bytes running batches' KV blocks hold
  /// (filled by the manager from the ledger; the worker does not know them).
  uint64_t kv_bytes = 0;
  double link_gbps = 0;
  /// Shards held in host memory, and which of them are on the device.
  std::vector<std::string> shards;
  std::vector<std::string> resident;
  uint64_t loads = 0;
  uint64_t bytes_loaded = 0;
  double load_seconds = 0;
  /// The node that holds the device ("local" in-process, else its host:port), and
  /// whether the controller reaches it now.
  std::string node = "local";
  bool online = true;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_report& x) {
  return f(caf::meta::type_name("device_report"), x.device, x.name, x.kind, x.capacity_bytes,
           x.used_bytes, x.kv_bytes, x.link_gbps, x.shards, x.resident, x.loads, x.bytes_loaded,
           x.load_seconds, x.node, x.online);
}

/// Where a model's shards live and how big they are (index pp_rank * tp + tp_rank).
struct model_placement {
  std::string model;
  std::vector<int32_t> devices;
  std::vector<uint64_t> bytes;
  bool pinned = false;
  /// Priority class (see model_config::priority).
  int32_t priority = 0;
  /// Bytes of one KV block on each shard (engine::kv_block_bytes); empty: its KV is not
  /// counted in blocks (an engine that caches nothing, or not in blocks).
  std::vector<uint64_t> kv_block_bytes{};
  /// A LoRA adapter's base (model_config::base); empty: a whole model.
  std::string base{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_placement& x) {
  return f(caf::meta::type_name("model_placement"), x.model, x.devices, x.bytes, x.pinned,
           x.priority, x.kv_block_bytes, x.base);
}

/// Permission to run batches on a resident model until release.
struct lease {
  std::string model;
  /// True when this acquire waited for a load (a swap).
  bool loaded = false;
  double wait_ms = 0;
  /// What a load of this model costs unhindered: its slowest shard's bytes over that
  /// link's nominal rate (sched::ledger::load_seconds), for service estimates. Not a
  /// measurement: the first loads on a fresh emulated device run at half speed (page
  /// faults), and a measured estimate that high made the manager drop every drop_late
  /// request of a model that was not resident, so it never loaded again to learn better.
  double load_estimate_ms = 0;
  /// Every model resident at the grant, for the manager's view of residency (evictions
  /// happen behind it); empty when unchanged since the last lease.
  std::vector<std::string> resident;
  /// Granted while the model still loads (compute while loading): the first step also
  /// waits for the model's bytes, layer by layer.
  bool loading = false;
  /// While loading: what the load still takes at nominal rates (when to start the batch).
  double load_left_ms = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lease& x) {
  return f(caf::meta::type_name("lease"), x.model, x.loaded, x.wait_ms, x.load_estimate_ms,
           x.resident, x.loading, x.load_left_ms);
}

/// Where a model stands, on every message that says so; rendered as text (to_string) at
/// the HTTP and console edges only (Triton's states there: replies.cpp).
enum class model_lifecycle : uint8_t {
  /// Not known to whoever answered (a report that came without the scheduler's view).
  unknown,
  /// Its shards are being prepared on their workers.
  registering,
  /// Registration failed (model_info::reason says why); it holds nothing.
  failed,
  /// Its residency, as the swap scheduler keeps it.
  offloaded,
  loading,
  resident,
  evicting,
  /// A device's node is gone (reason says which).
  unavailable,
  unregistering,
  /// The reply to an unregister.
  unregistered,
  /// A repository folder that is not registered.
  unloaded,
};

/// The state's name ("offloaded", "resident", ...).
constexpr const char* to_string(model_lifecycle s) {
  switch (s) {
    case model_lifecycle::unknown:
      return "unknown";
    case model_lifecycle::registering:
      return "registering";
    case model_lifecycle::failed:
      return "failed";
    case model_lifecycle::offloaded:
      return "offloaded";
    case model_lifecycle::loading:
      return "loading";
    case model_lifecycle::resident:
      return "resident";
    case model_lifecycle::evicting:
      return "evicting";
    case model_lifecycle::unavailable:
      return "unavailable";
    case model_lifecycle::unregistering:
      return "unregistering";
    case model_lifecycle::unregistered:
      return "unregistered";
    case model_lifecycle::unloaded:
      return "unloaded";
  }
  return "unknown";
}

/// The scheduler's view of one model.
struct residency_report {
  std::string model;
  /// offloaded, loading, resident, evicting or unavailable.
  model_lifecycle state = model_lifecycle::unknown;
  uint64_t bytes = 0;
  uint32_t leases = 0;
  bool pinned = false;
  uint64_t loads = 0;
  uint64_t evictions = 0;
  /// Recent arrivals per second (what the cost-aware policy weighs).
  double demand_per_s = 0;
  /// Seconds since a batch last used it (-1: never).
  double idle_s = -1;
  /// Why it cannot serve (state "unavailable"); else empty.
  std::string reason;
  /// KV blocks its running batches hold (on each of its shards), and their bytes summed
  /// over its shards.
  uint64_t kv_blocks = 0;
  uint64_t kv_bytes = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, residency_report& x) {
  return f(caf::meta::type_name("residency_report"), x.model, x.state, x.bytes, x.leases, x.pinned,
           x.loads, x.evictions, x.demand_per_s, x.idle_s, x.reason, x.kv_blocks, x.kv_bytes);
}

/// The scheduler's accounting of one device.
struct device_usage {
  int32_t device = 0;
  uint64_t capacity_bytes = 0;
  /// Weights' bytes (resident or loading), and KV blocks' bytes: one budget.
  uint64_t used_bytes = 0;
  uint32_t transfers = 0;
  uint64_t kv_bytes = 0;
  /// The device's page: a shard takes its bytes rounded up to whole pages.
  uint64_t page_bytes = 1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_usage& x) {
  return f(caf::meta::type_name("device_usage"), x.device, x.capacity_bytes, x.used_bytes,
           x.transfers, x.kv_bytes, x.page_bytes);
}

/// Receives a request's tokens as they are generated (infer_request::stream): (id,
/// stream_row, token, its log-probabilities when the request asked for them). The sender
/// is the model manager, which takes (cancel_atom, id, complete). Declared here, not in
/// interfaces.hpp, because infer_request holds one.
using token_sink_actor =
    caf::typed_actor<caf::reacts_to<atom::token_atom, uint64_t, uint32_t, int64_t, token_logprobs>>;

/// One sequence to complete.
struct infer_request {
  std::string model;
  /// Prompt token ids.
  std::vector<int64_t> tokens;
  int64_t max_tokens = 1;
  row_sampling sampling;
  /// Time the request may take from admission, 0 for the server's default.
  uint32_t deadline_ms = 0;
  /// Refuse it (deadline_exceeded) at its turn when the model's expected service time
  /// would end past its deadline, rather than serve it late.
  bool drop_late = false;
  /// Set by the frontend.
  uint64_t id = 0;
  /// Generation stops when one of these tokens is sampled (it is not returned): the
  /// model's EOS ids and a request's stop_token_ids. Empty: only at max_tokens.
  std::vector<int64_t> stop_ids;
  /// Receives each token as soon as it exists. It may answer the sender, the model
  /// manager, with (cancel_atom, id, complete) to end the row early. Null: no streaming.
  token_sink_actor stream;
  uint32_t stream_row = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, infer_request& x) {
  return f(caf::meta::type_name("infer_request"), x.model, x.tokens, x.max_tokens, x.sampling,
           x.deadline_ms, x.drop_late, x.id, x.stop_ids, x.stream, x.stream_row);
}

/// The generated tokens and where the time went.
struct infer_reply {
  uint64_t id = 0;
  std::string model;
  std::vector<int64_t> tokens;
  double queue_ms = 0;
  /// Waiting for the model to become resident (a swap), 0 when it already was.
  double load_ms = 0;
  double compute_ms = 0;
  double total_ms = 0;
  uint32_t batch_size = 0;
  bool swapped = false;
  /// Why generation ended: "length" (max_tokens), "stop" (a stop id) or "cancelled".
  std::string finish_reason = "length";
  /// One per token of `tokens` when the request asked for log-probabilities, then the
  /// stop id's when one ended the row (`stop_id`).
  std::vector<token_logprobs> logprobs;
  /// The stop id that ended the row ("stop"), -1 otherwise.
  int64_t stop_id = -1;
  /// The prompt's log-probabilities from its second token on, when asked.
  std::vector<token_logprobs> prompt_logprobs;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, infer_reply& x) {
  return f(caf::meta::type_name("infer_reply"), x.id, x.model, x.tokens, x.queue_ms, x.load_ms,
           x.compute_ms, x.total_ms, x.batch_size, x.swapped, x.finish_reason, x.logprobs,
           x.stop_id, x.prompt_logprobs);
}

/// A registered model as clients see it.
struct model_info {
  model_config config;
  /// Its residency, or where its registration stands (model_lifecycle): a failed one is
  /// listed until registered again or unregistered.
  model_lifecycle state = model_lifecycle::unknown;
  /// Bytes its shards occupy on the devices, and its checkpoint's bytes (0: unknown);
  /// their ratio is what model-parallel swapping moves over the weights' own bytes.
  uint64_t bytes = 0;
  uint64_t weight_bytes = 0;
  uint32_t queued = 0;
  bool busy = false;
  uint64_t served = 0;
  uint64_t loads = 0;
  uint64_t evictions = 0;
  int64_t vocab = 0;
  int64_t max_positions = 0;
  /// Seconds since a batch last used it (-1: never).
  double idle_s = -1;
  /// Why it cannot serve, where it cannot (state "failed", "unavailable"); else empty.
  std::string reason;
  /// The error code behind `reason` (an ec as an integer; 0 when none is known), so that
  /// a request refused with the reason keeps it: a model that can never fit its devices
  /// is out_of_device_memory, which no retry helps.
  uint8_t reason_code = 0;
  /// KV blocks its running batches hold (on each shard) and their bytes over all shards.
  uint64_t kv_blocks = 0;
  uint64_t kv_bytes = 0;
};

/// A model listed with no figures: one being registered, one that failed (the reason and
/// its code), one just unregistered, a repository folder not registered.
inline model_info listed_info(model_config cfg, model_lifecycle state, std::string reason = {},
                              uint8_t reason_code = 0) {
  model_info i;
  i.config = std::move(cfg);
  i.state = state;
  i.reason = std::move(reason);
  i.reason_code = reason_code;
  return i;
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_info& x) {
  return f(caf::meta::type_name("model_info"), x.config, x.state, x.bytes, x.weight_bytes, x.queued,
           x.busy, x.served, x.loads, x.evictions, x.vocab, x.max_positions, x.idle_s, x.reason,
           x.reason_code, x.kv_blocks, x.kv_bytes);
}

}  // namespace computron::actors

CAF_BEGIN_TYPE_ID_BLOCK(computron_messages, caf::id_block::computron_atoms::end)
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::model_config))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::shard_spec))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::shard_report))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::transfer_report))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::row_sampling))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::token_logprobs))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::tensor_payload))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::step_request))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::step_result))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::device_report))
CAF_ADD_TYPE_ID(computron_messages, (std::vector<computron::actors::device_report>))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::model_placement))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::lease))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::residency_report))
CAF_ADD_TYPE_ID(computron_messages, (std::vector<computron::actors::residency_report>))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::device_usage))
CAF_ADD_TYPE_ID(computron_messages, (std::vector<computron::actors::device_usage>))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::infer_request))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::infer_reply))
CAF_ADD_TYPE_ID(computron_messages, (computron::actors::model_info))
CAF_ADD_TYPE_ID(computron_messages, (std::vector<computron::actors::model_info>))
CAF_ADD_TYPE_ID(computron_messages, (std::vector<int32_t>))
CAF_END_TYPE_ID_BLOCK(computron_messages)
