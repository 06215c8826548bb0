#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "models/safetensors.hpp"
#include "models/weights.hpp"
#include "tests/support/llama_reference.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// A tiny Hugging Face folder, removed at the end.
struct tiny_folder {
  std::string dir;
  tiny_folder(const std::string& name, const tiny_llama_options& o) : dir(temp_path(name)) {
    fs::remove_all(dir);
    write_tiny_llama_folder(dir, o);
  }
  ~tiny_folder() { fs::remove_all(dir); }
  json read(const std::string& file) const {
    std::ifstream in{dir + "/" + file};
    return json::parse(in);
  }
};

/// A one-layer config for hand-built models; eps is tiny so hand values hold to 1e-9.
json hand_config(const std::string& type, int64_t hidden, int64_t heads, int64_t kv_heads,
                 int64_t vocab) {
  return {{"model_type", type},           {"hidden_size", hidden},
          {"intermediate_size", hidden},  {"num_hidden_layers", 1},
          {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
          {"vocab_size", vocab},          {"rms_norm_eps", 1e-14},
          {"rope_theta", 10000.0},        {"tie_word_embeddings", false}};
}

/// Every tensor zero and every norm weight one: each hand test sets only what it needs.
std::map<std::string, std::vector<double>> blank_weights(const llama_config& c) {
  std::map<std::string, std::vector<double>> w;
  for (const auto& [name, shape] : llama_tensor_shapes(c)) {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    bool norm = name.size() >= 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    w[name].assign(n, norm ? 1.0 : 0.0);
  }
  return w;
}

void set_identity(std::vector<double>& w, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows && r < cols; ++r) w[r * cols + r] = 1.0;
}

void set_row(std::vector<double>& w, size_t row, const std::vector<double>& values) {
  std::copy(values.begin(), values.end(),
            w.begin() + static_cast<std::ptrdiff_t>(row * values.size()));
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("index " << i);
    CHECK(got[i] == Approx(want[i]).margin(tol));
  }
}

const std::string layer0 = "model.layers.0.";

}  // namespace

TEST_CASE("RMSNorm of a 4-vector matches the hand computation", "[llama_reference]") {
  // mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5; 1/sqrt(7.5) = 0.36514837...
  check_close(rms_norm({1, 2, 3, 4}, {1, 1, 2, 0.5}, 0.0),
              {0.3651483716701107, 0.7302967433402214, 2.1908902300206643, 0.7302967433402214},
              1e-15);
  // eps sits inside the square root: 1/sqrt(0 + 1) for a zero-mean-square input.
  check_close(rms_norm({0, 0}, {1, 1}, 1.0), {0, 0}, 0);
  check_close(rms_norm({1, 1}, {1, 1}, 3.0), {0.5, 0.5}, 1e-15);
}

TEST_CASE("rotary embedding rotates halves, not interleaved pairs", "[llama_reference]") {
  auto inv = rope_inv_freq(4, 10000, nullptr);
  check_close(inv, {1.0, 0.01}, 1e-15);  // 1/10000^(0/4), 1/10000^(2/4)
  // Position 1, angles (1, 0.01): pairs are (x0, x2) and (x1, x3).
  // out0 = 1 cos1 - 3 sin1, out1 = 2 cos.01 - 4 sin.01, out2 = 3 cos1 + 1 sin1, ...
  check_close(apply_rotary({1, 2, 3, 4}, 1, inv),
              {-1.9841106485555495, 1.959900667496664, 2.4623779024123156, 4.019799668334994},
              1e-12);
  check_close(apply_rotary({1, 2, 3, 4}, 0, inv), {1, 2, 3, 4}, 0);
}

TEST_CASE("rope scaling: linear divides, llama3 splits the band in three", "[llama_reference]") {
  auto plain = rope_inv_freq(8, 10000, nullptr);
  auto linear = rope_inv_freq(8, 10000, {{"type", "linear"}, {"factor", 4.0}});
  for (size_t i = 0; i < plain.size(); ++i) CHECK(linear[i] == Approx(plain[i] / 4).epsilon(1e-14));
  check_close(rope_inv_freq(8, 10000, {{"rope_type", "default"}}), plain, 0);

  // Llama 3.1's parameters, head_dim 128, theta 500000; low wavelen 8192, high 2048.
  json llama3 = {{"rope_type", "llama3"},
                 {"factor", 8.0},
                 {"low_freq_factor", 1.0},
                 {"high_freq_factor", 4.0},
                 {"original_max_position_embeddings", 8192}};
  auto inv = rope_inv_freq(128, 500000, llama3);
  REQUIRE(inv.size() == 64);
  CHECK(inv[0] == 1.0);  // wavelen 2 pi < 2048: unchanged
  // i = 63: inv 500000^(-126/128) = 2.4551e-6, wavelen 2.56e6 > 8192: divided by 8.
  CHECK(inv[63] == Approx(2.455140791131609e-06 / 8).epsilon(1e-12));
  // i = 30: inv 0.00213112, wavelen 2948.3; smooth = (8192/2948.3 - 1)/3 = 0.59285;
  // (1 - smooth) inv/8 + smooth inv = 0.00137189.
  CHECK(inv[30] == Approx(0.0013718935677611381).epsilon(1e-12));
  CHECK_THROWS(rope_inv_freq(128, 500000, {{"rope_type", "yarn"}, {"factor", 4.0}}));
}

TEST_CASE("a model with zero projections passes the embedding, the MLP is down(silu(gate) * up)",
          "[llama_reference]") {
  auto c = parse_llama_config(hand_config("llama", 4, 1, 1, 4));
  auto w = blank_weights(c);
  set_row(w["model.embed_tokens.weight"], 0, {1, 1, 1, 1});
  set_row(w["model.embed_tokens.weight"], 1, {2, -2, 2, -2});
  set_identity(w["lm_head.weight"], 4, 4);
  w["model.norm.weight"] = {1, 2, 3, 4};
  {
    llama_reference ref(c, w);
    auto h = ref.hidden_states({0, 1});
    check_close(h[0], {1, 1, 1, 1}, 1e-12);
    check_close(h[1], {2, -2, 2, -2}, 1e-12);
    // Final norm of [2,-2,2,-2] is [1,-1,1,-1], times the norm weight, through identity.
    check_close(ref.logits({0, 1}), {1, -2, 3, -4}, 1e-12);
  }
  for (const char* m : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
    set_identity(w[layer0 + m], 4, 4);
  llama_reference ref(c, w);
  // normed [1,-1,1,-1]: silu(1) * 1 = 0.73105858, silu(-1) * -1 = 0.26894142.
  check_close(ref.hidden_states({1})[0],
              {2.7310585786300049, -1.7310585786300049, 2.7310585786300049, -1.7310585786300049},
              1e-12);
}

TEST_CASE("attention with zero queries averages the causal values", "[llama_reference]") {
  auto c = parse_llama_config(hand_config("llama", 4, 1, 1, 4));
  auto w = blank_weights(c);
  set_row(w["model.embed_tokens.weight"], 0, {1, 1, 1, 1});
  set_row(w["model.embed_tokens.weight"], 1, {2, -2, 2, -2});
  set_identity(w[layer0 + "self_attn.v_proj.weight"], 4, 4);
  set_identity(w[layer0 + "self_attn.o_proj.weight"], 4, 4);
  auto h = llama_reference(c, w).hidden_states({0, 1});
  check_close(h[0], {2, 2, 2, 2}, 1e-12);    // sees only itself: x0 + n0
  check_close(h[1], {3, -2, 3, -2}, 1e-12);  // x1 + (n0 + n1) / 2
}

TEST_CASE("two-token attention: rotary direction, 1/sqrt(head_dim) and softmax by hand",
          "[llama_reference]") {
  auto c = parse_llama_config(hand_config("llama", 2, 1, 1, 2));
  auto w = blank_weights(c);
  set_row(w["model.embed_tokens.weight"], 0, {1, 1});
  set_row(w["model.embed_tokens.weight"], 1, {1, -1});
  for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"})
    set_identity(w[layer0 + "self_attn." + p + ".weight"], 2, 2);
  // head_dim 2, inv_freq {1}. At position 1, q = k1 = R(1)[1,-1] and k0 = [1,1]:
  // q.k1 = 2, q.k0 = [cos1 + sin1, sin1 - cos1].[1,1] = 2 sin1 (the other rotation
  // direction would give -2 sin1). Scaled by 1/sqrt(2): p0 = 0.44418512, p1 = 0.55581488,
  // and the output p0 [1,1] + p1 [1,-1] joins the residual [1,-1].
  auto h = llama_reference(c, w).hidden_states({0, 1});
  check_close(h[0], {2, 2}, 1e-12);
  check_close(h[1], {2, -1.111629763268346}, 1e-12);
}

TEST_CASE("grouped-query attention: query head h reads kv head h / (heads / kv_heads)",
          "[llama_reference]") {
  auto c = parse_llama_config(hand_config("llama", 8, 4, 2, 8));
  REQUIRE(c.head_dim == 2);
  auto w = blank_weights(c);
  set_row(w["model.embed_tokens.weight"], 0, {1, 2, 3, 4, 5, 6, 7, 8});
  set_identity(w[layer0 + "self_attn.v_proj.weight"], 4, 8);  // kv head 0: n0,n1; 1: n2,n3
  set_identity(w[layer0 + "self_attn.o_proj.weight"], 8, 8);
  // One token: each head's softmax is 1, so head h outputs its kv head's value. Heads
  // 0,1 -> kv 0 and heads 2,3 -> kv 1 (not h % kv_heads, which would give n0 n1 n2 n3 twice).
  double r = std::sqrt(204.0 / 8);
  std::vector<double> want = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<double> head = {1 / r, 2 / r, 1 / r, 2 / r, 3 / r, 4 / r, 3 / r, 4 / r};
  for (size_t i = 0; i < 8; ++i) want[i] += head[i];
  check_close(llama_reference(c, w).hidden_states({0})[0], want, 1e-12);
}

TEST_CASE("sliding window: a query at i sees keys j with i - j < W", "[llama_reference]") {
  auto with_window = [](const std::string& type, json window, json extra = json::object()) {
    auto j = hand_config(type, 4, 1, 1, 4);
    j["sliding_window"] = window;
    j.update(extra);
    auto c = parse_llama_config(j);
    auto w = blank_weights(c);
    set_row(w["model.embed_tokens.weight"], 0, {1, 1, 1, 1});
    set_row(w["model.embed_tokens.weight"], 1, {2, -2, 2, -2});
    set_identity(w[layer0 + "self_attn.v_proj.weight"], 4, 4);
    set_identity(w[layer0 + "self_attn.o_proj.weight"], 4, 4);
    return llama_reference(c, w).hidden_states({0, 0, 0, 1});
  };
  // Uniform attention (zero queries): position 3 averages the normed rows it may see.
  auto w2 = with_window("mistral", 2);
  check_close(w2[3], {3, -2, 3, -2}, 1e-12);  // keys 2, 3: x1 + (n0 + n1) / 2
  check_close(w2[1], {2, 2, 2, 2}, 1e-12);
  check_close(with_window("mistral", 1)[3], {3, -3, 3, -3}, 1e-12);  // only itself
  auto full = with_window("mistral", nullptr);
  check_close(full[3], {3, -1.5, 3, -1.5}, 1e-12);  // x1 + (3 n0 + n1) / 4
  check_close(with_window("mistral", 4)[3], full[3], 1e-12);
  // Qwen writes a window but leaves it off with use_sliding_window: false.
  check_close(with_window("qwen2", 2, {{"use_sliding_window", false}})[3], full[3], 1e-12);
  check_close(with_window("qwen2", 2, {{"use_sliding_window", true}, {"max_window_layers", 0}})[3],
              w2[3], 1e-12);
  // MistralConfig's default window is 4096.
  auto j = hand_config("mistral", 4, 1, 1, 4);
  CHECK(parse_llama_config(j).window == std::vector<int64_t>{4096});
  j["sliding_window"] = nullptr;
  CHECK(parse_llama_config(j).window == std::vector<int64_t>{0});
}

TEST_CASE("qwen3 normalizes each query and key head before the rotary", "[llama_reference]") {
  auto c = parse_llama_config(hand_config("qwen3", 2, 1, 1, 2));
  REQUIRE(c.qk_norm);
  auto w = blank_weights(c);
  set_row(w["model.embed_tokens.weight"], 0, {1, 1});
  set_row(w["model.embed_tokens.weight"], 1, {1, -1});
  w[layer0 + "self_attn.q_proj.weight"] = {3, 0, 0, 1};  // q1 = [3, -1] before its norm
  w[layer0 + "self_attn.q_norm.weight"] = {1, 2};
  for (const char* p : {"k_proj", "v_proj", "o_proj"})
    set_identity(w[layer0 + "self_attn." + p + ".weight"], 2, 2);
  // q1 = R(1) (rmsnorm([3,-1]) * [1,2]) = R(1) [3, -2] / sqrt(5); k0 = [1,1], k1 = R(1)[1,-1].
  auto q = apply_rotary({3 / std::sqrt(5.0), -2 / std::sqrt(5.0)}, 1, {1.0});
  auto k1 = apply_rotary({1, -1}, 1, {1.0});
  double s0 = (q[0] + q[1]) / std::sqrt(2.0), s1 = (q[0] * k1[0] + q[1] * k1[1]) / std::sqrt(2.0);
  double p0 = 1 / (1 + std::exp(s1 - s0)), p1 = 1 - p0;
  auto h = llama_reference(c, w).hidden_states({0, 1});
  check_close(h[1], {1 + p0 + p1, -1 + p0 - p1}, 1e-12);

  // The norm makes attention blind to the projections' scale; llama's is not.
  tiny_llama_options o;
  o.rms_norm_eps = 1e-14;
  o.model_type = "qwen3";
  tiny_folder qwen("llama-ref-qknorm-qwen3", o);
  o.model_type = "llama";
  tiny_folder llama("llama-ref-qknorm-llama", o);
  for (auto* f : {&qwen, &llama}) {
    auto ref = llama_reference::open(f->dir);
    std::map<std::string, std::vector<double>> scaled;
    for (const auto& [name, shape] : llama_tensor_shapes(ref.config())) {
      scaled[name] = ref.weight(name);
      if (name.find("q_proj.weight") != std::string::npos ||
          name.find("k_proj.weight") != std::string::npos)
        for (auto& v : scaled[name]) v *= 7;
    }
    auto a = ref.logits({3, 1, 4, 1, 5}),
         b = llama_reference(ref.config(), scaled).logits({3, 1, 4, 1, 5});
    double diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
    if (f == &qwen)
      CHECK(diff < 1e-9);
    else
      CHECK(diff > 1e-6);
  }
}

TEST_CASE("attention biases: qwen2 on q/k/v, llama's attention_bias on q/k/v/o",
          "[llama_reference]") {
  for (const char* type : {"qwen2", "llama"}) {
    auto j = hand_config(type, 4, 1, 1, 4);
    j["attention_bias"] = true;
    auto c = parse_llama_config(j);
    auto w = blank_weights(c);
    set_row(w["model.embed_tokens.weight"], 0, {1, 1, 1, 1});
    w[layer0 + "self_attn.v_proj.bias"] = {0.5, 0, 0, -0.5};  // the value with v weights zero
    set_identity(w[layer0 + "self_attn.o_proj.weight"], 4, 4);
    std::vector<double> want = {1.5, 1, 1, 0.5};
    if (std::string{type} == "llama") {
      w[layer0 + "self_attn.o_proj.bias"] = {0, 1, 0, 0};
      want[1] += 1;
    } else {
      CHECK(w.count(layer0 + "self_attn.o_proj.bias") == 0);
    }
    check_close(llama_reference(c, w).hidden_states({0})[0], want, 1e-12);
  }
}

TEST_CASE("tiny folders hold config.json and tensors as save_pretrained writes them",
          "[llama_reference]") {
  auto names_of = [](const std::string& dir) {
    std::set<std::string> names;
    auto f = models::safetensors_file::open(dir + "/model.safetensors");
    REQUIRE(f);
    for (const auto& [name, t] : f->tensors()) names.insert(name);
    return names;
  };
  auto expect = [](std::vector<std::string> layer_extra, bool lm_head) {
    std::set<std::string> names = {"model.embed_tokens.weight", "model.norm.weight"};
    if (lm_head) names.insert("lm_head.weight");
    for (int l = 0; l < 2; ++l) {
      std::string p = "model.layers." + std::to_string(l) + ".";
      for (const char* n :
           {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
            "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
        names.insert(p + n);
      for (const auto& n : layer_extra) names.insert(p + n);
    }
    return names;
  };
  const std::vector<std::string> qkv_bias = {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                             "self_attn.v_proj.bias"};
  tiny_llama_options o;
  {
    tiny_folder f("llama-ref-names-llama", o);
    auto c = f.read("config.json");
    CHECK(c["architectures"] == json{"LlamaForCausalLM"});
    CHECK(c["model_type"] == "llama");
    CHECK(c["hidden_size"] == 64);
    CHECK(c["intermediate_size"] == 128);
    CHECK(c["num_key_value_heads"] == 2);
    CHECK(c["hidden_act"] == "silu");
    CHECK(c["torch_dtype"] == "float32");
    CHECK(c["attention_bias"] == false);
    CHECK(c["rope_scaling"].is_null());
    CHECK_FALSE(c.contains("head_dim"));
    CHECK_FALSE(c.contains("sliding_window"));
    CHECK(fs::exists(f.dir + "/generation_config.json"));
    CHECK(names_of(f.dir) == expect({}, true));
  }
  o.attention_bias = true;
  o.tie_word_embeddings = true;
  {
    tiny_folder f("llama-ref-names-llama-bias", o);
    auto extra = qkv_bias;
    extra.push_back("self_attn.o_proj.bias");
    CHECK(names_of(f.dir) == expect(extra, false));
    CHECK(f.read("config.json")["tie_word_embeddings"] == true);
  }
  o = {};
  o.model_type = "qwen2";
  {
    tiny_folder f("llama-ref-names-qwen2", o);
    auto c = f.read("config.json");
    CHECK(c["architectures"] == json{"Qwen2ForCausalLM"});
    CHECK(c["use_sliding_window"] == false);
    CHECK(c.contains("sliding_window"));
    CHECK(names_of(f.dir) == expect(qkv_bias, true));
  }
  o.model_type = "qwen3";
  o.head_dim = 32;  // not hidden / heads, as in Qwen3's own configs
  {
    tiny_folder f("llama-ref-names-qwen3", o);
    auto c = f.read("config.json");
    CHECK(c["architectures"] == json{"Qwen3ForCausalLM"});
    CHECK(c["head_dim"] == 32);
    CHECK(c["attention_bias"] == false);
    CHECK(names_of(f.dir) == expect({"self_attn.q_norm.weight", "self_attn.k_norm.weight"}, true));
    auto file = models::safetensors_file::open(f.dir + "/model.safetensors");
    REQUIRE(file);
    CHECK(file->find("model.layers.1.self_attn.q_norm.weight")->shape == std::vector<int64_t>{32});
    CHECK(file->find("model.layers.0.self_attn.q_proj.weight")->shape ==
          std::vector<int64_t>{128, 64});
    CHECK(file->find("model.layers.0.self_attn.o_proj.weight")->shape ==
          std::vector<int64_t>{64, 128});
  }
  o = {};
  o.model_type = "mistral";
  o.sliding_window = 4096;
  {
    tiny_folder f("llama-ref-names-mistral", o);
    auto c = f.read("config.json");
    CHECK(c["architectures"] == json{"MistralForCausalLM"});
    CHECK(c["head_dim"] == 16);
    CHECK(c["sliding_window"] == 4096);
    CHECK_FALSE(c.contains("attention_bias"));
    CHECK_FALSE(c.contains("rope_scaling"));
    CHECK(names_of(f.dir) == expect({}, true));
  }
  o.attention_bias = true;
  CHECK_THROWS(tiny_folder("llama-ref-names-bad", o));
}

TEST_CASE("folder round trip: single file, sharded index and bf16/f16 storage",
          "[llama_reference]") {
  tiny_llama_options o;
  o.model_type = "qwen2";
  tiny_folder single("llama-ref-rt-single", o);
  auto ref = llama_reference::open(single.dir);
  auto file = models::safetensors_file::open(single.dir + "/model.safetensors");
  REQUIRE(file);
  CHECK(file->metadata().at("format") == "pt");
  for (const auto& [name, t] : file->tensors()) {
    const auto& values = ref.weight(name);
    REQUIRE(values.size() * 4 == t.size_bytes);
    std::vector<float> raw(values.size());
    std::memcpy(raw.data(), t.data, t.size_bytes);
    for (size_t i = 0; i < raw.size(); ++i) REQUIRE(values[i] == static_cast<double>(raw[i]));
  }
  // The values follow the documented ranges.
  for (double v : ref.weight("model.layers.0.mlp.up_proj.weight")) REQUIRE(std::abs(v) <= 0.08);
  for (double v : ref.weight("model.norm.weight")) REQUIRE(std::abs(v - 1) <= 0.08);
  std::vector<int64_t> prompt = {5, 17, 200, 3};
  auto want = ref.logits(prompt);

  o.files = 3;
  tiny_folder sharded("llama-ref-rt-sharded", o);
  CHECK_FALSE(fs::exists(sharded.dir + "/model.safetensors"));
  auto index = sharded.read("model.safetensors.index.json");
  std::set<std::string> shards;
  uint64_t bytes = 0;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    shards.insert(shard.get<std::string>());
    bytes += ref.weight(name).size() * 4;
  }
  CHECK(shards == std::set<std::string>{"model-00001-of-00003.safetensors",
                                        "model-00002-of-00003.safetensors",
                                        "model-00003-of-00003.safetensors"});
  CHECK(index["weight_map"].size() == llama_tensor_shapes(ref.config()).size());
  CHECK(index["metadata"]["total_size"] == bytes);
  CHECK(llama_reference::open(sharded.dir).logits(prompt) == want);

  for (const char* dtype : {"bfloat16", "float16"}) {
    o.files = 1;
    o.dtype = dtype;
    tiny_folder half(std::string{"llama-ref-rt-"} + dtype, o);
    CHECK(half.read("config.json")["torch_dtype"] == dtype);
    auto h = llama_reference::open(half.dir);
    for (const auto& [name, shape] : llama_tensor_shapes(ref.config())) {
      INFO(name);
      const auto& full = ref.weight(name);
      const auto& got = h.weight(name);
      for (size_t i = 0; i < full.size(); ++i) {
        auto f = static_cast<float>(full[i]);
        double rounded = std::string{dtype} == "bfloat16" ? models::from_bf16(models::to_bf16(f))
                                                          : models::from_f16(models::to_f16(f));
        REQUIRE(got[i] == rounded);
      }
    }
    check_close(h.logits(prompt), want, 2e-2);
  }
}

TEST_CASE("each model_type's folder gives finite logits and a consistent greedy decode",
          "[llama_reference]") {
  for (const char* type : {"llama", "mistral", "qwen2", "qwen3"}) {
    INFO(type);
    tiny_llama_options o;
    o.model_type = type;
    if (std::string{type} == "mistral") o.sliding_window = 3;
    if (std::string{type} == "qwen3") o.head_dim = 32;
    if (std::string{type} == "llama")
      o.rope_scaling = {{"rope_type", "llama3"},
                        {"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 16}};
    tiny_folder f(std::string{"llama-ref-greedy-"} + type, o);
    auto ref = llama_reference::open(f.dir);
    if (std::string{type} == "llama")
      CHECK(ref.config().inv_freq == rope_inv_freq(16, 10000, o.rope_scaling));
    std::vector<int64_t> prompt = {1, 42, 7, 99, 250};
    auto lg = ref.logits(prompt);
    REQUIRE(lg.size() == 256);
    for (double v : lg) REQUIRE(std::isfinite(v));
    std::vector<std::vector<double>> steps;
    auto out = ref.greedy(prompt, 4, &steps);
    REQUIRE(out.size() == 4);
    REQUIRE(steps.size() == 4);
    CHECK(steps[0] == lg);
    auto seq = prompt;
    for (size_t s = 0; s < out.size(); ++s) {
      CHECK(steps[s] == ref.logits(seq));
      CHECK(out[s] == std::max_element(steps[s].begin(), steps[s].end()) - steps[s].begin());
      seq.push_back(out[s]);
    }
    // Another seed gives another model.
    o.seed = 2;
    tiny_folder other(std::string{"llama-ref-greedy-seed-"} + type, o);
    CHECK(llama_reference::open(other.dir).logits(prompt) != lg);
  }
}

TEST_CASE("tied embeddings: the head is embed_tokens", "[llama_reference]") {
  tiny_llama_options o;
  o.tie_word_embeddings = true;
  tiny_folder f("llama-ref-tied", o);
  auto ref = llama_reference::open(f.dir);
  auto h = ref.hidden_states({4, 8, 15}).back();
  auto n = rms_norm(h, ref.weight("model.norm.weight"), 1e-6);
  const auto& e = ref.weight("model.embed_tokens.weight");
  auto lg = ref.logits({4, 8, 15});
  for (size_t v = 0; v < 256; v += 51) {
    double want = 0;
    for (size_t i = 0; i < 64; ++i) want += e[v * 64 + i] * n[i];
    CHECK(lg[v] == Approx(want).margin(1e-12));
  }
}

TEST_CASE("bad folders and inputs throw", "[llama_reference]") {
  tiny_llama_options o;
  tiny_folder f("llama-ref-bad", o);
  auto ref = llama_reference::open(f.dir);
  CHECK_THROWS(ref.logits({256}));
  CHECK_THROWS(ref.logits({}));
  // A checkpoint missing a tensor.
  {
    auto file = models::safetensors_file::open(f.dir + "/model.safetensors");
    REQUIRE(file);
    std::vector<models::safetensor> kept;
    for (const auto& [name, t] : file->tensors())
      if (name != "model.layers.1.mlp.up_proj.weight") kept.push_back(t);
    REQUIRE_FALSE(models::write_safetensors(f.dir + "/other.safetensors", kept));
  }
  fs::rename(f.dir + "/other.safetensors", f.dir + "/model.safetensors");
  CHECK_THROWS_WITH(llama_reference::open(f.dir), Catch::Contains("up_proj"));
  auto bad_config = [&](const char* key, const json& value) {
    auto j = f.read("config.json");
    j[key] = value;
    std::ofstream{f.dir + "/config.json"} << j.dump();
  };
  bad_config("model_type", "gpt2");
  CHECK_THROWS_WITH(llama_reference::open(f.dir), Catch::Contains("gpt2"));
  bad_config("model_type", "llama");
  bad_config("hidden_act", "gelu");
  CHECK_THROWS_WITH(llama_reference::open(f.dir), Catch::Contains("silu"));
  CHECK_THROWS(llama_reference::open(f.dir + "-missing"));
}
