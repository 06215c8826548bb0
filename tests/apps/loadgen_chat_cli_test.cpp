// `computron loadgen --api chat` and its datasets as a user runs them: the real binary
// against a real `computron serve` of a tiny Llama with Llama 3.1's tokenizer and chat
// template, on 127.0.0.1. The expected token counts come from the server's own /tokenize,
// asked here directly.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/client/http_client.hpp"
#include "tests/support/llama_chat_server.hpp"
#include "tests/support/run_binary.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;

using test::run;

namespace {

/// The tiny Llama, with an instruct model's EOS ids (ignore_eos must still give every token).
struct chat_server : test::llama_chat_server {
  chat_server()
      : llama_chat_server{"loadgen-chat", json{{"bos_token_id", 128000},
                                               {"eos_token_id", {128001, 128008, 128009}}}} {}

  /// POST /tokenize's count for `body` (with this server's model added).
  int64_t count(json body) {
    body["model"] = "chat";
    auto c = net::http_client::connect("127.0.0.1", port, 5s);
    REQUIRE(c);
    auto r = (*c)->request("POST", "/tokenize", body.dump(), 30s);
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body).at("count").get<int64_t>();
  }

  /// The tokens a chat request with `text` as its one user message starts from.
  int64_t chat_count(const std::string& text) {
    return count({{"messages", {{{"role", "user"}, {"content", text}}}}});
  }

  /// loadgen's JSON summary for `flags`, which must succeed.
  json loadgen(const std::string& flags) {
    auto r = run("loadgen --no-progress --json --url " + url() + " --models chat " + flags, true);
    INFO(flags << ": " << r.all);
    REQUIRE(r.exit_code == 0);
    auto at = r.out.find('{');
    REQUIRE(at != std::string::npos);
    return json::parse(r.out.substr(at));
  }
};

void check_every_request_answered(const json& j, size_t n) {
  CHECK(j.at("completed") == n);
  CHECK(j.at("failed") == 0);
  CHECK(j.at("unsent") == 0);
  CHECK(j.at("mean_ttft_ms").get<double>() > 0);
  CHECK(j.at("median_ttft_ms").get<double>() <= j.at("median_e2el_ms").get<double>());
}

}  // namespace

TEST_CASE("loadgen streams chat completions of a custom JSONL dataset's prompts",
          "[cli][loadgen][llm][chat]") {
  chat_server srv;
  const std::vector<std::string> prompts{"Tell me about the sea.", "What is two plus two?",
                                         "A haiku on rain, please."};
  auto path = srv.dir.path() + "/prompts.jsonl";
  {
    std::ofstream out{path};
    out << json{{"prompt", prompts[0]}}.dump() << "\n\n"
        << json{{"prompt", prompts[1]}, {"output_tokens", 3}}.dump() << "\n"
        << json{{"prompt", prompts[2]}}.dump() << "\n";
  }
  // Six requests over three prompts: each is drawn twice, whatever the shuffle's order.
  int64_t chat_in = 0, plain_in = 0;
  for (auto& p : prompts) {
    chat_in += 2 * srv.chat_count(p);
    plain_in += 2 * srv.count({{"prompt", p}});
  }
  const int64_t out = 2 * (5 + 3 + 5);

  auto report = srv.dir.path() + "/report";
  auto j = srv.loadgen("--api chat --dataset-name custom --dataset-path " + path +
                       " --num-prompts 6 --max-concurrency 3 --max-tokens 5 --report " + report);
  CHECK(j.at("api") == "chat");
  check_every_request_answered(j, 6);
  CHECK(j.at("total_input_tokens") == chat_in);
  CHECK(j.at("total_output_tokens") == out);
  CHECK(j.at("workload").at("dataset").at("name") == "custom");
  CHECK(json::parse(std::ifstream{report + "/summary.json"}).at("completed") == 6);

  // The completions route sends the same texts as prompts (no template around them).
  auto c =
      srv.loadgen("--api completions --dataset-path " + path + " --num-prompts 6 --max-tokens 5");
  CHECK(c.at("api") == "completions");
  check_every_request_answered(c, 6);
  CHECK(c.at("total_input_tokens") == plain_in);
  CHECK(c.at("total_output_tokens") == out);
  CHECK(plain_in < chat_in);

  // The table names the route.
  auto table = run("loadgen --no-progress --url " + srv.url() + " --models chat --api chat " +
                       "--dataset-path " + path + " --num-prompts 3 --max-tokens 2",
                   true);
  INFO(table.all);
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("3 requests to 1 models at " + srv.url() +
                                        " all due at the start (streamed chat completions)"));
  CHECK_THAT(table.out, Catch::Contains("Successful requests:                     3"));
}

TEST_CASE("loadgen takes ShareGPT's prompts and replies' lengths, and makes chat text",
          "[cli][loadgen][llm][chat]") {
  chat_server srv;
  const std::string asked = "Name three rivers.", reply = "The Nile, the Amazon and the Danube.";
  const std::string alone = "Say nothing more.";
  auto path = srv.dir.path() + "/share.json";
  std::ofstream{path} << json::array({{{"id", "a"},
                                       {"conversations",
                                        {{{"from", "human"}, {"value", asked}},
                                         {{"from", "gpt"}, {"value", reply}},
                                         {{"from", "human"}, {"value", "And lakes?"}}}}},
                                      {{"id", "empty"}, {"conversations", json::array()}},
                                      {{"id", "b"},
                                       {"conversations", {{{"from", "human"}, {"value", alone}}}}}})
                             .dump();
  // The reply's own tokens are the first prompt's output; the lone prompt takes --max-tokens.
  const int64_t reply_tokens = srv.count({{"prompt", reply}, {"add_special_tokens", false}});
  REQUIRE(reply_tokens > 1);
  auto j = srv.loadgen("--api chat --dataset-name sharegpt --dataset-path " + path +
                       " --num-prompts 4 --max-tokens 4");
  check_every_request_answered(j, 4);
  CHECK(j.at("total_input_tokens") == 2 * (srv.chat_count(asked) + srv.chat_count(alone)));
  CHECK(j.at("total_output_tokens") == 2 * (reply_tokens + 4));

  // No dataset: random token ids made text by the server, one user message each.
  auto r = srv.loadgen("--api chat --num-prompts 3 --prompt-len 12 --max-tokens 4 --seed 7");
  CHECK(r.at("api") == "chat");
  check_every_request_answered(r, 3);
  CHECK(r.at("total_output_tokens") == 12);
  // The template's header and the generation prompt come around each message.
  CHECK(r.at("total_input_tokens").get<int64_t>() > 3 * 12);

  // A prompt that fills the model's 256 positions is refused by name before any request.
  std::string words;
  for (int i = 0; i < 300; ++i) words += " river";
  auto long_path = srv.dir.path() + "/long.jsonl";
  std::ofstream{long_path} << json{{"prompt", "short"}}.dump() << "\n"
                           << json{{"prompt", words}}.dump() << "\n";
  auto refused = run("loadgen --no-progress --url " + srv.url() +
                         " --models chat --api chat --num-prompts 2 --dataset-path " + long_path,
                     true);
  INFO(refused.all);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.all, Catch::Contains("the prompt of " + long_path + " line 2 is "));
  CHECK_THAT(refused.all, Catch::Contains("model chat holds 256 positions"));
  CHECK_THAT(refused.all, !Catch::Contains("requests to 1 models"));
}
