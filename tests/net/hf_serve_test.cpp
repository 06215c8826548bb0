// Hugging Face OPT folders served by the real `computron serve` process over HTTP: the
// same tokens as the same weights in our own format, at TP1 and TP2 x PP2.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "models/checkpoint.hpp"
#include "models/safetensors.hpp"
#include "models/weights.hpp"
#include "net/client/http_client.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// Our own format: config.json plus weights.safetensors of the seeded unsharded model.
void write_native(const std::string& dir, const json& cfg, gpu::dtype t, uint64_t seed) {
  fs::create_directories(dir);
  auto spec = *models::find_spec("opt-tiny");
  auto table = *models::shard_layout(spec, t, {1, 1}, {0, 0});
  std::vector<std::byte> host(table.total_bytes());
  REQUIRE_FALSE(models::fill_seeded(spec, {1, 1}, {0, 0}, table, host.data(), seed));
  std::vector<models::safetensor> views;
  for (auto& e : table.entries())
    views.push_back({e.name, e.type, e.shape, host.data() + e.offset_bytes, e.size_bytes});
  REQUIRE_FALSE(models::write_safetensors(dir + "/weights.safetensors", views));
  std::ofstream{dir + "/config.json"} << cfg.dump();
}

json infer(net::http_client& c, const std::string& model, int64_t max_tokens) {
  json body{{"inputs",
             {{{"name", "input_ids"},
               {"datatype", "INT64"},
               {"shape", {2, 3}},
               {"data", {1, 2, 3, 7, 8, 9}}}}},
            {"parameters", {{"max_tokens", max_tokens}}}};
  auto r = c.request("POST", "/v2/models/" + model + "/infer", body.dump()).value();
  INFO(model << ": " << r.body);
  REQUIRE(r.status == 200);
  return json::parse(r.body)["outputs"][0]["data"];
}

}  // namespace

TEST_CASE("Hugging Face OPT folders serve the same tokens as our format, TP1 and TP2 x PP2",
          "[net][e2e][hf]") {
  auto dir = test::temp_path("hf-serve");
  fs::remove_all(dir);
  auto repo = dir + "/repo";
  auto spec = *models::find_spec("opt-tiny");
  // Only Hugging Face's files: served on defaults (TP1 on device 0, the checkpoint's f32).
  REQUIRE_FALSE(models::write_hf_opt_folder(repo + "/hf", spec, gpu::dtype::f32, 9, 2));
  // Hugging Face's files with our settings beside them.
  REQUIRE_FALSE(models::write_hf_opt_folder(repo + "/hf22", spec, gpu::dtype::f32, 9, 3));
  std::ofstream{repo + "/hf22/computron.json"} << json{{"tp", 2}, {"pp", 2}}.dump();
  // An f16 checkpoint on emulated devices: served in bf16 (f16 needs CUDA).
  REQUIRE_FALSE(models::write_hf_opt_folder(repo + "/hf16", spec, gpu::dtype::f16, 9, 1));
  write_native(repo + "/native", {{"spec", "opt-tiny"}, {"dtype", "f32"}}, gpu::dtype::f32, 9);
  write_native(repo + "/native22", {{"spec", "opt-tiny"}, {"dtype", "f32"}, {"tp", 2}, {"pp", 2}},
               gpu::dtype::f32, 9);
  // Hidden folders are never models, whatever they hold.
  fs::create_directories(repo + "/.hidden");
  std::ofstream{repo + "/.hidden/config.json"} << "not json";
  json cfg{{"devices", {{"kind", "emulated"}, {"count", 4}, {"capacity_mb", 64}, {"link_gbps", 1}}},
           {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
           {"repository", "repo"}};
  std::ofstream{dir + "/config.json"} << cfg.dump();
  {
    child_process proc{std::vector<std::string>{"/usr/bin/timeout", "300", COMPUTRON_BINARY,
                                                "serve", "--config", dir + "/config.json"}};
    auto port = test::wait_for_port(proc);
    REQUIRE(port > 0);
    auto c = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
    auto meta = json::parse(c->request("GET", "/v2/models/hf16").value().body, nullptr, false);
    INFO(meta.dump());
    CHECK(meta.dump().find("bf16") != std::string::npos);
    auto hf = infer(*c, "hf", 4);
    CHECK(hf == infer(*c, "native", 4));
    auto hf22 = infer(*c, "hf22", 4);
    CHECK(hf22 == infer(*c, "native22", 4));
    CHECK(infer(*c, "hf16", 4).size() == 8);
    // The direct reference run reads the same folder the same way.
    std::string cmd = std::string{"timeout 120 "} + COMPUTRON_BINARY + " generate --model-dir " +
                      repo + "/hf22 --prompts '[[1,2,3],[7,8,9]]' --max-tokens 4 2>/dev/null";
    std::string out;
    if (auto* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      while (auto n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
      pclose(p);
    }
    auto ref = json::parse(out, nullptr, false);
    REQUIRE(ref.is_array());
    json flat = json::array();
    for (auto& row : ref)
      for (auto& t : row) flat.push_back(t);
    CHECK(flat == hf22);
  }
  fs::remove_all(dir);
}

TEST_CASE("f16 placed on emulated devices is refused naming the device kind", "[net][e2e][hf]") {
  auto dir = test::temp_path("f16-refused");
  fs::remove_all(dir);
  fs::create_directories(dir + "/repo/m");
  std::ofstream{dir + "/repo/m/config.json"} << json{{"spec", "opt-tiny"}, {"dtype", "f16"}}.dump();
  auto r = test::run("generate --model-dir " + dir + "/repo/m --prompts '[[1,2]]'", true);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.all, Catch::Contains("f16 runs only on CUDA devices, and it is placed on emulated "
                                    "devices; use bf16 or f32 there"));
  fs::remove_all(dir);
}

TEST_CASE("a request that joins a running batch gets the tokens it gets alone (OPT TP2 x PP2)",
          "[net][e2e][continuous]") {
  auto dir = test::temp_path("join-serve");
  fs::remove_all(dir);
  auto spec = *models::find_spec("opt-tiny");
  REQUIRE_FALSE(models::write_hf_opt_folder(dir + "/repo/m", spec, gpu::dtype::f32, 9, 3));
  std::ofstream{dir + "/repo/m/computron.json"} << json{{"tp", 2}, {"pp", 2}}.dump();
  json cfg{{"devices", {{"kind", "emulated"}, {"count", 4}, {"capacity_mb", 64}, {"link_gbps", 1}}},
           {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
           {"repository", "repo"}};
  std::ofstream{dir + "/config.json"} << cfg.dump();
  {
    child_process proc{std::vector<std::string>{"/usr/bin/timeout", "300", COMPUTRON_BINARY,
                                                "serve", "--config", dir + "/config.json"}};
    auto port = test::wait_for_port(proc);
    REQUIRE(port > 0);
    // Greedy: the tokens are the model's, whatever else shares the batch.
    // Sends only; `checked` asserts on the test's thread (Catch's assertions and INFO are
    // not thread-safe, and one request below runs on a thread of its own).
    auto send = [&](std::vector<int64_t> prompt, int64_t max_tokens) {
      auto c = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
      json body{{"inputs",
                 {{{"name", "input_ids"},
                   {"datatype", "INT64"},
                   {"shape", {1, static_cast<int64_t>(prompt.size())}},
                   {"data", prompt}}}},
                {"parameters", {{"max_tokens", max_tokens}}}};
      return c->request("POST", "/v2/models/m/infer", body.dump(), 60s).value();
    };
    auto checked = [](const net::http_result& r) {
      INFO(r.body);
      REQUIRE(r.status == 200);
      return json::parse(r.body);
    };
    auto ask = [&](std::vector<int64_t> prompt, int64_t max_tokens) {
      return checked(send(std::move(prompt), max_tokens));
    };
    const std::vector<int64_t> long_prompt{1, 2, 3}, short_prompt{7, 8, 9, 40, 41};
    auto long_alone = ask(long_prompt, 120)["outputs"][0]["data"];
    auto short_alone = ask(short_prompt, 6)["outputs"][0]["data"];
    REQUIRE(long_alone.size() == 120);
    REQUIRE(short_alone.size() == 6);
    // The short request arrives while the long one decodes: it joins the long one's batch
    // (batch_size 2) and still gets its own tokens, and the long one keeps its own. A few
    // tries, in case a try's long request ended before the short one arrived.
    int joined = 0;
    for (int attempt = 0; attempt < 5 && joined == 0; ++attempt) {
      net::http_result long_sent;
      std::thread t{[&] { long_sent = send(long_prompt, 120); }};
      std::this_thread::sleep_for(std::chrono::milliseconds(50 + 50 * attempt));
      auto short_out = ask(short_prompt, 6);
      t.join();
      auto long_out = checked(long_sent);
      CHECK(short_out["outputs"][0]["data"] == short_alone);
      CHECK(long_out["outputs"][0]["data"] == long_alone);
      if (short_out["parameters"]["batch_size"] == 2) ++joined;
    }
    CHECK(joined == 1);
  }
  fs::remove_all(dir);
}
