// Model control as Triton's explicit mode has it, against the real `computron serve`
// process: a repository with a good folder, an unreadable one, a hidden one and one that
// fails to register; a folder added after start; unload with unregister.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "net/client/http_client.hpp"
#include "tests/support/index_entries.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t shard_bytes = 48ull << 20;

void folder(const std::string& repo, const std::string& name, const std::string& config) {
  fs::create_directories(repo + "/" + name);
  std::ofstream{repo + "/" + name + "/config.json"} << config;
}

std::string toy(int seed) {
  return json{
      {"kind", "toy"}, {"tp", 2}, {"pp", 2}, {"seed", seed}, {"toy_shard_bytes", shard_bytes}}
      .dump();
}

/// Resident memory of the serve process (the child of `timeout`), in bytes.
uint64_t rss_of_child(pid_t parent) {
  std::ifstream children{"/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent) +
                         "/children"};
  pid_t pid = 0;
  children >> pid;
  REQUIRE(pid > 0);
  std::ifstream status{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  FAIL("no VmRSS");
  return 0;
}

json index_of(net::http_client& c) {
  auto r = c.request("POST", "/v2/repository/index").value();
  REQUIRE(r.status == 200);
  return json::parse(r.body);
}

using test::entry;
using test::infer_body;

}  // namespace

TEST_CASE("model control: index states and reasons, late folders, unregister, readiness",
          "[net][e2e][control]") {
  auto dir = test::temp_path("control-" + std::to_string(::getpid()));
  auto repo = dir + "/repo";
  folder(repo, "good", toy(1));
  folder(repo, "unreadable", R"({"kind": "toy",)");
  folder(repo, ".hidden", "not even JSON");
  folder(repo, "twice", R"({"kind": "toy", "tp": 2, "devices": [0, 0]})");
  json cfg{
      {"devices", {{"kind", "emulated"}, {"count", 4}, {"capacity_mb", 256}, {"link_gbps", 4}}},
      {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
      {"console_port", -1},
      {"repository", "repo"}};
  std::ofstream{dir + "/config.json"} << cfg.dump();
  // Under ASan freed memory waits in a quarantine instead of going back to the OS; with
  // none, the RSS check below measures the server, not the sanitizer.
  std::string asan = "ASAN_OPTIONS=";
  if (auto* o = std::getenv("ASAN_OPTIONS")) asan += std::string{o} + ":";
  asan += "quarantine_size_mb=0";
  auto proc = std::make_unique<child_process>(
      std::vector<std::string>{"/usr/bin/env", asan, "/usr/bin/timeout", "300", COMPUTRON_BINARY,
                               "serve", "--config", dir + "/config.json"});
  // Bad folders never abort the server.
  auto port = test::wait_for_port(*proc);
  auto c = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());

  // Every folder but the hidden one, with its state and reason.
  auto index = index_of(*c);
  CHECK(index.size() == 3);
  CHECK(entry(index, ".hidden").is_null());
  CHECK(entry(index, "good")["state"] == "READY");
  CHECK(entry(index, "good")["reason"] == "");
  CHECK(entry(index, "unreadable")["state"] == "UNAVAILABLE");
  CHECK_THAT(entry(index, "unreadable")["reason"].get<std::string>(),
             Catch::Contains("is not valid JSON"));
  CHECK(entry(index, "twice")["state"] == "UNAVAILABLE");
  CHECK_THAT(entry(index, "twice")["reason"].get<std::string>(),
             Catch::Contains("holds two shards"));
  auto only_ready = c->request("POST", "/v2/repository/index", R"({"ready": true})").value();
  REQUIRE(only_ready.status == 200);
  CHECK(json::parse(only_ready.body).size() == 1);
  CHECK(c->request("POST", "/v2/repository/index", R"({"redy": true})").value().status == 400);

  // A model that failed to register keeps the server from being ready, and says why.
  auto health = c->request("GET", "/v2/health/ready").value();
  CHECK(health.status == 503);
  auto h = json::parse(health.body);
  CHECK(h["ready"] == false);
  REQUIRE(h["not_ready"].size() == 1);
  CHECK(h["not_ready"][0]["name"] == "twice");
  auto twice = c->request("GET", "/v2/models/twice/ready").value();
  CHECK(twice.status == 503);
  CHECK_THAT(json::parse(twice.body)["reason"].get<std::string>(),
             Catch::Contains("holds two shards"));
  CHECK(c->request("GET", "/v2/models/good/ready").value().status == 200);
  CHECK(c->request("POST", "/v2/models/twice/infer", infer_body().dump()).value().status == 503);

  // Unregistering the failed one makes the server ready.
  auto drop = c->request("POST", "/v2/repository/models/twice/unload",
                         R"({"parameters": {"unregister": true}})")
                  .value();
  REQUIRE(drop.status == 200);
  CHECK(c->request("GET", "/v2/health/ready").value().status == 200);

  // A folder added after start is registered by its load, and serves.
  folder(repo, "late", toy(2));
  CHECK(entry(index_of(*c), "late")["reason"] == "unloaded");
  auto before = rss_of_child(proc->pid());
  auto load = c->request("POST", "/v2/repository/models/late/load").value();
  REQUIRE(load.status == 200);
  CHECK(json::parse(load.body)["state"] == "resident");
  auto served = c->request("POST", "/v2/models/late/infer", infer_body().dump()).value();
  REQUIRE(served.status == 200);
  auto loaded = rss_of_child(proc->pid());
  CHECK(loaded >= before + 3 * shard_bytes);  // four host copies of 48 MiB at least

  // Unload alone evicts; with unregister the host copies go too and the name is free.
  auto unload = c->request("POST", "/v2/repository/models/late/unload").value();
  REQUIRE(unload.status == 200);
  CHECK(json::parse(unload.body)["state"] == "offloaded");
  CHECK(c->request("POST", "/v2/repository/models/late/unload",
                   R"({"parameters": {"unregister": "yes"}})")
            .value()
            .status == 400);
  CHECK(c->request("POST", "/v2/repository/models/late/unload",
                   R"({"parameters": {"unregsiter": true}})")
            .value()
            .status == 400);
  auto gone = c->request("POST", "/v2/repository/models/late/unload",
                         R"({"parameters": {"unregister": true, "unload_dependents": false}})")
                  .value();
  REQUIRE(gone.status == 200);
  CHECK(json::parse(gone.body)["state"] == "unregistered");
  auto after = rss_of_child(proc->pid());
  INFO("RSS before load " << before << ", loaded " << loaded << ", unregistered " << after);
  CHECK(after + 3 * shard_bytes <= loaded);
  CHECK(c->request("POST", "/v2/models/late/infer", infer_body().dump()).value().status == 404);
  CHECK(entry(index_of(*c), "late")["state"] == "UNAVAILABLE");
  CHECK(entry(index_of(*c), "late")["reason"] == "unloaded");
  // Loaded again, it registers from its folder once more.
  REQUIRE(c->request("POST", "/v2/repository/models/late/load").value().status == 200);
  CHECK(c->request("POST", "/v2/models/late/infer", infer_body().dump()).value().status == 200);

  // An unreadable folder: its load says why (400); fixed, it loads.
  auto bad = c->request("POST", "/v2/repository/models/unreadable/load").value();
  CHECK(bad.status == 400);
  CHECK_THAT(bad.body, Catch::Contains("is not valid JSON"));
  folder(repo, "unreadable", toy(3));
  CHECK(c->request("POST", "/v2/repository/models/unreadable/load").value().status == 200);
  // Names are folder names, never paths; parameters of load are refused by name.
  CHECK(c->request("POST", "/v2/repository/models/nothing/load").value().status == 404);
  CHECK(c->request("POST", "/v2/repository/models/..%2Frepo/load").value().status == 404);
  auto param =
      c->request("POST", "/v2/repository/models/good/load", R"({"parameters": {"config": "{}"}})")
          .value();
  CHECK(param.status == 400);
  CHECK_THAT(param.body, Catch::Contains("parameter 'config' is not supported"));
  CHECK_FALSE(proc->exited());
  proc.reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
}
