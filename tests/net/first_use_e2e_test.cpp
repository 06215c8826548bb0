// What a new user tries first, against the real `computron serve` process over HTTP
// (issue 28): one model folder given as the repository, a model larger than its devices,
// requests for models that cannot serve, --capacity-mb, and --repository beside a config.
#include <catch2/catch.hpp>

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

/// A toy model's folder (our config.json) at `dir`.
void toy_folder(const std::string& dir, uint64_t shard_bytes = 1 << 20, int seed = 1) {
  fs::create_directories(dir);
  std::ofstream{dir + "/config.json"}
      << json{{"kind", "toy"}, {"seed", seed}, {"toy_shard_bytes", shard_bytes}}.dump();
}

/// `computron serve ARGS` on a free port with no console; stopped (SIGTERM) on scope exit.
struct serving {
  std::unique_ptr<child_process> proc;
  uint16_t port = 0;
  std::unique_ptr<net::http_client> c;

  explicit serving(std::vector<std::string> args) {
    std::vector<std::string> argv{"/usr/bin/timeout", "300", COMPUTRON_BINARY, "serve",
                                  "--port",           "0",   "--console-port", "-1"};
    argv.insert(argv.end(), args.begin(), args.end());
    proc = std::make_unique<child_process>(argv);
    port = test::wait_for_port(*proc);
    c = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
  }

  net::http_result get(const std::string& target) { return c->request("GET", target).value(); }
  net::http_result post(const std::string& target, const json& body) {
    return c->request("POST", target, body.dump()).value();
  }

  json index() {
    auto r = c->request("POST", "/v2/repository/index").value();
    REQUIRE(r.status == 200);
    return json::parse(r.body);
  }

  std::vector<std::string> openai_models() {
    auto r = get("/v1/models");
    REQUIRE(r.status == 200);
    auto listed = json::parse(r.body);
    std::vector<std::string> out;
    for (auto& m : listed["data"]) out.push_back(m["id"]);
    return out;
  }
};

using test::entry;
using test::infer_body;

}  // namespace

TEST_CASE("serve --repository given one model's folder serves that model, named after it",
          "[net][e2e][first-use]") {
  auto dir = test::temp_path("one-model");
  fs::remove_all(dir);
  toy_folder(dir + "/my-toy");
  // A subfolder that looks like a model is not one: the folder with config.json is the
  // model, whatever it carries (Hugging Face downloads carry subfolders such as original/).
  toy_folder(dir + "/my-toy/original", 1 << 20, 2);
  {
    // The path as a user types it, with a trailing slash.
    serving s{{"--repository", dir + "/my-toy/", "--devices", "1"}};
    CHECK(s.openai_models() == std::vector<std::string>{"my-toy"});
    auto index = s.index();
    INFO(index.dump());
    REQUIRE(index.size() == 1);
    CHECK(index[0]["name"] == "my-toy");
    CHECK(index[0]["state"] == "READY");
    auto r = s.post("/v2/models/my-toy/infer", infer_body());
    INFO(r.body);
    CHECK(r.status == 200);
    // Model control works on it: unregister, then load registers it from the folder again.
    REQUIRE(s.post("/v2/repository/models/my-toy/unload", {{"parameters", {{"unregister", true}}}})
                .status == 200);
    CHECK(entry(s.index(), "my-toy")["reason"] == "unloaded");
    REQUIRE(s.post("/v2/repository/models/my-toy/load", json::object()).status == 200);
    CHECK(s.post("/v2/models/my-toy/infer", infer_body()).status == 200);
  }
  {
    // A folder of model folders keeps working as before.
    toy_folder(dir + "/repo/a");
    toy_folder(dir + "/repo/b", 1 << 20, 2);
    serving s{{"--repository", dir + "/repo", "--devices", "1"}};
    CHECK(s.openai_models() == std::vector<std::string>{"a", "b"});
  }
  fs::remove_all(dir);
}

TEST_CASE("a model larger than its devices is UNAVAILABLE with the sizes, and requests say why",
          "[net][e2e][first-use]") {
  auto dir = test::temp_path("never-fits");
  fs::remove_all(dir);
  toy_folder(dir + "/repo/fits", 6ull << 20);
  toy_folder(dir + "/repo/huge", 12ull << 20, 2);
  fs::create_directories(dir + "/repo/broken");
  std::ofstream{dir + "/repo/broken/config.json"} << R"({"kind": "toy",)";
  // --capacity-mb: 8 MiB emulated devices (the built-in 192 MiB would hold both).
  serving s{{"--repository", dir + "/repo", "--devices", "1", "--capacity-mb", "8"}};

  // Refused at registration with the sizes, listed UNAVAILABLE with that reason.
  auto index = s.index();
  INFO(index.dump());
  CHECK(entry(index, "fits")["state"] == "READY");
  CHECK(entry(index, "huge")["state"] == "UNAVAILABLE");
  auto why = entry(index, "huge")["reason"].get<std::string>();
  CHECK_THAT(why, Catch::Contains("model huge needs 12.0 MiB on device 0, which holds 8.0 MiB"));
  CHECK(entry(index, "broken")["state"] == "UNAVAILABLE");

  // /v1/models lists only what can serve.
  CHECK(s.openai_models() == std::vector<std::string>{"fits"});

  // Every route answers a model that cannot serve with the index's reason, never "no model
  // named": KServe infer, OpenAI completions, Triton generate, metadata and readiness.
  auto infer = s.post("/v2/models/huge/infer", infer_body());
  CHECK(infer.status == 503);
  CHECK(infer.retry_after.empty());  // retrying cannot make it fit
  CHECK_THAT(infer.body, Catch::Contains("needs 12.0 MiB on device 0"));
  auto completion = s.post("/v1/completions", {{"model", "huge"}, {"prompt", {1, 2}}});
  CHECK(completion.status == 503);
  CHECK_THAT(completion.body, Catch::Contains("needs 12.0 MiB on device 0"));
  CHECK_THAT(completion.body, !Catch::Contains("tokenizer"));
  auto generate = s.post("/v2/models/huge/generate", {{"text_input", "hi"}});
  CHECK(generate.status == 503);
  CHECK_THAT(generate.body, Catch::Contains("needs 12.0 MiB on device 0"));
  auto ready = s.get("/v2/models/huge/ready");
  CHECK(ready.status == 503);
  CHECK_THAT(ready.body, Catch::Contains("needs 12.0 MiB"));

  // A folder that cannot be read: its reason, not "no model named", on every route.
  for (auto& [target, body] : std::vector<std::pair<std::string, json>>{
           {"/v2/models/broken/infer", infer_body()},
           {"/v1/completions", {{"model", "broken"}, {"prompt", "hello"}}},
           {"/v2/models/broken/generate", {{"text_input", "hi"}}}}) {
    auto r = s.post(target, body);
    INFO(target << ": " << r.body);
    CHECK(r.status == 503);
    CHECK_THAT(r.body, Catch::Contains("is not valid JSON"));
    CHECK_THAT(r.body, !Catch::Contains("no model named"));
  }
  CHECK(s.get("/v2/models/broken/ready").status == 503);

  // A name that is nowhere is still a 404.
  auto nope = s.post("/v2/models/nope/infer", infer_body());
  CHECK(nope.status == 404);
  CHECK_THAT(nope.body, Catch::Contains("no model named"));
  CHECK(s.post("/v1/completions", {{"model", "nope"}, {"prompt", "hi"}}).status == 404);

  // The model that fits serves.
  CHECK(s.post("/v2/models/fits/infer", infer_body()).status == 200);
  CHECK_FALSE(s.proc->exited());
  fs::remove_all(dir);
}

TEST_CASE("serve --repository serves beside a config's inline models, instead of its repository",
          "[net][e2e][first-use]") {
  auto dir = test::temp_path("repo-adds");
  fs::remove_all(dir);
  toy_folder(dir + "/config-repo/from-config-repo");
  toy_folder(dir + "/flag-repo/from-flag", 1 << 20, 2);
  json inline_model{{"name", "inline"}, {"kind", "toy"}, {"seed", 3}};
  json cfg{{"devices", {{"kind", "emulated"}, {"count", 1}, {"capacity_mb", 16}}},
           {"models", {inline_model}},
           {"repository", "config-repo"}};
  std::ofstream{dir + "/config.json"} << cfg.dump();
  {
    serving s{{"--config", dir + "/config.json", "--repository", dir + "/flag-repo"}};
    CHECK(s.openai_models() == std::vector<std::string>{"from-flag", "inline"});
    CHECK(entry(s.index(), "from-config-repo").is_null());
  }
  // A name in both is refused at start, naming it.
  toy_folder(dir + "/flag-repo/inline");
  auto r = test::run("serve --port 0 --console-port -1 --config " + dir +
                         "/config.json --repository " + dir + "/flag-repo",
                     true);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.all, Catch::Contains("model inline is both in the config's models and in the "
                                    "repository"));
  fs::remove_all(dir);
}
