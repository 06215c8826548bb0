// Fuzz target: a Hugging Face model folder's config.json and model.safetensors.index.json
// (models/checkpoint.cpp). Bytes 0-1 give the length of the config; the rest is the index.
// The folder also holds a real two-tensor shard the index may name.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "models/checkpoint.hpp"
#include "models/safetensors.hpp"
#include "tests/fuzz/memfile.hpp"

namespace {

const std::string& folder() {
  static const std::string dir = [] {
    static computron::fuzz::scratch_dir scratch{"hf"};
    if (scratch.path().empty()) std::abort();
    const std::string& d = scratch.path();
    static std::vector<float> w(8, 0.5f);
    std::vector<computron::models::safetensor> ts;
    ts.push_back({"model.decoder.embed_tokens.weight",
                  computron::gpu::dtype::f32,
                  {2, 2},
                  reinterpret_cast<const std::byte*>(w.data()),
                  16});
    ts.push_back({"lm_head.weight",
                  computron::gpu::dtype::f32,
                  {2, 2},
                  reinterpret_cast<const std::byte*>(w.data() + 4),
                  16});
    if (computron::models::write_safetensors(d + "/model-00001-of-00001.safetensors", ts))
      std::abort();
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& dir = folder();
  if (!computron::fuzz::write_two_files(dir, data, size, "config.json",
                                        "model.safetensors.index.json"))
    return 0;
  (void)computron::models::is_hf_folder(dir);
  (void)computron::models::read_hf_opt_config(dir);
  (void)computron::models::read_hf_config(dir);
  (void)computron::models::read_hf_llama_config(dir);
  auto c = computron::models::checkpoint::open(dir);
  if (c) (void)c->find("embed_tokens.weight");
  return 0;
}
