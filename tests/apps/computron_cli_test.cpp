// The `computron` binary as a user runs it: a real process, its output and exit code.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

using computron::test::run;

TEST_CASE("bench swap --json reports a verified model-parallel swap", "[cli][bench]") {
  auto r =
      run("bench swap --device-kind emulated --devices 2 --size-mb 64 --link-gbps 4 --chunk-mb 8 "
          "--repeats 1 --json",
          false);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("device_kind") == "emulated");
  CHECK(j.at("devices") == 2);
  CHECK(j.at("bytes") == 64ull << 20);
  CHECK(j.at("chunk_bytes") == 8ull << 20);
  CHECK(j.at("link_gbps") == 4.0);
  CHECK(j.at("verified") == true);
  CHECK(j.at("per_device").size() == 2);
  // Physics, not speed: the join cannot beat two links at 4 GB/s, and the figures agree.
  double secs = j.at("load_seconds");
  CHECK(secs >= (64.0 * 1048576) / (2 * 4e9));
  CHECK(j.at("achieved_gbps").get<double>() == Approx((64.0 * 1048576) / secs / 1e9));
  CHECK(j.at("efficiency").get<double>() == Approx(j.at("achieved_gbps").get<double>() / 8.0));
  CHECK(j.at("efficiency").get<double>() <= 1.0);
  CHECK(j.at("evict_ms").get<double>() >= 0);
  CHECK(j.at("single_device_seconds").get<double>() >= (64.0 * 1048576) / 4e9);
  CHECK(j.at("speedup_vs_single_device").get<double>() > 0);
}

TEST_CASE("bench swap prints a table by default", "[cli][bench]") {
  auto r = run("bench swap --device-kind emulated --devices 1 --size-mb 16 --repeats 1", false);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("model-parallel swap: 16 MiB over 1 emulated device"));
  CHECK_THAT(r.out, Catch::Contains("efficiency"));
  CHECK_THAT(r.out, Catch::Contains("verified        yes"));
  CHECK_THAT(r.out, !Catch::Contains("one device "));  // no baseline for a single device
}

TEST_CASE("bench swap rejects bad options with a clear message", "[cli][bench]") {
  auto zero = run("bench swap --device-kind emulated --devices 0", true);
  CHECK(zero.exit_code == 1);
  CHECK_THAT(zero.all, Catch::Contains("--devices must be 1..64"));
  auto negative = run("bench swap --size-mb -5", true);
  CHECK(negative.exit_code == 2);
  CHECK_THAT(negative.all, Catch::Contains("must be positive"));
  auto kind = run("bench swap --device-kind tpu", true);
  CHECK(kind.exit_code == 2);
  CHECK_THAT(kind.all, Catch::Contains("device-kind"));
  auto unknown = run("bench swap --frobnicate", true);
  CHECK(unknown.exit_code == 2);
  auto rate = run("bench swap --device-kind emulated --link-gbps 0", true);
  CHECK(rate.exit_code == 1);
  CHECK_THAT(rate.all, Catch::Contains("--link-gbps"));
  auto huge = run("bench swap --size-mb 100000000 --device-kind emulated", true);
  CHECK(huge.exit_code == 1);
  CHECK_THAT(huge.all, Catch::Contains("host memory"));
}

TEST_CASE("bench swap --model swaps a catalogue model's shards against the replicated vocabulary",
          "[cli][bench][vocab]") {
  // OPT-125M at TP2 x PP2 in bf16: its four shards as the layout gives them, then the same
  // model with every rank holding the whole embedding (and the head's copy), in one run.
  auto r =
      run("bench swap --device-kind emulated --model opt-125m --tp 2 --pp 2 --link-gbps 20 "
          "--repeats 1 --json",
          false);
  INFO(r.all);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("model") == "opt-125m");
  CHECK(j.at("devices") == 4);
  CHECK(j.at("per_device").size() == 4);
  CHECK(j.at("verified") == true);
  // Weights of 125M parameters in bf16; the last stage's slice of the tied head on top.
  CHECK(j.at("weight_bytes").get<double>() == Approx(2.0 * 125.2e6).epsilon(0.01));
  CHECK(j.at("bytes_over_weights").get<double>() == Approx(1.309).epsilon(0.01));
  // Replicated: the 50272 x 768 embedding once more over stage 0's two ranks, the head
  // once more over stage 1's, the 2050 x 768 positions once more over stage 0's.
  CHECK(j.at("replicated_vocab_bytes").get<double>() ==
        Approx(j.at("bytes").get<double>() + (2.0 * 50272 + 2050) * 768 * 2).epsilon(0.0001));
  CHECK(j.at("replicated_vocab_seconds").get<double>() > 0);
  CHECK(j.at("speedup_vs_replicated_vocab").get<double>() > 0);
  auto devices = run("bench swap --device-kind emulated --model opt-125m --tp 2 --devices 3", true);
  CHECK(devices.exit_code == 1);
  CHECK_THAT(devices.all, Catch::Contains("--devices must be tp x pp = 2"));
  auto unknown = run("bench swap --device-kind emulated --model opt-7", true);
  CHECK(unknown.exit_code == 1);
  CHECK_THAT(unknown.all, Catch::Contains("no model shape 'opt-7'"));
}

TEST_CASE("bench layout prints every catalogue model's bytes over its checkpoint's",
          "[cli][bench][vocab]") {
  auto r = run("bench layout", false);
  REQUIRE(r.exit_code == 0);
  // Llama 3.1 8B at TP4: its vocabulary cut, about its weights; replicated, 1.39x them.
  std::regex row{R"(llama-3\.1-8b\s+4x1\s+16\.061\s+16\.062\s+1\.0001\s+1\.3926)"};
  CHECK(std::regex_search(r.out, row));
  CHECK_THAT(r.out, Catch::Contains("qwen2.5-7b") && Catch::Contains("mistral-7b"));
  CHECK_THAT(r.out, !Catch::Contains("opt-tiny"));
  CHECK(run("bench layout --dtype i4", true).exit_code == 1);
}

TEST_CASE("devices lists emulated devices and refuses CUDA without a GPU", "[cli][devices]") {
  auto r = run("devices --kind emulated --count 2 --json", false);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.size() == 2);
  CHECK(j[1].at("name") == "emulated:1");
  auto cuda = run("devices --kind cuda", true);
  if (cuda.exit_code == 0) {
    WARN("a GPU is present: nothing to refuse");
  } else {
    CHECK(cuda.exit_code == 1);
    CHECK_THAT(cuda.all, Catch::Contains("CUDA devices requested"));
  }
}

TEST_CASE("no subcommand prints usage and fails", "[cli]") {
  auto r = run("", true);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.all, Catch::Contains("bench"));
  auto help = run("--help", false);
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("devices"));
}

TEST_CASE("bench forward reports latency of a zero-copy model", "[cli][bench]") {
  auto r =
      run("bench forward --device-kind emulated --model opt-tiny --dtype f32 --batch 2 --seq 8 "
          "--decode-tokens 2 "
          "--repeats 1 --threads 1 --json",
          false);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("model") == "opt-tiny");
  CHECK(j.at("zero_copy") == true);
  CHECK(j.at("batch") == 2);
  CHECK(j.at("prefill_seconds").get<double>() > 0);
  CHECK(j.at("decode_seconds_per_token").get<double>() > 0);
  CHECK(j.at("prefill_tokens_per_second").get<double>() ==
        Approx(16.0 / j.at("prefill_seconds").get<double>()));
}

TEST_CASE("bench forward rejects unknown models and impossible shapes", "[cli][bench]") {
  auto model = run("bench forward --model opt-foo", true);
  CHECK(model.exit_code == 1);
  CHECK_THAT(model.all, Catch::Contains("unknown_model"));
  auto seq = run("bench forward --model opt-tiny --seq 500", true);
  CHECK(seq.exit_code == 1);
  CHECK_THAT(seq.all, Catch::Contains("positions"));
  // 112 + 16 fill opt-tiny's 128 positions, and the counters' step needs one more: refused
  // before any weight is loaded, not by the decode that would pass the end.
  auto edge = run("bench forward --model opt-tiny --seq 112 --decode-tokens 16", true);
  CHECK(edge.exit_code == 1);
  CHECK_THAT(edge.all, Catch::Contains("the one step the counters take"));
  auto dtype = run("bench forward --model opt-tiny --dtype int4", true);
  CHECK(dtype.exit_code == 1);
  CHECK_THAT(dtype.all, Catch::Contains("dtype must be f32, bf16 or f16"));
}

TEST_CASE("bench colocate reports every way of sharing a device, gpu-lets with interference",
          "[cli][bench]") {
  auto r =
      run("bench colocate --device-kind emulated --model opt-tiny --dtype f32 --batch 2 "
          "--seq 8 --steps 4 --threads 1 --splits 50/50 30/70 --json",
          false);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("model") == "opt-tiny");
  CHECK(j.at("steps") == 4);
  std::vector<std::string> names;
  for (auto& w : j.at("ways")) {
    names.push_back(w.at("name"));
    CHECK(w.at("tokens_per_second").get<double>() > 0);
    for (int i = 0; i < 2; ++i) {
      CHECK(w.at("p50_ms")[i].get<double>() > 0);
      CHECK(w.at("p99_ms")[i].get<double>() >= w.at("p50_ms")[i].get<double>());
    }
    if (w.at("name").get<std::string>().rfind("gpulets", 0) == 0)
      for (int i = 0; i < 2; ++i) {
        CHECK(w.at("alone_ms")[i].get<double>() > 0);
        CHECK(w.at("interference")[i].get<double>() > 0);
      }
  }
  CHECK(names == std::vector<std::string>{"alone", "time-shared", "streams", "gpulets 50/50",
                                          "gpulets 30/70"});
  auto bad =
      run("bench colocate --device-kind emulated --model opt-tiny --seq 8 --splits 70/40", true);
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.all, Catch::Contains("A + B <= 100"));
}

TEST_CASE("serve refuses bad configs with a clear error before listening", "[cli][serve]") {
  auto dir = std::string{"/tmp/computron-cli-"} + std::to_string(::getpid());
  auto write = [&](const std::string& file, const std::string& text) {
    std::string cmd =
        "mkdir -p " + dir + "/repo/m && printf '%s' '" + text + "' > " + dir + "/" + file;
    REQUIRE(std::system(cmd.c_str()) == 0);
  };
  write("typo.json", R"({"devices": {"kind": "emulated", "cout": 4}})");
  auto typo = run("serve --config " + dir + "/typo.json --port 0", true);
  CHECK(typo.exit_code == 2);
  CHECK_THAT(typo.all, Catch::Contains("unknown key 'cout'"));
  auto missing = run("serve --config " + dir + "/absent.json --port 0", true);
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.all, Catch::Contains("cannot read"));
  // Without a repository, a config whose only model cannot register stops the server.
  write(
      "dup.json",
      R"({"devices": {"kind": "emulated", "count": 2}, "console_port": -1, "models": [{"name": "m", "kind": "toy", "tp": 2, "devices": [0, 0]}]})");
  auto dup = run("serve --config " + dir + "/dup.json --port 0", true);
  CHECK(dup.exit_code == 1);
  CHECK_THAT(dup.all, Catch::Contains("holds two shards"));
  write("types.json", R"({"models": [{"name": "m", "kind": "toy", "tp": "two"}]})");
  auto type = run("serve --config " + dir + "/types.json --port 0", true);
  CHECK(type.exit_code == 2);
  CHECK_THAT(type.all, Catch::Contains("tp must be a number"));
  // Integers out of their field's range are refused, not truncated or converted with
  // undefined behaviour (a device index of 1e30 was found by fuzzing).
  write("range.json", R"({"models": [{"name": "m", "kind": "toy", "devices": [0, 1e30]}]})");
  auto range = run("serve --config " + dir + "/range.json --port 0", true);
  CHECK(range.exit_code == 2);
  CHECK_THAT(range.all, Catch::Contains("devices must hold integers from"));
  CHECK_THAT(range.all, Catch::Contains("not 1e+30"));
  write("wide.json", R"({"models": [{"name": "m", "kind": "toy", "tp": 4294967298}]})");
  auto wide = run("serve --config " + dir + "/wide.json --port 0", true);
  CHECK(wide.exit_code == 2);
  CHECK_THAT(wide.all, Catch::Contains("tp must be an integer from -2147483648 to 2147483647"));
  // Sizes and times that would overflow their conversion to bytes or to a clock.
  write("huge.json", R"({"devices": {"kind": "emulated", "capacity_mb": 2.7e64}})");
  auto huge = run("serve --config " + dir + "/huge.json --port 0", true);
  CHECK(huge.exit_code == 2);
  CHECK_THAT(huge.all, Catch::Contains("capacity_mb must be from 0 to"));
  write("late.json", R"({"batching": {"deadline_ms": 9000000000000000000}})");
  auto late = run("serve --config " + dir + "/late.json --port 0", true);
  CHECK(late.exit_code == 2);
  CHECK_THAT(late.all, Catch::Contains("deadline_ms must be from 0 to 1000000000"));
  // A number past double's range is not JSON to the reader (so no config carries an
  // infinity to the nodes: CAF 0.17 hangs serializing one).
  write("inf.json", R"({"models": [{"name": "m", "kind": "toy", "toy_compute_ms": 1e400}]})");
  auto inf = run("serve --config " + dir + "/inf.json --port 0", true);
  CHECK(inf.exit_code == 2);
  CHECK_THAT(inf.all, Catch::Contains("inf.json is not valid JSON"));
  write("tok.json", R"({"models": [{"name": "m", "kind": "toy", "tokenizer": "no-such-folder"}]})");
  auto tok = run("serve --config " + dir + "/tok.json --port 0", true);
  CHECK(tok.exit_code == 2);
  CHECK_THAT(tok.all, Catch::Contains("no-such-folder does not exist"));
  // A repository that is not a folder is a usage error; bad folders inside one are not
  // (the model control test serves such a repository).
  auto absent = run("serve --repository " + dir + "/no-repo --port 0", true);
  CHECK(absent.exit_code == 2);
  CHECK_THAT(absent.all, Catch::Contains("is neither a folder nor a GGUF file"));
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("generate prints the tokens of a direct run", "[cli][serve]") {
  auto dir = std::string{"/tmp/computron-gen-"} + std::to_string(::getpid());
  REQUIRE(
      std::system(("mkdir -p " + dir + "/toy && echo '{\"kind\":\"toy\",\"tp\":2,\"pp\":2}' > " +
                   dir + "/toy/config.json")
                      .c_str()) == 0);
  auto r =
      run("generate --model-dir " + dir + "/toy --prompts '[[1,2],[3,4]]' --max-tokens 3", false);
  CHECK(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  REQUIRE(j.is_array());
  CHECK(j.size() == 2);
  CHECK(j[0].size() == 3);
  auto bad = run("generate --model-dir " + dir + "/toy --prompts 'nope'", true);
  CHECK(bad.exit_code == 2);
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("sim runs a config's workload and reports the cost model it used", "[cli][sim]") {
  const std::string config = std::string{COMPUTRON_SOURCE_DIR} + "/configs/sim/exp2-3-models.json";
  auto sim = [&](const std::string& flags) {
    return run("sim --config " + config + " --rates 2,1,1 --duration 5 --seed 1 --json " + flags,
               false);
  };
  auto emulated = sim("");
  INFO(emulated.all);
  REQUIRE(emulated.exit_code == 0);
  auto j = nlohmann::json::parse(emulated.out);
  CHECK(j.at("simulated") == true);
  CHECK(j.at("cost").at("tflops") == 0.05);  // one default, in the cost model
  auto a100 = sim("--profile a100");
  REQUIRE(a100.exit_code == 0);
  CHECK(nlohmann::json::parse(a100.out).at("cost").at("tflops") == 150.0);
  auto given = sim("--profile a100 --tflops 20");
  REQUIRE(given.exit_code == 0);
  CHECK(nlohmann::json::parse(given.out).at("cost").at("tflops") == 20.0);
}

TEST_CASE("sim plans gpu-lets and says which partitions it ended with", "[cli][sim][gpulets]") {
  const std::string config =
      std::string{COMPUTRON_SOURCE_DIR} + "/configs/sim/gpulets-6-models.json";
  auto r =
      run("sim --config " + config + " --rates 2,2,4,2,4,2 --duration 10 --seed 1 --json", false);
  INFO(r.all);
  REQUIRE(r.exit_code == 0);
  auto g = nlohmann::json::parse(r.out).at("gpulets");
  CHECK(g.at("replans").get<int>() >= 1);
  // Each device split in two: the heavy model apart from the two light ones.
  for (auto& p : g.at("partitions")) CHECK(p.size() == 2);
  auto text = run("sim --config " + config + " --rates 2,2,4,2,4,2 --duration 10 --seed 1", false);
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("gpu-lets at the end: ["));
}

TEST_CASE("sim events stay a few per request under overload", "[cli][sim]") {
  // Batches deferred on loading models and the batch window both arm ticks; with one armed
  // time remembered, their ticks multiplied (539 M events for 7,200 requests over 240 s).
  const std::string config =
      std::string{COMPUTRON_SOURCE_DIR} + "/configs/sim/skewed-20-models.json";
  auto r = run("sim --config " + config +
                   " --profile a100 --duration 120 --seed 1 --slo 0.5 --json --power-law 1"
                   " --total-rate 30 --cv 1 --drop-late",
               false);
  // 3: some requests were dropped as late, as drop-late asks.
  REQUIRE((r.exit_code == 0 || r.exit_code == 3));
  auto j = nlohmann::json::parse(r.out);
  auto sent = j.at("sent").get<double>();
  REQUIRE(sent > 3000);
  CHECK(j.at("events").get<double>() / sent < 10);
}

TEST_CASE("sim refuses negative figures instead of using its defaults", "[cli][sim]") {
  const std::string config = std::string{COMPUTRON_SOURCE_DIR} + "/configs/sim/exp2-3-models.json";
  for (auto flag : {"--tflops", "--capacity-gb", "--link-gbps"}) {
    auto r = run("sim --config " + config + " --duration 5 " + flag + " -1", true);
    INFO(r.all);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.all, Catch::Contains(std::string{flag} + " must be above 0"));
  }
  auto cost = computron::test::temp_path("sim-cost.json");
  std::ofstream{cost} << R"({"evict_s": -0.5})";
  auto r = run("sim --config " + config + " --duration 5 --cost " + cost, true);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.all, Catch::Contains("evict_s must be a number, 0 or more"));
  std::remove(cost.c_str());
}

namespace {

/// The subcommands `computron help` lists (its "Subcommands:" section).
std::vector<std::string> listed_subcommands(const std::string& help) {
  std::vector<std::string> out;
  auto at = help.find("Subcommands:");
  REQUIRE(at != std::string::npos);
  std::istringstream lines{help.substr(at)};
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    std::istringstream words{line};
    std::string name;
    if (line.empty() || line[0] != ' ' || !(words >> name)) break;
    out.push_back(name);
  }
  return out;
}

std::string read_source(const std::string& path) {
  std::ifstream in{std::string{COMPUTRON_SOURCE_DIR} + "/" + path};
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("help lists every subcommand, and the README names the same ones", "[cli][docs]") {
  auto help = run("help", false);
  REQUIRE(help.exit_code == 0);
  auto listed = listed_subcommands(help.out);
  std::set<std::string> have(listed.begin(), listed.end());
  for (auto sub : {"serve", "node", "console", "demo", "loadgen", "sim", "generate", "bench",
                   "devices", "help"})
    CHECK(have.count(sub) == 1);
  // Every `computron X` the README shows is a subcommand, and every subcommand is shown.
  auto readme = read_source("README.md");
  std::regex mention{R"(computron ([a-z][a-z-]*))"};
  std::set<std::string> shown;
  for (std::sregex_iterator i{readme.begin(), readme.end(), mention}, end; i != end; ++i)
    shown.insert((*i)[1]);
  shown.erase("binary");  // "the computron binary (serve, node, ...)"
  for (auto& s : shown) {
    INFO("README shows `computron " << s << "`");
    CHECK(have.count(s) == 1);
  }
  for (auto& s : have) {
    INFO("`computron help` lists " << s);
    CHECK(shown.count(s) == 1);
  }
  // And `help SUB` gives that subcommand's flags.
  auto serve = run("help serve", false);
  REQUIRE(serve.exit_code == 0);
  for (auto flag : {"--config", "--repository", "--devices", "--capacity-mb", "--port"})
    CHECK_THAT(serve.out, Catch::Contains(flag));
}

TEST_CASE("the READMEs name only files the repository has", "[cli][docs]") {
  // Files that tools write when they run, not files of the repository.
  const std::set<std::string> written{"gpu-check.md", "gpu-check.json", "summary.json"};
  for (std::string doc : {"README.md", "configs/README.md"}) {
    auto text = read_source(doc);
    auto folder = std::filesystem::path{doc}.parent_path();
    // Markdown links and every *.md named in the text.
    std::regex link{R"(\]\(([^)#\s]+)\))"}, md{R"(([A-Za-z0-9_./-]+\.md)\b)"};
    std::set<std::string> named;
    for (auto* re : {&link, &md})
      for (std::sregex_iterator i{text.begin(), text.end(), *re}, end; i != end; ++i)
        named.insert((*i)[1]);
    for (auto& n : named) {
      if (n.rfind("http", 0) == 0 || written.count(n) > 0) continue;
      auto root = std::filesystem::path{COMPUTRON_SOURCE_DIR};
      bool found = std::filesystem::exists(root / folder / n) || std::filesystem::exists(root / n);
      // A bare name (RESULTS.md) may be one the text gave a path before.
      for (auto& other : named)
        if (!found && other.size() > n.size() &&
            other.compare(other.size() - n.size(), n.size(), n) == 0)
          found = std::filesystem::exists(root / other);
      INFO(doc << " names " << n);
      CHECK(found);
    }
  }
}

TEST_CASE("serve --capacity-mb sets the emulated devices' memory, and only theirs",
          "[cli][serve]") {
  // The built-in models (OPT-125M, about 116 MiB per shard) cannot fit 64 MiB devices:
  // each is refused at registration with the sizes, and with no repository serve stops.
  auto small = run("serve --port 0 --console-port -1 --capacity-mb 64", true);
  INFO(small.all);
  CHECK(small.exit_code == 1);
  CHECK_THAT(small.all, Catch::Contains("on device 0, which holds 64.0 MiB"));
  CHECK_THAT(small.all, Catch::Contains("none of the 3 models could be registered"));
  // Refused where the devices are not emulated ones, and out of range.
  auto dir = computron::test::temp_path("capacity");
  std::filesystem::create_directories(dir);
  for (std::string kind : {"cuda", "auto"}) {
    std::ofstream{dir + "/" + kind + ".json"} << R"({"devices": {"kind": ")" + kind + R"("}})";
    auto r = run(
        "serve --port 0 --console-port -1 --capacity-mb 512 --config " + dir + "/" + kind + ".json",
        true);
    INFO(r.all);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.all, Catch::Contains("--capacity-mb sets the memory of emulated devices, and "
                                      "the devices are '" +
                                      kind + "'"));
  }
  auto zero = run("serve --port 0 --capacity-mb 0", true);
  CHECK(zero.exit_code == 2);
  CHECK_THAT(zero.all, Catch::Contains("--capacity-mb"));
  std::filesystem::remove_all(dir);
}

namespace {

/// `computron demo` of `requests` requests against the server on `port`: every one
/// answered.
computron::test::process_result demo_on(int port, int requests, const std::string& flags) {
  auto r = run("demo --url http://127.0.0.1:" + std::to_string(port) + " --requests " +
                   std::to_string(requests) + " " + flags,
               true);
  INFO(r.all);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.all, Catch::Contains(fmt::format("ok {} of {}", requests, requests)));
  return r;
}

}  // namespace

TEST_CASE("demo prints the summary the README promises, swaps included", "[cli][demo][docs]") {
  // Three toy models, two with the built-in byte tokenizer, whose ids all fall inside the
  // toy's vocabulary (text through /v1/completions), and one
  // without (token ids through KServe infer), on devices that hold two at once: the mix
  // swaps.
  auto dir = computron::test::temp_path("demo");
  std::filesystem::create_directories(dir);
  nlohmann::json models = nlohmann::json::array();
  for (int i = 0; i < 3; ++i) {
    nlohmann::json m{{"name", std::string{"m"} + static_cast<char>('a' + i)},
                     {"kind", "toy"},
                     {"tp", 2},
                     {"pp", 2},
                     {"seed", i + 1},
                     {"toy_shard_bytes", 1 << 20},
                     {"toy_compute_ms", 2}};
    if (i < 2) m["tokenizer"] = "bytes";
    models.push_back(m);
  }
  nlohmann::json cfg{
      {"devices", {{"kind", "emulated"}, {"count", 4}, {"capacity_mb", 2.5}, {"link_gbps", 1}}},
      {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
      {"console_port", -1},
      {"models", models}};
  std::ofstream{dir + "/config.json"} << cfg.dump();
  computron::child_process srv{std::vector<std::string>{"/usr/bin/timeout", "300", COMPUTRON_BINARY,
                                                        "serve", "--config", dir + "/config.json"}};
  auto port = computron::test::wait_for_port(srv);
  REQUIRE(port > 0);
  auto demo = demo_on(port, 30, "--clients 3 --max-tokens 4 --seed 2");
  // What the README's set-up section says the summary holds, each in the output.
  std::ifstream in{std::string{COMPUTRON_SOURCE_DIR} + "/README.md"};
  std::stringstream readme;
  readme << in.rdbuf();
  auto text = std::regex_replace(readme.str(), std::regex{"\\s+"}, " ");
  auto at = text.find("prints a summary (");
  REQUIRE(at != std::string::npos);
  auto promised = text.substr(at, text.find(')', at) - at);
  for (auto [phrase, shown] : std::vector<std::pair<std::string, std::string>>{
           {"latency percentiles", "latency ms: p50"},
           {"requests that waited for a swap", "requests that waited for a swap: "},
           {"shard loads", "shard loads"},
           {"evictions", "evictions"},
           {"GB/s per device", "GB/s"}}) {
    INFO(phrase);
    CHECK_THAT(promised, Catch::Contains(phrase));
    CHECK_THAT(demo.all, Catch::Contains(shown));
  }
  // Three models over room for two, 30 requests: some waited for a load.
  std::smatch waited;
  REQUIRE(std::regex_search(demo.all, waited,
                            std::regex{"requests that waited for a swap: (\\d+) of 30"}));
  CHECK(std::stoi(waited[1]) > 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the main job's config answers with SmolLM2, and the demo's answers repeat with a seed",
          "[cli][demo][gguf]") {
  // configs/default.json as scripts/run serves it: a real chat model under three names, on
  // devices that hold two. Nothing here asserts what the model says; only that the same
  // seed gives the same answers (one client: every request runs alone, so no batch
  // changes its sums), and that chats and completions both answer.
  computron::child_process srv{
      std::vector<std::string>{"/usr/bin/timeout", "300", COMPUTRON_BINARY, "serve", "--config",
                               std::string{COMPUTRON_SOURCE_DIR} + "/configs/default.json",
                               "--port", "0", "--console-port", "-1"}};
  auto port = computron::test::wait_for_port(srv);
  REQUIRE(port > 0);
  auto demo = [&] {
    auto r = demo_on(port, 8, "--clients 1 --max-tokens 8 --seed 3");
    // The answers: from their header to the per-device lines.
    auto from = r.all.find("  answers (");
    auto to = r.all.find("  device 0:");
    REQUIRE(from != std::string::npos);
    REQUIRE(to != std::string::npos);
    return r.all.substr(from, to - from);
  };
  auto first = demo();
  INFO(first);
  CHECK_THAT(first, Catch::Contains(" chat \"") && Catch::Contains(" completion \""));
  CHECK_THAT(first, Catch::Contains("smollm2-"));
  CHECK_THAT(first, !Catch::Contains("random weights"));
  // Answers are text, not empty strings.
  CHECK_THAT(first, !Catch::Contains("-> \"\""));
  auto second = demo();
  CHECK(second == first);
}
