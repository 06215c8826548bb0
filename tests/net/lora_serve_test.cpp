// LoRA adapters served by the real `computron serve` process over HTTP (the base split TP 2 x
// PP 2): from the
// repository (a PEFT folder beside its base's), from --lora-modules and from
// POST /v1/load_lora_adapter, each answering the independent float64 reference of its base
// with the adapter merged into the weights (W + alpha/r B A, computed here from the values
// the test wrote), alone and beside the base and each other; vLLM's card fields, answers
// and refusals; per-adapter metrics.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <future>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "models/checkpoint.hpp"
#include "net/client/http_client.hpp"
#include "tests/support/kserve.hpp"
#include "tests/support/llama_reference.hpp"
#include "tests/support/peft_folder.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::vector<int64_t> prompt = {1, 17, 200, 33, 5};
constexpr int steps = 6;

/// The base's reference with `f`'s pairs merged into its weights (scale alpha / r).
test::llama_reference merged(const test::llama_reference& base, const test::peft_folder& f) {
  std::map<std::string, std::vector<double>> w;
  for (auto& [name, shape] : test::llama_tensor_shapes(base.config())) w[name] = base.weight(name);
  const double scale = f.config["lora_alpha"].get<double>() / f.config["r"].get<double>();
  const std::string prefix = "base_model.model.", a_suffix = ".lora_A.weight";
  int pairs = 0;
  for (auto& a : f.tensors) {
    if (a.name.size() < a_suffix.size() ||
        a.name.compare(a.name.size() - a_suffix.size(), a_suffix.size(), a_suffix) != 0)
      continue;
    auto module = a.name.substr(prefix.size(), a.name.size() - prefix.size() - a_suffix.size());
    auto b = std::find_if(f.tensors.begin(), f.tensors.end(),
                          [&](auto& t) { return t.name == prefix + module + ".lora_B.weight"; });
    REQUIRE(b != f.tensors.end());
    auto& target = w.at(module + ".weight");
    const auto r = a.shape[0], in = a.shape[1], out = b->shape[0];
    REQUIRE(static_cast<int64_t>(target.size()) == out * in);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k)
          d += static_cast<double>(b->values[static_cast<size_t>(o * r + k)]) *
               static_cast<double>(a.values[static_cast<size_t>(k * in + i)]);
        target[static_cast<size_t>(o * in + i)] += scale * d;
      }
    ++pairs;
  }
  REQUIRE(pairs > 0);
  return test::llama_reference(base.config(), std::move(w));
}

/// A PEFT folder for the tiny llama at `dir`: make_folder's values (up to ±2) scaled by
/// alpha / r to deltas the size of the base's weights.
test::peft_folder adapter(const models::decoder_spec& spec, const std::string& dir, uint32_t seed,
                          int64_t r = 4) {
  auto f = test::make_folder(spec, r, 0.05, {}, gpu::dtype::f32, seed);
  fs::create_directories(dir);
  f.config["base_model_name_or_path"] = "someone/llama";
  f.write();
  for (auto& e : fs::directory_iterator(f.dir->path()))
    fs::copy_file(e.path(), fs::path{dir} / e.path().filename(),
                  fs::copy_options::overwrite_existing);
  return f;
}

json infer(net::http_client& c, const std::string& model, int expect = 200) {
  return test::kserve_infer(c, model, prompt, steps, expect);
}

net::http_result post(net::http_client& c, const std::string& target, const json& body) {
  return c.request("POST", target, body.dump()).value();
}

}  // namespace

TEST_CASE(
    "LoRA adapters from the repository, --lora-modules and the API serve their merged "
    "weights' tokens",
    "[net][e2e][lora][adapters]") {
  test::temp_dir dir{"lora-serve"};
  auto repo = dir.path() + "/repo";
  test::write_tiny_llama_folder(repo + "/llama", {});
  // Split as TP 2 x PP 2: each adapter is cut as its base is, per rank and stage.
  std::ofstream{repo + "/llama/computron.json"} << json{{"tp", 2}, {"pp", 2}}.dump();
  auto hf = models::read_hf_config(repo + "/llama");
  REQUIRE(hf);
  auto base = test::llama_reference::open(repo + "/llama");
  auto sql = adapter(hf->spec, repo + "/llama-sql", 11);
  auto extra = adapter(hf->spec, dir.path() + "/extra", 22);
  auto late = adapter(hf->spec, dir.path() + "/late", 33);
  auto later = adapter(hf->spec, dir.path() + "/later", 44);
  // Rank 16 is over this server's maximum (--max-lora-rank 8, where the default is 64):
  // refused when it registers, naming `r` and the limit.
  adapter(hf->spec, dir.path() + "/too-wide", 55, 16);
  json cfg{{"devices", {{"kind", "emulated"}, {"count", 4}, {"capacity_mb", 64}, {"link_gbps", 1}}},
           {"http", {{"host", "127.0.0.1"}, {"port", 0}, {"allow_runtime_lora_updating", true}}},
           {"repository", "repo"}};
  std::ofstream{dir.path() + "/config.json"} << cfg.dump();
  child_process proc{std::vector<std::string>{
      "/usr/bin/timeout", "300", COMPUTRON_BINARY, "serve", "--config", dir.path() + "/config.json",
      "--lora-modules", "extra=" + dir.path() + "/extra", "--max-lora-rank", "8"}};
  auto port = test::wait_for_port(proc);
  REQUIRE(port > 0);
  auto c = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());

  const json want_base = base.greedy(prompt, steps);
  const json want_sql = merged(base, sql).greedy(prompt, steps);
  const json want_extra = merged(base, extra).greedy(prompt, steps);
  REQUIRE(want_sql != want_base);  // the adapters matter, so the checks below can fail
  REQUIRE(want_extra != want_sql);
  CHECK(infer(*c, "llama") == want_base);
  CHECK(infer(*c, "llama-sql") == want_sql);
  CHECK(infer(*c, "llama:llama-sql") == want_sql);  // SGLang's form
  CHECK(infer(*c, "extra") == want_extra);
  // OpenAI's completions: the adapter named in `model`, which the answer carries back.
  auto done =
      post(*c, "/v1/completions",
           {{"model", "llama-sql"}, {"prompt", prompt}, {"max_tokens", steps}, {"temperature", 0}});
  INFO(done.body);
  REQUIRE(done.status == 200);
  auto completion = json::parse(done.body);
  CHECK(completion["model"] == "llama-sql");
  CHECK(completion["choices"][0]["token_ids"] == want_sql);

  // At once, each on its own connection: rows of one base batch with their own adapters.
  std::vector<std::pair<std::string, json>> cases{
      {"llama", want_base}, {"llama-sql", want_sql}, {"extra", want_extra}, {"llama", want_base}};
  // The threads only send: Catch's assertions and INFO are not thread-safe (two threads'
  // INFO once corrupted its message stack under ASan), so the answers are checked here.
  std::vector<std::future<net::http_result>> at_once;
  for (auto& [model, want] : cases)
    at_once.push_back(std::async(std::launch::async, [&, model = model] {
      auto own = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
      return own
          ->request("POST", "/v2/models/" + model + "/infer", test::kserve_body(prompt, steps))
          .value();
    }));
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = at_once[i].get();
    INFO(cases[i].first << ": " << r.body);
    REQUIRE(r.status == 200);
    CHECK(json::parse(r.body)["outputs"][0]["data"] == cases[i].second);
  }

  // vLLM's cards: an adapter's parent is its base, its root its folder.
  auto models = json::parse(c->request("GET", "/v1/models").value().body, nullptr, false);
  INFO(models.dump());
  std::map<std::string, json> cards;
  for (auto& m : models["data"]) cards[m["id"].get<std::string>()] = m;
  REQUIRE(cards.count("llama-sql") == 1);
  CHECK(cards["llama-sql"]["parent"] == "llama");
  CHECK(cards["extra"]["parent"] == "llama");
  CHECK(cards["extra"]["root"].get<std::string>().find("extra") != std::string::npos);
  CHECK(cards["llama"]["parent"].is_null());

  // Loaded at run time, with vLLM's body and answer.
  auto added = post(*c, "/v1/load_lora_adapter",
                    {{"lora_name", "late"}, {"lora_path", dir.path() + "/late"}});
  INFO(added.body);
  REQUIRE(added.status == 200);
  CHECK(added.body == "Success: LoRA adapter 'late' added successfully.");
  CHECK(infer(*c, "late") == json(merged(base, late).greedy(prompt, steps)));
  auto again = post(*c, "/v1/load_lora_adapter",
                    {{"lora_name", "late"}, {"lora_path", dir.path() + "/later"}});
  CHECK(again.status == 400);
  CHECK_THAT(again.body, Catch::Contains("already been loaded"));
  // In place: the name now runs the new folder's weights, nothing of the old one's.
  auto replaced =
      post(*c, "/v1/load_lora_adapter",
           {{"lora_name", "late"}, {"lora_path", dir.path() + "/later"}, {"load_inplace", true}});
  INFO(replaced.body);
  REQUIRE(replaced.status == 200);
  CHECK(infer(*c, "late") == json(merged(base, later).greedy(prompt, steps)));

  // Refusals, each clear, and the server goes on.
  auto wide = post(*c, "/v1/load_lora_adapter",
                   {{"lora_name", "wide"}, {"lora_path", dir.path() + "/too-wide"}});
  INFO(wide.body);
  CHECK(wide.status == 400);
  CHECK_THAT(wide.body, Catch::Contains("r 16 is over the largest rank accepted, 8"));
  auto nowhere = post(*c, "/v1/load_lora_adapter",
                      {{"lora_name", "nowhere"}, {"lora_path", dir.path() + "/nothing"}});
  CHECK(nowhere.status == 400);
  CHECK_THAT(nowhere.body, Catch::Contains("adapter_config.json"));
  auto typo = post(*c, "/v1/load_lora_adapter", {{"lora_nam", "x"}});
  CHECK(typo.status == 400);
  auto not_adapter = post(*c, "/v1/unload_lora_adapter", {{"lora_name", "llama"}});
  CHECK(not_adapter.status == 400);
  CHECK_THAT(not_adapter.body, Catch::Contains("not a LoRA adapter"));
  CHECK(post(*c, "/v1/unload_lora_adapter", {{"lora_name", "nope"}}).status == 404);
  auto removed = post(*c, "/v1/unload_lora_adapter", {{"lora_name", "late"}});
  INFO(removed.body);
  REQUIRE(removed.status == 200);
  CHECK(removed.body == "Success: LoRA adapter 'late' removed successfully.");
  infer(*c, "late", 404);
  CHECK(infer(*c, "llama-sql") == want_sql);

  // Requests and loads are counted per adapter.
  auto metrics = c->request("GET", "/metrics").value().body;
  CHECK_THAT(metrics, Catch::Contains("computron_requests_total{model=\"llama-sql\""));
  auto loads = metrics.find("computron_model_loads_total{");
  REQUIRE(loads != std::string::npos);
  CHECK(metrics.find("model=\"extra\"", loads) != std::string::npos);
  CHECK_THAT(metrics, Catch::Contains("computron_model_resident_shards{model=\"llama-sql\"} 4"));
  // The status and the trace show adapters and their loads.
  auto status = c->request("GET", "/v2/status").value().body;
  CHECK_THAT(status, Catch::Contains("llama-sql"));
  auto trace = json::parse(c->request("GET", "/v2/trace").value().body, nullptr, false);
  bool adapter_load = false;
  for (auto& e : trace["traceEvents"])
    adapter_load = adapter_load ||
                   (e.value("cat", "") == "load" && e.dump().find("extra") != std::string::npos);
  CHECK(adapter_load);
}
