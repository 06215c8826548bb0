#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

/// An independent float64 reference of the Llama family (model_type llama, mistral, qwen2,
/// qwen3), written from Hugging Face transformers' published equations with plain loops,
/// and a writer of tiny Hugging Face model folders to test against. Test code: it shares
/// nothing with models/ beyond the safetensors reader and writer, so a bug in our libtorch
/// decoder cannot hide by being repeated here. Errors throw std::runtime_error.
namespace computron::test {

/// What write_tiny_llama_folder writes. Each field becomes the config.json key of the same
/// meaning for `model_type`.
struct tiny_llama_options {
  std::string model_type = "llama";
  int64_t hidden = 64, layers = 2, heads = 4, kv_heads = 2;
  /// 0: hidden / heads (not written for llama/qwen2); otherwise written as "head_dim".
  int64_t head_dim = 0;
  int64_t ffn = 128, vocab = 256, max_positions = 128;
  double rope_theta = 10000;
  nlohmann::json rope_scaling = nullptr;
  /// q/k/v/o biases for llama and qwen3 (qwen2 always has q/k/v biases, mistral none).
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  double rms_norm_eps = 1e-6;
  /// Mistral's window (null: full attention); qwen2/qwen3 write it beside
  /// `use_sliding_window: false`, so it does not apply to them.
  nlohmann::json sliding_window = nullptr;
  /// "float32", "bfloat16" or "float16": the torch_dtype written and the tensors' storage.
  std::string dtype = "float32";
  /// >1: model-0000k-of-0000n.safetensors shards with model.safetensors.index.json.
  int files = 1;
  uint64_t seed = 1;
  /// Weights and biases uniform in [-scale, scale]; norm weights in [1 - scale, 1 + scale].
  double scale = 0.08;
};

/// The tiny folders of every model type, each with what sets it apart: [0] llama (llama3
/// rope scaling, untied, 4 query heads over 2 kv heads), [1] llama (linear scaling,
/// biases, 3 files), [2] mistral (head_dim, one kv head), [3] qwen2 (biases, tied head),
/// [4] qwen3 (q/k norms, head_dim).
std::vector<std::pair<std::string, tiny_llama_options>> llama_variants();

/// Writes `dir` (created if missing) as transformers' save_pretrained would for
/// `options.model_type`: config.json, generation_config.json and the safetensors weights,
/// deterministic from `options.seed` (each tensor's values depend only on the seed and its
/// name, so a tied and an untied folder share their embeddings).
void write_tiny_llama_folder(const std::string& dir, const tiny_llama_options& options);

/// A config.json reduced to what the forward needs, defaults filled in as transformers'
/// config classes fill them.
struct llama_config {
  std::string model_type;
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  double rms_norm_eps = 1e-6;
  /// The rotary inverse frequencies (head_dim / 2 of them), scaling applied.
  std::vector<double> inv_freq;
  /// Which optional tensors the checkpoint has.
  bool qkv_bias = false, o_bias = false, mlp_bias = false, qk_norm = false;
  bool tie_word_embeddings = false;
  /// Per layer: the sliding window W (a query at i sees keys j with i - j < W), 0 for full
  /// causal attention.
  std::vector<int64_t> window;
};

/// Reads a parsed config.json. Throws on a missing dimension, an unknown model_type, a
/// hidden_act other than silu, or a rope scaling type other than default/linear/llama3.
llama_config parse_llama_config(const nlohmann::json& config);

/// Every tensor the checkpoint of `config` holds, with its shape, in the order of the
/// modules that own them (the order save_pretrained fills shards in).
std::vector<std::pair<std::string, std::vector<int64_t>>> llama_tensor_shapes(
    const llama_config& config);

/// inv_freq[i] = 1 / theta^(2i / head_dim), then `rope_scaling` (null, or
/// {"rope_type"|"type": "default"|"linear"|"llama3", ...}) as transformers'
/// ROPE_INIT_FUNCTIONS apply it.
std::vector<double> rope_inv_freq(int64_t head_dim, double theta,
                                  const nlohmann::json& rope_scaling);

/// x / sqrt(mean(x^2) + eps) * weight.
std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& weight,
                             double eps);

/// Rotate-half rotary embedding of one head vector (size 2 * inv_freq.size()) at
/// `position`: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[d/2:], x[:d/2]).
std::vector<double> apply_rotary(const std::vector<double>& x, int64_t position,
                                 const std::vector<double>& inv_freq);

/// The float64 forward. Each call recomputes the whole sequence from scratch: no cache,
/// because a reference should be the simplest correct thing.
class llama_reference {
 public:
  /// Reads `dir`/config.json and the weights (model.safetensors, or
  /// model.safetensors.index.json and its shards), converting bf16/f16/f32 to double.
  /// Throws on a missing or misshapen tensor and on tensors the model would not use.
  static llama_reference open(const std::string& dir);

  /// A model from a config and weights by Hugging Face name (row-major, [out, in] for
  /// projections), for hand-built tests. Throws when a tensor is missing or has the wrong
  /// number of values.
  llama_reference(llama_config config, std::map<std::string, std::vector<double>> weights);

  /// The parsed config, so tests can rebuild the model with changed weights.
  const llama_config& config() const { return config_; }

  /// The values of tensor `name` as read (throws when there is none).
  const std::vector<double>& weight(const std::string& name) const;

  /// The residual stream after the last decoder layer, before the final norm, one vector
  /// of `hidden` values per position (what hand-built tests can predict).
  std::vector<std::vector<double>> hidden_states(const std::vector<int64_t>& tokens) const;

  /// The logits (vocab values) of the last token of `tokens`.
  std::vector<double> logits(const std::vector<int64_t>& tokens) const;

  /// The `steps` tokens greedy decoding appends to `prompt` (the prompt not included):
  /// argmax, the first index on ties as torch.argmax. `step_logits`, when given, receives
  /// the logits each step chose from.
  std::vector<int64_t> greedy(const std::vector<int64_t>& prompt, int steps,
                              std::vector<std::vector<double>>* step_logits = nullptr) const;

 private:
  const std::vector<double>& layer_weight(int64_t layer, const char* suffix) const;

  llama_config config_;
  std::map<std::string, std::vector<double>> weights_;
};

}  // namespace computron::test
