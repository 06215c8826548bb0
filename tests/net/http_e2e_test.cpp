// End to end: the real `computron serve` process, a real socket on 127.0.0.1, the real
// HTTP client.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "net/client/http_client.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// A repository with more models than the devices hold (two of the three toys fit) and
/// one small OPT model; per-model bounds of 4 requests.
struct server {
  std::string dir = test::temp_path("e2e-" + std::to_string(reinterpret_cast<uintptr_t>(this)));
  std::unique_ptr<child_process> proc;
  uint16_t port = 0;

  server() {
    fs::create_directories(dir + "/repo");
    auto model = [&](const std::string& name, const json& cfg) {
      fs::create_directories(dir + "/repo/" + name);
      std::ofstream{dir + "/repo/" + name + "/config.json"} << cfg.dump();
    };
    for (int i = 0; i < 3; ++i)
      model("toy" + std::to_string(i),
            {{"kind", "toy"}, {"tp", 2}, {"pp", 2}, {"seed", i + 1}, {"toy_shard_bytes", 1 << 20}});
    model("tiny", {{"kind", "opt"},
                   {"spec", "opt-tiny"},
                   {"dtype", "f32"},
                   {"tp", 2},
                   {"pp", 2},
                   {"seed", 9}});
    json cfg{{"devices",
              {{"kind", "emulated"}, {"count", 4}, {"capacity_mb", 2.5}, {"link_gbps", 0.02}}},
             {"http", {{"host", "127.0.0.1"}, {"port", 0}, {"max_body_bytes", 65536}}},
             {"batching", {{"max_batch_size", 4}, {"batch_window_ms", 2}, {"max_tokens", 64}}},
             {"frontend", {{"max_outstanding_per_model", 4}}},
             {"repository", "repo"}};
    std::ofstream{dir + "/config.json"} << cfg.dump();
    proc = std::make_unique<child_process>(std::vector<std::string>{
        "/usr/bin/timeout", "300", COMPUTRON_BINARY, "serve", "--config", dir + "/config.json"});
    port = test::wait_for_port(*proc);
  }

  ~server() {
    proc.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  std::unique_ptr<net::http_client> client() {
    return std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
  }
};

json infer_body(const std::vector<std::vector<int64_t>>& rows, int64_t max_tokens) {
  std::vector<int64_t> flat;
  for (auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return {{"inputs",
           {{{"name", "input_ids"},
             {"datatype", "INT64"},
             {"shape", {rows.size(), rows.empty() ? 0 : rows[0].size()}},
             {"data", flat}}}},
          {"parameters", {{"max_tokens", max_tokens}}}};
}

/// `computron generate` on the same model folder: the reference output.
json generate(const std::string& model_dir, const std::string& prompts, int64_t max_tokens) {
  std::string cmd = std::string{"timeout 120 "} + COMPUTRON_BINARY + " generate --model-dir " +
                    model_dir + " --prompts '" + prompts + "' --max-tokens " +
                    std::to_string(max_tokens) + " 2>/dev/null";
  std::string out;
  if (auto* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (auto n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
    pclose(p);
  }
  return json::parse(out, nullptr, false);
}

}  // namespace

TEST_CASE("health metadata repository metrics and trace endpoints answer", "[net][e2e]") {
  server s;
  auto c = s.client();
  auto get = [&](const std::string& path) { return c->request("GET", path).value(); };
  CHECK(get("/v2/health/live").status == 200);
  CHECK(get("/v2/health/ready").status == 200);
  CHECK(json::parse(get("/v2").body)["name"] == "computron");
  auto meta = get("/v2/models/tiny");
  REQUIRE(meta.status == 200);
  CHECK(json::parse(meta.body)["parameters"]["vocab"] == 512);
  CHECK(get("/v2/models/tiny/ready").status == 200);
  CHECK(get("/v2/models/nope").status == 404);
  CHECK(get("/v2/models/nope/ready").status == 404);
  auto index = c->request("POST", "/v2/repository/index").value();
  REQUIRE(index.status == 200);
  CHECK(json::parse(index.body).size() == 4);
  auto load = c->request("POST", "/v2/repository/models/toy0/load").value();
  REQUIRE(load.status == 200);
  CHECK(json::parse(load.body)["state"] == "resident");
  auto unload = c->request("POST", "/v2/repository/models/toy0/unload").value();
  REQUIRE(unload.status == 200);
  CHECK(json::parse(unload.body)["state"] == "offloaded");
  CHECK(c->request("POST", "/v2/repository/models/nope/load").value().status == 404);
  auto metrics = get("/metrics");
  REQUIRE(metrics.status == 200);
  CHECK(metrics.body.find("computron_shard_loads_total") != std::string::npos);
  CHECK(metrics.body.find("computron_device_capacity_bytes") != std::string::npos);
  auto trace = json::parse(get("/v2/trace").body, nullptr, false);
  REQUIRE(trace.is_object());
  bool saw_load = false;
  for (auto& e : trace["traceEvents"]) saw_load = saw_load || e["cat"] == "load";
  CHECK(saw_load);
  CHECK(get("/nowhere").status == 404);
  CHECK(c->request("DELETE", "/v2/health/live").value().status == 405);
  CHECK(c->request("GET", "/v2/models/tiny/infer").value().status == 405);
}

TEST_CASE("more models than fit are served over HTTP and equal a direct generate", "[net][e2e]") {
  server s;
  auto c = s.client();
  std::vector<std::vector<int64_t>> rows{{1, 2, 3}, {7, 8, 9}};
  bool swapped = false;
  for (int round = 0; round < 2; ++round)
    for (std::string m : {"toy0", "toy1", "toy2", "tiny"}) {
      auto r = c->request("POST", "/v2/models/" + m + "/infer", infer_body(rows, 3).dump()).value();
      REQUIRE(r.status == 200);
      auto j = json::parse(r.body);
      CHECK(j["outputs"][0]["shape"] == json({2, 3}));
      swapped = swapped || j["parameters"]["swapped"].get<bool>();
      if (round == 0) {
        auto ref = generate(s.dir + "/repo/" + m, "[[1,2,3],[7,8,9]]", 3);
        REQUIRE(ref.is_array());
        json flat = json::array();
        for (auto& row : ref)
          for (auto& t : row) flat.push_back(t);
        INFO(m);
        CHECK(j["outputs"][0]["data"] == flat);
      }
    }
  CHECK(swapped);
  auto metrics = c->request("GET", "/metrics").value().body;
  CHECK(metrics.find("computron_shard_evictions_total") != std::string::npos);
}

TEST_CASE("bad inputs get the right 4xx and the server keeps serving", "[net][e2e]") {
  server s;
  auto c = s.client();
  auto post = [&](const std::string& model, const std::string& body) {
    return c->request("POST", "/v2/models/" + model + "/infer", body).value();
  };
  CHECK(post("tiny", "{not json").status == 400);
  CHECK(post("tiny", "[1,2]").status == 400);
  CHECK(
      post("tiny", R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1.5,2.5]}]})")
          .status == 400);
  CHECK(post("tiny", R"({"inputs":[{"name":"x","datatype":"INT64","shape":[1,3],"data":[1,2]}]})")
            .status == 400);
  CHECK(post("tiny", R"({"inputs":[{"name":"x","datatype":"INT64","shape":[0,3],"data":[]}]})")
            .status == 400);
  CHECK(post("tiny", R"({"inputs":[]})").status == 400);
  auto vocab = post("tiny", infer_body({{1, 512}}, 1).dump());
  CHECK(vocab.status == 400);
  CHECK(json::parse(vocab.body)["error"].get<std::string>().find("512") != std::string::npos);
  CHECK(post("nope", infer_body({{1, 2}}, 1).dump()).status == 404);
  CHECK(post("tiny", infer_body({{1, 2}}, 100000).dump()).status == 400);
  CHECK(post("tiny", infer_body({{1, 2}}, 127).dump()).status == 400);  // past the 128 positions
  auto sampling = infer_body({{1, 2}}, 1);
  sampling["parameters"]["temperature"] = -2;
  CHECK(post("tiny", sampling.dump()).status == 400);
  std::vector<int64_t> big(50000, 1);  // about 100 KB against a 64 KiB limit
  auto oversized = c->request("POST", "/v2/models/tiny/infer", infer_body({big}, 1).dump());
  REQUIRE(oversized);  // the reply is read, never lost to a reset (lingering close)
  CHECK(oversized->status == 413);
  auto fresh = s.client();
  auto ok =
      fresh->request("POST", "/v2/models/tiny/infer", infer_body({{1, 2, 3}}, 2).dump()).value();
  CHECK(ok.status == 200);
  CHECK(fresh->request("GET", "/v2/health/live").value().status == 200);
  // The adapter routes read folders on the server's disk: off unless the server was started
  // with them on (http_options::runtime_lora_updates), a 404 that says how, as vLLM.
  for (auto route : {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}) {
    auto off = fresh->request("POST", route, R"({"lora_name":"a","lora_path":"/tmp"})").value();
    CHECK(off.status == 404);
    CHECK_THAT(off.body, Catch::Contains("--allow-runtime-lora-updating"));
  }
}

namespace {

struct raw_exchange {
  /// Every byte of the request went out: no EPIPE or reset while sending (a client such
  /// as Python's requests gives up there, without reading the reply).
  bool sent_all = false;
  std::string reply;
};

/// Sends a request with `body_bytes` bytes of body as one buffer, without waiting for a
/// reply in between (as a client that does not use Expect: 100-continue does), then
/// reads until the server closes.
raw_exchange send_at_once(uint16_t port, uint64_t body_bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  std::string msg =
      "POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body_bytes) + "\r\n\r\n";
  msg.append(body_bytes, 'a');
  size_t sent = 0;
  bool broken = false;
  while (sent < msg.size()) {
    auto n = ::send(fd, msg.data() + sent, msg.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      broken = true;
      break;
    }
    sent += static_cast<size_t>(n);
  }
  std::string reply;
  char buf[4096];
  while (true) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return {!broken && sent == msg.size(), reply};
}

}  // namespace

TEST_CASE("a body over the limit sent in one write gets its 413 every time", "[net][e2e]") {
  server s;
  for (uint64_t mb : {2, 16, 64}) {
    INFO(mb << " MB");
    auto [sent_all, reply] = send_at_once(s.port, mb << 20);
    CHECK(sent_all);
    CHECK(reply.rfind("HTTP/1.1 413", 0) == 0);
    CHECK_THAT(reply, Catch::Contains("Connection: close"));
    CHECK_THAT(reply, Catch::Contains("exceeds 65536 bytes"));
  }
  // And the server keeps serving.
  auto c = s.client();
  CHECK(c->request("POST", "/v2/models/tiny/infer", infer_body({{1, 2, 3}}, 2).dump())
            .value()
            .status == 200);
}

TEST_CASE("a burst of ten times the queue bound gets 429s and memory stays bounded", "[net][e2e]") {
  server s;
  auto c = s.client();
  // Warm up once so that allocator growth of a first request does not count.
  REQUIRE(c->request("POST", "/v2/models/toy0/infer", infer_body({{1}}, 1).dump()).value().status ==
          200);
  REQUIRE(c->request("POST", "/v2/repository/models/toy0/unload").value().status == 200);
  auto rss_before = s.proc->rss_kib();
  std::vector<int> statuses(40, 0);
  std::vector<std::string> retry_after(40);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < statuses.size(); ++i)
    ts.emplace_back([&, i] {
      auto conn = net::http_client::connect("127.0.0.1", s.port, 10s);
      if (!conn) return;
      auto r = (*conn)->request("POST", "/v2/models/toy0/infer",
                                infer_body({{int64_t(i) + 1, 2}}, 1).dump(), 60s);
      if (!r) return;
      statuses[i] = r->status;
      retry_after[i] = r->retry_after;
    });
  for (auto& t : ts) t.join();
  int ok = 0, overloaded = 0;
  for (size_t i = 0; i < statuses.size(); ++i) {
    ok += statuses[i] == 200;
    if (statuses[i] == 429) {
      ++overloaded;
      CHECK(retry_after[i] == "1");
    }
  }
  CHECK(ok + overloaded == 40);
  CHECK(ok >= 4);
  CHECK(overloaded >= 1);
  // Every request was answered (above); once the burst has drained, the server's memory is
  // back within 10% of its level before it (polled: the last replies may still be
  // freeing their buffers).
  auto rss_after = s.proc->rss_kib();
  for (int i = 0; i < 50 && rss_after > rss_before + rss_before / 10; ++i) {
    std::this_thread::sleep_for(100ms);
    rss_after = s.proc->rss_kib();
  }
  INFO("RSS before " << rss_before << " KiB, after " << rss_after << " KiB");
  CHECK(rss_after <= rss_before + rss_before / 10);
  CHECK(
      c->request("POST", "/v2/models/toy1/infer", infer_body({{3, 4}}, 2).dump()).value().status ==
      200);
}
