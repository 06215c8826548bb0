// Distribution end to end: real `computron node` processes, a real controller (`computron
// serve --config` naming them), CAF's middleman between them, all on 127.0.0.1. Nodes are
// killed, frozen and fed garbage here; every wait is bounded.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/interfaces.hpp"
#include "common/child_process.hpp"
#include "net/client/http_client.hpp"
#include "net/cluster.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct scratch {
  std::string dir;
  explicit scratch(const std::string& name) : dir(test::temp_path(name)) {
    fs::create_directories(dir);
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

/// `computron node` with two emulated devices; port 0 picks a free one.
struct node_process {
  std::unique_ptr<child_process> proc;
  uint16_t port = 0;

  explicit node_process(uint16_t want = 0, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{
        "/usr/bin/timeout",   "300",    COMPUTRON_BINARY, "node",      "--port",
        std::to_string(want), "--kind", "emulated",       "--devices", "2",
        "--capacity-mb",      "64"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc = std::make_unique<child_process>(argv);
    port = test::wait_for_port(*proc);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

json toy(const std::string& name, int tp, int pp, std::vector<int> devices, int seed,
         double compute_ms = 0) {
  return {{"name", name},
          {"kind", "toy"},
          {"tp", tp},
          {"pp", pp},
          {"devices", devices},
          {"seed", seed},
          {"toy_shard_bytes", 1 << 20},
          {"toy_compute_ms", compute_ms}};
}

/// A controller over `nodes` (or, with none, its own 4 devices: the one-process
/// reference).
struct controller {
  std::unique_ptr<child_process> proc;
  uint16_t port = 0;

  controller(const std::string& dir, const std::vector<std::string>& nodes, const json& models,
             const json& tls = nullptr) {
    json cfg{{"http", {{"host", "127.0.0.1"}, {"port", 0}}},
             {"batching", {{"max_batch_size", 4}, {"batch_window_ms", 1}}},
             {"models", models}};
    if (nodes.empty())
      cfg["devices"] = {{"kind", "emulated"}, {"count", 4}, {"capacity_mb", 64}};
    else
      cfg["nodes"] = nodes;
    if (!tls.is_null()) cfg["tls"] = tls;
    auto path = dir + "/controller-" + std::to_string(nodes.size()) + ".json";
    std::ofstream{path} << cfg.dump();
    proc = std::make_unique<child_process>(std::vector<std::string>{
        "/usr/bin/timeout", "300", COMPUTRON_BINARY, "serve", "--config", path});
    port = test::wait_for_port(*proc);
  }

  std::unique_ptr<net::http_client> client() const {
    return std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
  }
};

std::string infer_body(const std::vector<int64_t>& prompt, int64_t max_tokens) {
  return json{{"inputs",
               {{{"name", "input_ids"},
                 {"datatype", "INT64"},
                 {"shape", {1, prompt.size()}},
                 {"data", prompt}}}},
              {"parameters", {{"max_tokens", max_tokens}}}}
      .dump();
}

struct answer {
  int status = 0;
  json body;
  double seconds = 0;
};

answer infer(const controller& c, const std::string& model, std::vector<int64_t> prompt = {1, 2, 3},
             int64_t max_tokens = 4) {
  auto t0 = clock_type::now();
  auto cl = c.client();
  auto r =
      cl->request("POST", "/v2/models/" + model + "/infer", infer_body(prompt, max_tokens), 30s);
  answer a;
  a.seconds = seconds_since(t0);
  if (!r) return a;
  a.status = r->status;
  a.body = json::parse(r->body, nullptr, false);
  return a;
}

json tokens(const answer& a) {
  return a.body.is_object() && a.body.contains("outputs") ? a.body["outputs"][0]["data"] : json{};
}

json status_of(const controller& c) {
  auto r = c.client()->request("GET", "/v2/status");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  return json::parse(r->body);
}

bool node_online(const json& status, const std::string& node) {
  for (auto& n : status["nodes"])
    if (n["node"] == node) return n["online"].get<bool>();
  FAIL("node " << node << " missing from the status");
  return false;
}

/// Polls `model` until it answers 200 or `limit` passed.
answer until_served(const controller& c, const std::string& model, std::chrono::seconds limit) {
  auto until = clock_type::now() + limit;
  answer a;
  while (clock_type::now() < until) {
    a = infer(c, model);
    if (a.status == 200) return a;
    std::this_thread::sleep_for(200ms);
  }
  return a;
}

/// Opens a TCP connection to the port, writes `bytes`, and closes it.
void send_raw(uint16_t port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  size_t off = 0;
  while (off < bytes.size()) {
    auto n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the peer may hang up on garbage: that is fine
    off += static_cast<size_t>(n);
  }
  std::this_thread::sleep_for(100ms);
  ::close(fd);
}

/// BASP's 32-byte header (CAF 0.17): a client handshake announcing a 4 GiB payload.
std::string crafted_basp_header() {
  std::string h(32, '\0');
  h[0] = 0x01;                                                     // client_handshake
  for (int i = 4; i < 8; ++i) h[static_cast<size_t>(i)] = '\xff';  // payload_len
  return h;
}

/// A CA and one certificate it signed (for both sides), made with the openssl CLI.
json make_certificates(const std::string& dir) {
  auto run = [&](const std::string& cmd) {
    INFO(cmd);
    REQUIRE(std::system(("cd " + dir + " && " + cmd + " >/dev/null 2>&1").c_str()) == 0);
  };
  run("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=computron-test-ca "
      "-keyout ca.key -out ca.pem");
  run("openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout peer.key -out peer.csr");
  run("openssl x509 -req -in peer.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
      "-out peer.pem");
  return {
      {"certificate", dir + "/peer.pem"}, {"key", dir + "/peer.key"}, {"cafile", dir + "/ca.pem"}};
}

using wrong_interface = caf::typed_actor<caf::replies_to<int32_t>::with<int32_t>>;

}  // namespace

TEST_CASE("a model whose shards span two nodes answers like one node", "[net][cluster]") {
  scratch s{"cluster-span"};
  node_process a, b;
  // Devices 0-1 are on node a, 2-3 on node b.
  json models = json::array({toy("stages", 1, 2, {1, 2}, 3),      // pipeline stages on both
                             toy("ranks", 2, 1, {1, 2}, 4),       // tensor ranks on both (Gloo)
                             toy("grid", 2, 2, {0, 2, 1, 3}, 5),  // both, every way
                             toy("local", 2, 1, {2, 3}, 6)});
  controller cluster{s.dir, {a.address(), b.address()}, models};
  controller single{s.dir, {}, models};
  for (std::string m : {"stages", "ranks", "grid", "local"})
    for (std::vector<int64_t> prompt : {std::vector<int64_t>{1, 2, 3}, {9, 8, 7, 6, 5}}) {
      auto got = infer(cluster, m, prompt, 5);
      auto want = infer(single, m, prompt, 5);
      INFO(m << ": " << got.body.dump() << " vs " << want.body.dump());
      REQUIRE(got.status == 200);
      REQUIRE(want.status == 200);
      CHECK(tokens(got) == tokens(want));
      CHECK(tokens(got).size() == 5);
    }
  // Loads fanned out to both nodes: each device of "grid" holds its shard, and the status
  // shows both nodes with their devices.
  auto st = status_of(cluster);
  REQUIRE(st["nodes"].size() == 2);
  CHECK(node_online(st, a.address()));
  CHECK(node_online(st, b.address()));
  REQUIRE(st["devices"].size() == 4);
  for (auto& d : st["devices"]) {
    CHECK(d["online"] == true);
    CHECK(d["link-gbps"].get<double>() > 0);
    CHECK(d["loads"].get<int64_t>() >= 1);
    auto held = d["shards"].dump();
    CHECK(held.find("grid") != std::string::npos);
  }
  CHECK(st["devices"][0]["node"] == a.address());
  CHECK(st["devices"][3]["node"] == b.address());
  // An explicit unload reaches the shards on both nodes.
  auto un = cluster.client()->request("POST", "/v2/repository/models/grid/unload");
  REQUIRE(un);
  CHECK(un->status == 200);
  st = status_of(cluster);
  for (auto& d : st["devices"]) CHECK(d["resident"].dump().find("grid") == std::string::npos);
}

TEST_CASE("a killed node fails its requests within 2 s and rejoins when restarted",
          "[net][cluster]") {
  scratch s{"cluster-kill"};
  node_process a;
  auto b = std::make_unique<node_process>();
  const auto b_port = b->port;
  const auto b_addr = b->address();
  json models = json::array({toy("on_a", 2, 1, {0, 1}, 1), toy("on_b", 2, 1, {2, 3}, 2, 4000),
                             toy("across", 1, 2, {1, 2}, 3), toy("ranks", 2, 1, {1, 2}, 4)});
  controller c{s.dir, {a.address(), b_addr}, models};
  auto before = infer(c, "across");
  REQUIRE(before.status == 200);
  auto ranks_before = infer(c, "ranks");
  REQUIRE(ranks_before.status == 200);
  REQUIRE(infer(c, "on_a").status == 200);
  // Two requests on node b compute for 4 s each: they are in flight when it dies.
  std::vector<std::future<answer>> in_flight;
  for (int i = 0; i < 2; ++i)
    in_flight.push_back(std::async(std::launch::async, [&] { return infer(c, "on_b"); }));
  std::this_thread::sleep_for(1500ms);
  auto killed_at = clock_type::now();
  b->proc->signal(SIGKILL);
  for (auto& f : in_flight) {
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    auto r = f.get();
    INFO(r.body.dump());
    CHECK(r.status == 503);
    CHECK(r.body["error"].get<std::string>().find("unavailable") != std::string::npos);
  }
  CHECK(seconds_since(killed_at) < 2.0);
  // The controller lives on; the other node's model serves; the node's models fail at once.
  CHECK_FALSE(c.proc->exited());
  CHECK(infer(c, "on_a").status == 200);
  auto across = infer(c, "across");
  CHECK(across.status == 503);
  CHECK(across.seconds < 2.0);
  auto ready = c.client()->request("GET", "/v2/models/across/ready");
  REQUIRE(ready);
  CHECK(json::parse(ready->body)["ready"] == false);
  CHECK_FALSE(node_online(status_of(c), b_addr));
  // The node restarted on its port rejoins: its models serve again, with the same outputs.
  b.reset();
  node_process b2{b_port};
  auto again = until_served(c, "across", 20s);
  REQUIRE(again.status == 200);
  CHECK(tokens(again) == tokens(before));
  CHECK(node_online(status_of(c), b_addr));
  CHECK(until_served(c, "on_b", 20s).status == 200);
  // Its tensor-parallel group spanned both nodes: it met again at a new rendezvous.
  auto ranks_again = until_served(c, "ranks", 20s);
  INFO(ranks_again.body.dump());
  REQUIRE(ranks_again.status == 200);
  CHECK(tokens(ranks_again) == tokens(ranks_before));
}

TEST_CASE("a frozen node is detected by the heartbeat and rejoins when it thaws",
          "[net][cluster]") {
  scratch s{"cluster-stop"};
  node_process a, b;
  json models = json::array({toy("on_a", 1, 1, {0}, 1), toy("on_b", 1, 1, {2}, 2, 3000)});
  controller c{s.dir, {a.address(), b.address()}, models};
  REQUIRE(infer(c, "on_a").status == 200);
  auto slow = std::async(std::launch::async, [&] { return infer(c, "on_b"); });
  std::this_thread::sleep_for(1000ms);
  auto frozen_at = clock_type::now();
  b.proc->signal(SIGSTOP);
  REQUIRE(slow.wait_for(10s) == std::future_status::ready);
  auto r = slow.get();
  auto noticed = seconds_since(frozen_at);
  b.proc->signal(SIGCONT);
  INFO(r.body.dump());
  CHECK(r.status == 503);
  // The configured connection timeout is 1 s (heartbeat every 200 ms): noticed in about
  // 1 s, well under the 2 minutes the step would otherwise wait (room left for a loaded
  // machine).
  CHECK(noticed < 5.0);
  CHECK(infer(c, "on_a").status == 200);
  CHECK(until_served(c, "on_b", 20s).status == 200);
  CHECK(node_online(status_of(c), b.address()));
}

TEST_CASE("garbage and wrong interfaces on a node port leave the node serving", "[net][cluster]") {
  scratch s{"cluster-garbage"};
  node_process n;
  std::mt19937 rng{7};
  std::string noise(1 << 20, '\0');
  for (auto& ch : noise) ch = static_cast<char>(rng());
  send_raw(n.port, "hello\r\n");
  send_raw(n.port, noise);
  send_raw(n.port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  // A peer that expects another interface is refused by the handshake.
  net::cluster_config cfg;
  caf::actor_system sys{cfg};
  auto wrong = caf::io::remote_actor<wrong_interface>(sys, "127.0.0.1", n.port);
  CHECK_FALSE(wrong);
  // The node still serves a controller.
  auto node = caf::io::remote_actor<actors::node_actor>(sys, "127.0.0.1", n.port);
  REQUIRE(node);
  caf::scoped_actor self{sys};
  size_t devices = 0;
  self->request(*node, caf::timespan{10s}, actors::devices_atom_v)
      .receive([&](std::vector<actors::device_report>& r) { devices = r.size(); },
               [&](caf::error& e) { FAIL(caf::to_string(e)); });
  CHECK(devices == 2);
  CHECK_FALSE(n.proc->exited());
}

TEST_CASE("a TLS node refuses a crafted header and serves a TLS controller", "[net][cluster]") {
  scratch s{"cluster-tls"};
  auto tls = make_certificates(s.dir);
  std::vector<std::string> flags{"--tls-certificate", tls["certificate"], "--tls-key",
                                 tls["key"],          "--tls-cafile",     tls["cafile"]};
  node_process n{0, flags};
  // Over plain BASP this header makes the receiver allocate 4 GiB; TLS drops it first.
  send_raw(n.port, crafted_basp_header());
  send_raw(n.port, crafted_basp_header() + std::string(4096, 'x'));
  std::this_thread::sleep_for(300ms);
  REQUIRE_FALSE(n.proc->exited());
  CHECK(n.proc->rss_kib() < 1024 * 1024);
  controller c{s.dir, {n.address()}, json::array({toy("m", 2, 1, {0, 1}, 1)}), tls};
  auto r = infer(c, "m");
  INFO(r.body.dump());
  CHECK(r.status == 200);
  // A plain controller cannot talk to it.
  net::cluster_config plain;
  caf::actor_system sys{plain};
  CHECK_FALSE(caf::io::remote_actor<actors::node_actor>(sys, "127.0.0.1", n.port));
  CHECK_FALSE(n.proc->exited());
}

TEST_CASE("a node refuses a public address without TLS and bad node lists are errors",
          "[net][cluster]") {
  auto r = test::run("node --host 0.0.0.0 --port 0 --kind emulated", true);
  CHECK(r.exit_code == 2);
  CHECK(r.all.find("without TLS") != std::string::npos);
  auto half = test::run("node --port 0 --kind emulated --tls-certificate /nonexistent.pem", true);
  CHECK(half.exit_code == 2);
  CHECK(half.all.find("all three") != std::string::npos);
  auto bad = test::run("serve --nodes 127.0.0.1:notaport", true);
  CHECK(bad.exit_code == 2);
  CHECK(bad.all.find("port must be a number") != std::string::npos);
  auto dup = test::run("serve --nodes 127.0.0.1:7001,127.0.0.1:7001", true);
  CHECK(dup.exit_code == 2);
  CHECK(dup.all.find("listed twice") != std::string::npos);
  CHECK(net::is_loopback("127.0.0.1"));
  CHECK(net::is_loopback("::1"));
  CHECK_FALSE(net::is_loopback("10.0.0.1"));
  // A node that never answers: serve gives up after node_wait_s and names it.
  scratch s{"cluster-unreachable"};
  {
    std::ofstream{s.dir + "/c.json"}
        << json{{"nodes", {"127.0.0.1:1"}}, {"node_wait_s", 0.5}, {"models", json::array()}}.dump();
  }
  auto t0 = clock_type::now();
  auto gone = test::run("serve --config " + s.dir + "/c.json", true);
  CHECK(gone.exit_code == 1);
  CHECK(gone.all.find("cannot reach node 127.0.0.1:1") != std::string::npos);
  CHECK(seconds_since(t0) < 15);
  auto list = net::parse_node_list("127.0.0.1:7001,[::1]:7002");
  REQUIRE(list);
  CHECK(list->at(1).host == "::1");
  CHECK(list->at(1).port == 7002);
}

TEST_CASE("a controller stops cleanly while it retries a node that is gone", "[net][cluster]") {
  scratch s{"cluster-stop-retrying"};
  auto n = std::make_unique<node_process>();
  controller c{s.dir, {n->address()}, json::array({toy("m", 1, 1, {0}, 1)})};
  n->proc->signal(SIGKILL);
  n.reset();
  // Its link to the node now retries every 500 ms (a detached actor with a delayed
  // message pending, the situation of a stop once seen to hang in ~actor_system).
  std::this_thread::sleep_for(1200ms);
  // It exits by itself (0), neither forced by its own bound on the stop (2) nor killed
  // by the harness (-1).
  CHECK(c.proc->stop(30s) == 0);
}
