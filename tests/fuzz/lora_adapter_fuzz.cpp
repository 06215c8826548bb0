// Fuzz target: a PEFT LoRA folder (models/lora_config.cpp, models/lora_adapter.cpp), read
// against a tiny Llama-family base with grouped-query attention. Bytes 0-1 give the length
// of adapter_config.json; the rest is adapter_model.safetensors. What reads is cut for
// every rank of tp 1, 2 and 4 (k/v heads replicated at 4).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "models/lora_adapter.hpp"
#include "tests/fuzz/memfile.hpp"

namespace {

const std::string& folder() {
  static computron::fuzz::scratch_dir scratch{"lora"};
  if (scratch.path().empty()) std::abort();
  return scratch.path();
}

/// Must match tests/fuzz/corpus/lora_adapter's seeds (tests/fuzz/lora_seeds.py).
computron::models::decoder_spec base() {
  computron::models::decoder_spec s{"fuzz-llama", 16, 2, 4, 24, 40, 64};
  s.family = computron::models::model_family::llama;
  s.kv_heads = 2;
  s.head_dim = 6;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& dir = folder();
  if (!computron::fuzz::write_two_files(dir, data, size, "adapter_config.json",
                                        "adapter_model.safetensors"))
    return 0;
  static const auto spec = base();
  auto adapter = computron::models::read_lora_adapter(dir, spec, {8});
  if (!adapter) return 0;
  for (int tp : {1, 2, 4})
    for (int rank = 0; rank < tp; ++rank) {
      auto cut = computron::models::slice_lora_adapter(*adapter, {tp, 1}, {rank, 0},
                                                       computron::gpu::dtype::bf16);
      // Every valid adapter cuts for every rank this base splits into, into a buffer of
      // the size the table says.
      if (!cut || cut->host.size() != cut->size_bytes()) std::abort();
    }
  return 0;
}
