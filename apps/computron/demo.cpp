// `computron demo`: a short mixed workload against a running server, and its summary.
#include <algorithm>
#include <atomic>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/computron/serve.hpp"
#include "common/error.hpp"
#include "net/client/http_client.hpp"
#include "net/client/loadgen.hpp"
#include "workload/stats.hpp"

namespace computron::app {

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

/// Requests so far that waited for their model's load: those whose swap wait passed the
/// first bucket (1 ms) of computron_request_swap_wait_seconds.
double swap_waits(const std::string& metrics) {
  double all = 0, quick = 0;
  for (auto& [model, n] :
       net::prometheus_sum(metrics, "computron_request_swap_wait_seconds_count", "model"))
    all += n;
  for (auto& [le, n] :
       net::prometheus_sum(metrics, "computron_request_swap_wait_seconds_bucket", "le"))
    if (le == "0.001") quick += n;
  return all - quick;
}

}  // namespace

int run_demo(const demo_options& o) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.ready_timeout_s);
  std::unique_ptr<net::http_client> client;
  while (true) {
    auto c = net::http_client::connect(o.host, o.port, 2s);
    if (c) {
      auto r = (*c)->request("GET", "/v2/health/ready", {}, 5s);
      if (r && r->status == 200) {
        client = std::move(*c);
        break;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "computron demo: no ready server at " << o.host << ':' << o.port << '\n';
      return 1;
    }
    std::this_thread::sleep_for(200ms);  // polling a process we do not control
  }
  auto index = client->request("POST", "/v2/repository/index");
  if (!index || index->status != 200) {
    std::cerr << "computron demo: repository index failed\n";
    return 1;
  }
  struct target {
    std::string name;
    int64_t vocab;
    bool text;        // it has a tokenizer: text prompts through /v1
    bool checkpoint;  // real weights (a seeded model's words are noise)
    // Chat until the model says it has no chat template (a 400), then completions.
    std::atomic<bool> chat{true};
  };
  std::vector<std::unique_ptr<target>> models;
  for (auto& m : json::parse(index->body)) {
    auto name = m["name"].get<std::string>();
    auto info = client->request("GET", "/v2/models/" + name);
    if (!info || info->status != 200) continue;
    auto p = json::parse(info->body)["parameters"];
    auto t = std::make_unique<target>();
    t->name = name;
    t->vocab = p["vocab"].get<int64_t>();
    t->text = p.value("tokenizer", false);
    t->checkpoint = p.value("checkpoint", false);
    models.push_back(std::move(t));
  }
  if (models.empty()) {
    std::cerr << "computron demo: the server has no models\n";
    return 1;
  }
  std::cout << fmt::format(
      "computron demo: {} requests over {} models from {} clients, up to {} tokens each\n",
      o.requests, models.size(), o.clients, o.max_tokens);
  // Text models get chats and completions in turn; models without a tokenizer get token
  // ids through KServe's infer.
  static const std::vector<std::string> questions = {
      "What is the capital of France?", "Write a haiku about the sea.",
      "Name three primary colors.", "What does a GPU do? Answer in one sentence.",
      "Give me one tip for learning to cook."};
  static const std::vector<std::string> openings = {"The capital of France is", "Once upon a time",
                                                    "def fibonacci(n):", "The quick brown fox",
                                                    "Model-parallel swapping moves"};
  std::mutex mtx;
  // Answers by request index, so that the ones printed do not depend on which client
  // finished first.
  std::map<size_t, std::string> answers;
  std::vector<double> latencies;
  std::map<int, size_t> statuses;
  // Whether a request waited for its model's load is in the server's metrics (a text
  // answer, in OpenAI's shape, does not say): read before and after the run.
  auto before = client->request("GET", "/metrics");
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (size_t c = 0; c < o.clients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 rng{o.seed * 7919 + c};
      auto conn = net::http_client::connect(o.host, o.port, 5s);
      for (size_t i = c; i < o.requests; i += o.clients) {
        // Skewed mix: model k is picked with weight 1/(k+1), like the power-law workloads.
        std::vector<double> w;
        for (size_t k = 0; k < models.size(); ++k) w.push_back(1.0 / static_cast<double>(k + 1));
        auto& m = *models[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
        // Sampled, seeded per request: the same seed gives the same answers.
        json sampling{{"max_tokens", o.max_tokens},
                      {"temperature", 0.7},
                      {"top_p", 0.9},
                      {"seed", o.seed + i}};
        auto send = [&](bool chat) -> std::tuple<caf::expected<net::http_result>, std::string> {
          json body = sampling;
          body["model"] = m.name;
          std::string target, shown;
          if (m.text && chat) {
            target = "/v1/chat/completions";
            shown = questions[(i / 2) % questions.size()];
            body["messages"] = json::array({{{"role", "user"}, {"content", shown}}});
          } else if (m.text) {
            target = "/v1/completions";
            shown = openings[(i / 2) % openings.size()];
            body["prompt"] = shown;
          } else {
            json prompt = json::array();
            for (int t = 0; t < 8; ++t)
              prompt.push_back(std::uniform_int_distribution<int64_t>(0, m.vocab - 1)(rng));
            target = "/v2/models/" + m.name + "/infer";
            body = {{"inputs",
                     {{{"name", "input_ids"},
                       {"datatype", "INT64"},
                       {"shape", {1, 8}},
                       {"data", prompt}}}},
                    {"parameters", {{"max_tokens", o.max_tokens}}}};
          }
          if (!conn)
            return {caf::expected<net::http_result>{make_error(ec::io_error, "no connection")},
                    shown};
          return {(*conn)->request("POST", target, body.dump(), 300s), shown};
        };
        auto s = std::chrono::steady_clock::now();
        bool chat = m.text && i % 2 == 0 && m.chat.load();
        auto [r, shown] = send(chat);
        if (chat && r && r->status == 400 && r->body.find("chat template") != std::string::npos) {
          m.chat = false;  // no chat template: completions from now on
          chat = false;
          std::tie(r, shown) = send(false);
        }
        auto ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count();
        std::lock_guard<std::mutex> guard{mtx};
        statuses[r ? r->status : 0]++;
        if (r && r->status == 200) {
          latencies.push_back(ms);
          if (!m.text) continue;
          auto j = json::parse(r->body, nullptr, false);
          auto& choice = j["choices"][0];
          auto text = chat ? choice["message"]["content"].get<std::string>()
                           : choice["text"].get<std::string>();
          answers[i] = fmt::format("  {} {} {} -> {}{}{}", m.name, chat ? "chat" : "completion",
                                   json(shown).dump(), json(text).dump(),
                                   choice.value("finish_reason", "") == "length" ? " ..." : "",
                                   m.checkpoint ? "" : " (random weights)");
        } else {
          std::cerr << "request failed: " << (r ? r->body : render(r.error())) << '\n';
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  auto wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto metrics = client->request("GET", "/metrics");
  std::cout << fmt::format("  ok {} of {} in {:.2f} s ({:.1f} req/s)\n", latencies.size(),
                           o.requests, wall, static_cast<double>(latencies.size()) / wall);
  std::cout << fmt::format(
      "  latency ms: p50 {:.1f}  p90 {:.1f}  p99 {:.1f}  max {:.1f}\n",
      workload::percentile(latencies, 0.5), workload::percentile(latencies, 0.9),
      workload::percentile(latencies, 0.99), workload::percentile(latencies, 1.0));
  if (before && before->status == 200 && metrics && metrics->status == 200) {
    auto waited = swap_waits(metrics->body) - swap_waits(before->body);
    std::cout << fmt::format("  requests that waited for a swap: {:.0f} of {}\n", waited,
                             latencies.size());
  }
  if (!answers.empty()) {
    // The first few by request index: with the same seed, the same lines.
    std::cout << fmt::format("  answers (the first {} text requests, seed {}):\n",
                             std::min<size_t>(answers.size(), 6), o.seed);
    size_t shown = 0;
    for (auto& [i, line] : answers)
      if (shown++ < 6) std::cout << line << '\n';
  }
  if (metrics && metrics->status == 200) {
    auto bytes = net::prometheus_sum(metrics->body, "computron_bytes_loaded_total", "device");
    auto secs = net::prometheus_sum(metrics->body, "computron_load_seconds_sum", "device");
    auto loads = net::prometheus_sum(metrics->body, "computron_shard_loads_total", "device");
    auto evictions =
        net::prometheus_sum(metrics->body, "computron_shard_evictions_total", "device");
    for (auto& [dev, b] : bytes)
      std::cout << fmt::format(
          "  device {}: {:.0f} shard loads, {:.0f} evictions, {:.1f} MiB moved, {:.2f} GB/s\n", dev,
          loads[dev], evictions[dev], b / 1048576.0, secs[dev] > 0 ? b / secs[dev] / 1e9 : 0.0);
  }
  bool ok = latencies.size() == o.requests;
  if (!ok)
    for (auto& [status, n] : statuses)
      if (status != 200) std::cout << fmt::format("  status {}: {}\n", status, n);
  return ok ? 0 : 1;
}

}  // namespace computron::app
