// `computron loadgen` as a user runs it: the real binary against a real `computron
// serve` process on 127.0.0.1, its output, files and exit code.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "net/client/http_client.hpp"
#include "net/client/loadgen.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"
#include "workload/arrivals.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

using test::run;

namespace {

/// A serve process with three toy models (two fit at once) and a chosen bound on
/// requests outstanding per model.
struct server {
  std::string dir = test::temp_path("loadgen-" + std::to_string(reinterpret_cast<uintptr_t>(this)));
  std::unique_ptr<child_process> proc;
  uint16_t port = 0;

  explicit server(int max_outstanding_per_model = 1024, double compute_ms = 2,
                  double link_gbps = 1.0) {
    fs::create_directories(dir);
    json models = json::array();
    for (int i = 0; i < 3; ++i)
      models.push_back({{"name", std::string{"m"} + static_cast<char>('a' + i)},
                        {"kind", "toy"},
                        {"tp", 2},
                        {"pp", 2},
                        {"seed", i + 1},
                        {"toy_shard_bytes", 1 << 20},
                        {"toy_compute_ms", compute_ms}});
    json cfg{{"devices",
              {{"kind", "emulated"}, {"count", 4}, {"capacity_mb", 2.5}, {"link_gbps", link_gbps}}},
             {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
             {"batching", {{"max_batch_size", 8}, {"batch_window_ms", 2}}},
             {"frontend", {{"max_outstanding_per_model", max_outstanding_per_model}}},
             {"models", models}};
    std::ofstream{dir + "/config.json"} << cfg.dump();
    // Started directly (no `timeout` wrapper) so that a test can kill the server itself.
    proc = std::make_unique<child_process>(std::vector<std::string>{
        COMPUTRON_BINARY, "--log-level", "warn", "serve", "--config", dir + "/config.json"});
    port = test::wait_for_port(*proc);
  }

  ~server() {
    proc.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss{line};
  for (std::string c; std::getline(ss, c, ',');) out.push_back(c);
  return out;
}

/// The q-quantile by the textbook definition, written independently of the product's.
double quantile(std::vector<double> xs, double q) {
  std::sort(xs.begin(), xs.end());
  double h = (static_cast<double>(xs.size()) - 1) * q;
  auto lo = static_cast<size_t>(h);
  if (lo + 1 >= xs.size()) return xs.back();
  return xs[lo] + (h - static_cast<double>(lo)) * (xs[lo + 1] - xs[lo]);
}

}  // namespace

TEST_CASE("loadgen against a live server accounts for every request", "[cli][loadgen]") {
  server srv;
  auto report = srv.dir + "/report";
  auto r = run("loadgen --url " + srv.url() +
               " --models ma,mb,mc --rates 30,5,5 --cv 2 --duration 2 --seed 5 --slo 10 --json"
               " --report " +
               report);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(r.out);
  // The same seed gives the same arrivals here as in the library.
  auto expected = workload::generate({{"ma", "mb", "mc"}, {30, 5, 5}, 2.0, 2.0, 5});
  REQUIRE(expected);
  const size_t n = expected->arrivals.size();
  REQUIRE(n > 20);
  CHECK(j.at("sent") == n);
  CHECK(j.at("ok") == n);
  CHECK(j.at("failed") == 0);
  CHECK(j.at("unsent") == 0);
  size_t per_model = 0;
  for (auto& [name, m] : j.at("models").items()) {
    per_model += m.at("sent").get<size_t>();
    CHECK(m.at("sent") == m.at("ok").get<size_t>() + m.at("failed").get<size_t>());
    CHECK(m.at("p50_s").get<double>() <= m.at("p99_s").get<double>());
    CHECK(m.at("p99_s").get<double>() <= m.at("max_s").get<double>());
  }
  CHECK(per_model == n);
  CHECK(j.at("overall").at("slo_attainment") == 1.0);
  // The server moved models: every model was loaded at least once during the run.
  CHECK(j.at("swaps").at("shard_loads").get<double>() >= 3 * 4);
  CHECK(j.at("swaps").at("bytes_loaded").get<double>() >= 3.0 * 4 * (1 << 20));
  CHECK(j.at("workload").at("kind") == "gamma");

  // The report: the same JSON, one CSV line per request, two pictures.
  auto summary = json::parse(std::ifstream{report + "/summary.json"});
  CHECK(summary.at("sent") == n);
  std::ifstream csv{report + "/requests.csv"};
  std::string line;
  std::getline(csv, line);
  CHECK(line.rfind("index,model,arrival_s", 0) == 0);
  std::vector<double> latencies;
  while (std::getline(csv, line)) {
    auto cols = split(line);
    REQUIRE(cols.size() == 12);
    CHECK(cols[6] == "200");
    latencies.push_back(std::stod(cols[5]));
  }
  REQUIRE(latencies.size() == n);
  // The summary's percentiles are those of the requests it lists.
  CHECK(j.at("overall").at("p50_s").get<double>() ==
        Approx(quantile(latencies, 0.5)).epsilon(1e-4));
  CHECK(j.at("overall").at("p99_s").get<double>() ==
        Approx(quantile(latencies, 0.99)).epsilon(1e-4));
  CHECK(j.at("overall").at("max_s").get<double>() ==
        Approx(quantile(latencies, 1.0)).epsilon(1e-4));
  for (auto svg : {"/latency_cdf.svg", "/timeline.svg"}) {
    std::ifstream in{report + svg};
    std::string text{std::istreambuf_iterator<char>{in}, {}};
    CHECK(text.rfind("<svg", 0) == 0);
    CHECK(text.find("</svg>") != std::string::npos);
    CHECK(text.find("ma") != std::string::npos);
  }
  std::ifstream timeline{report + "/timeline.svg"};
  std::string text{std::istreambuf_iterator<char>{timeline}, {}};
  CHECK(text.find("<title>load m") != std::string::npos);  // swaps drawn from /v2/trace
}

TEST_CASE("loadgen prints a table and replays a trace", "[cli][loadgen]") {
  server srv;
  auto trace = srv.dir + "/trace.csv";
  std::ofstream{trace} << "time_s,model,prompt_len,max_tokens\n0.0,ma,4,2\n0.1,mb\n0.2,ma,,1\n";
  auto r = run("loadgen --no-progress --url " + srv.url() + " --trace " + trace);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("3 requests to 2 models"));
  CHECK_THAT(r.out, Catch::Contains("p99 s"));
  CHECK_THAT(r.out, Catch::Contains("all "));
}

TEST_CASE("loadgen reports a server that refuses with 429", "[cli][loadgen]") {
  server srv{1, 40};  // one outstanding request per model, 40 ms of compute each
  auto r =
      run("loadgen --url " + srv.url() + " --models ma --rates 200 --cv 1 --duration 1 --json");
  CHECK(r.exit_code == 3);
  auto j = json::parse(r.out);
  auto sent = j.at("sent").get<size_t>();
  CHECK(sent > 100);
  CHECK(sent == j.at("ok").get<size_t>() + j.at("failed").get<size_t>());
  CHECK(j.at("ok").get<size_t>() >= 1);
  CHECK(j.at("errors").at("http_429").get<size_t>() >= 50);
}

TEST_CASE("loadgen reports a server that dies mid-run", "[cli][loadgen]") {
  server srv;
  // Killed once it has answered a dozen of loadgen's requests (a fixed delay would race
  // with loadgen's own start on a busy machine).
  std::thread killer{[&] {
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto c = net::http_client::connect("127.0.0.1", srv.port, 2s)) {
        auto m = (*c)->request("GET", "/metrics", {}, 5s);
        double answered = 0;
        if (m && m->status == 200)
          for (auto& [outcome, n] :
               net::prometheus_sum(m->body, "computron_requests_total", "outcome"))
            answered += n;
        if (answered >= 12) break;
      }
      std::this_thread::sleep_for(50ms);  // polling another process
    }
    ::kill(srv.proc->pid(), SIGKILL);
  }};
  auto r = run("loadgen --url " + srv.url() + " --models ma,mb --rates 20,20 --duration 4 --json");
  killer.join();
  CHECK(r.exit_code == 3);
  auto j = json::parse(r.out);
  auto sent = j.at("sent").get<size_t>();
  CHECK(sent == j.at("ok").get<size_t>() + j.at("failed").get<size_t>());
  CHECK(j.at("ok").get<size_t>() > 10);      // before the death
  CHECK(j.at("failed").get<size_t>() > 20);  // after it
  CHECK(j.at("errors").contains("connect"));
  CHECK(j.at("unsent") == 0);
}

TEST_CASE("loadgen refuses bad input with a clear message and a non-zero exit", "[cli][loadgen]") {
  auto dir = test::temp_path("loadgen-bad");
  fs::create_directories(dir);
  std::ofstream{dir + "/bad.csv"} << "0.1,ma\n0.2,mb,x\n";
  auto malformed = run("loadgen --url http://127.0.0.1:9 --trace " + dir + "/bad.csv", true);
  CHECK(malformed.exit_code == 2);
  CHECK_THAT(malformed.out, Catch::Contains("bad.csv line 2: prompt_len 'x'"));
  auto missing = run("loadgen --trace " + dir + "/none.csv", true);
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.out, Catch::Contains("cannot open trace"));
  auto negative = run("loadgen --models a,b --rates 1,-2", true);
  CHECK(negative.exit_code == 2);
  CHECK_THAT(negative.out, Catch::Contains("--rates: -2 is negative"));
  auto cv = run("loadgen --models a --cv -1", true);
  CHECK(cv.exit_code == 2);
  CHECK_THAT(cv.out, Catch::Contains("--cv must be 0 or more"));
  auto mismatch =
      run("loadgen --url http://127.0.0.1:9 --wait-ready 0.2 --models a,b --rates 1", true);
  CHECK(mismatch.exit_code == 2);  // refused before the (absent) server is asked
  CHECK_THAT(mismatch.all, Catch::Contains("1 rates for 2 models"));
  auto url = run("loadgen --url ftp://x", true);
  CHECK(url.exit_code == 2);
  CHECK_THAT(url.out, Catch::Contains("expected http://HOST:PORT"));
  auto both = run("loadgen --rates 1 --power-law 0.5 --total-rate 3", true);
  CHECK(both.exit_code == 2);
  // Nothing listens on port 9 (discard) on a test machine's loopback.
  auto unreachable = run("loadgen --url http://127.0.0.1:9 --wait-ready 0.5 --duration 1", true);
  CHECK(unreachable.exit_code == 1);
  CHECK_THAT(unreachable.out, Catch::Contains("cannot reach a ready server at http://127.0.0.1:9"));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_CASE("loadgen refuses models the server does not have", "[cli][loadgen]") {
  server srv;
  auto trace = srv.dir + "/trace.csv";
  std::ofstream{trace} << "0.0,ma\n0.1,nosuch\n";
  auto r = run("loadgen --no-progress --url " + srv.url() + " --trace " + trace, true);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("unknown model nosuch (the server has: ma, mb, mc)"));
  auto listed = run("loadgen --no-progress --url " + srv.url() + " --models ma,zz", true);
  CHECK(listed.exit_code == 2);
  CHECK_THAT(listed.out, Catch::Contains("unknown model zz"));
}

TEST_CASE("sim --calibrate reads a live server's link efficiency and step times",
          "[cli][sim][loadgen]") {
  // 20 ms per forward step. A slow link (10 ms per 1 MiB shard) keeps the fixed cost of a
  // load (mapping 16 pages, a few ms when CI loads both cores) from passing for a slow link.
  server srv{1024, 20, 0.1};
  // Traffic that swaps (two of three models fit) and teaches the manager its step times.
  auto lg = run("loadgen --url " + srv.url() +
                " --models ma,mb,mc --rates 8,8,8 --duration 2 --seed 3 --max-tokens 2 --json");
  REQUIRE(lg.exit_code == 0);
  auto sim = run("sim --config " + srv.dir + "/config.json --calibrate " + srv.url() +
                 " --models ma,mb,mc --rates 1,1,1 --duration 2 --seed 1 --json");
  INFO(sim.out);
  REQUIRE(sim.exit_code == 0);
  auto j = json::parse(sim.out);
  auto& cost = j.at("cost");
  // The emulated links run at their nominal rate (bench swap: 0.999), page faults aside.
  CHECK(cost.at("link_efficiency").get<double>() > 0.2);
  CHECK(cost.at("link_efficiency").get<double>() <= 1.0);
  CHECK(cost.at("evict_s").get<double>() < 0.1);
  // Every model's step time is the server's measurement: 20 ms of emulated compute, plus
  // the messages between stages, never less.
  auto& steps = j.at("measured_step_s");
  for (auto m : {"ma", "mb", "mc"}) {
    INFO(m);
    REQUIRE(steps.contains(m));
    CHECK(steps.at(m).get<double>() >= 0.019);
    CHECK(steps.at(m).get<double>() < 0.5);
  }
  // A server that is not there is a clear error.
  auto gone = run(
      "sim --config " + srv.dir + "/config.json --calibrate http://127.0.0.1:1" + " --duration 1",
      true);
  CHECK(gone.exit_code != 0);
  CHECK_THAT(gone.all, Catch::Contains("--calibrate"));
}
