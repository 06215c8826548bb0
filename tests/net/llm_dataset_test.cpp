// loadgen's prompt files as plain functions: vLLM's custom JSONL and ShareGPT's JSON, every
// error they name, the seeded order requests draw them in; and the chat route's bodies and
// stream chunks (the OpenAI chat chunk shape net/http/generation.cpp sends).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "net/client/llm_dataset.hpp"
#include "net/client/llm_loadgen.hpp"
#include "tests/support/temp_files.hpp"

using namespace computron;
using namespace computron::net;
using json = nlohmann::json;

namespace {

caf::expected<std::vector<dataset_prompt>> custom(const std::string& text) {
  std::istringstream in{text};
  return parse_custom_dataset(in, "d.jsonl");
}

caf::expected<std::vector<dataset_prompt>> sharegpt(const std::string& text) {
  std::istringstream in{text};
  return parse_sharegpt_dataset(in, "s.json");
}

/// The error's message, which must be invalid_request.
template <class T>
std::string refused(const caf::expected<T>& r) {
  REQUIRE(!r);
  CHECK(is(r.error(), ec::invalid_request));
  return render(r.error());
}

}  // namespace

TEST_CASE("a custom JSONL dataset: one prompt a line, output_tokens optional",
          "[net][loadgen][dataset]") {
  auto d = custom(
      "{\"prompt\": \"hello\"}\n\n  \r\n{\"prompt\": \"caf\\u00e9\", \"output_tokens\": 7, "
      "\"extra\": 1}\n{\"prompt\": \"x\", \"output_tokens\": null}");
  REQUIRE(d);
  REQUIRE(d->size() == 3);
  CHECK((*d)[0].text == "hello");
  CHECK((*d)[0].output_tokens == 0);
  CHECK(!(*d)[0].reply);
  CHECK((*d)[0].source == "d.jsonl line 1");
  CHECK((*d)[1].text == "caf\xc3\xa9");
  CHECK((*d)[1].output_tokens == 7);
  CHECK((*d)[1].source == "d.jsonl line 4");
  CHECK((*d)[2].output_tokens == 0);

  CHECK_THAT(refused(custom("{\"prompt\": \"a\"}\n{\"prompt\": ")),
             Catch::Contains("d.jsonl line 2: not JSON"));
  CHECK_THAT(refused(custom("[\"a\"]")), Catch::Contains("d.jsonl line 1: not a JSON object"));
  CHECK_THAT(refused(custom("{\"text\": \"a\"}")), Catch::Contains("line 1: no \"prompt\""));
  CHECK_THAT(refused(custom("{\"prompt\": 3}")),
             Catch::Contains("line 1: \"prompt\" is an integer, not a string"));
  CHECK_THAT(refused(custom("{\"prompt\": [\"a\"]}")),
             Catch::Contains("\"prompt\" is an array, not a string"));
  CHECK_THAT(refused(custom("{\"prompt\": \"\"}")), Catch::Contains("line 1: the prompt is empty"));
  for (auto bad : {"0", "-2", "1.5", "\"3\""})
    CHECK_THAT(refused(custom(std::string{"{\"prompt\": \"a\", \"output_tokens\": "} + bad + "}")),
               Catch::Contains("\"output_tokens\" must be a whole number of at least 1"));
  CHECK_THAT(refused(custom("")), Catch::Contains("d.jsonl holds no prompts"));
  CHECK_THAT(refused(custom("\n \n")), Catch::Contains("d.jsonl holds no prompts"));
}

TEST_CASE("a ShareGPT dataset: the first turn asks, the second is the reply",
          "[net][loadgen][dataset]") {
  auto d = sharegpt(R"([
    {"id": "a", "conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
                                  {"from": "human", "value": "Q2"}]},
    {"id": "skip", "conversations": []},
    {"conversations": [{"from": "human", "value": "alone"}]},
    {"conversations": [{"from": "human", "value": "Q3"}, {"from": "gpt", "value": ""}]}])");
  REQUIRE(d);
  REQUIRE(d->size() == 3);
  CHECK((*d)[0].text == "Q1");
  CHECK((*d)[0].reply == std::optional<std::string>{"A1"});
  CHECK((*d)[0].source == "s.json entry 1");
  CHECK((*d)[1].text == "alone");
  CHECK(!(*d)[1].reply);
  CHECK((*d)[1].source == "s.json entry 3");
  CHECK((*d)[2].reply == std::optional<std::string>{""});

  CHECK_THAT(refused(sharegpt("[{\"conversations\": [")), Catch::Contains("s.json is not JSON"));
  CHECK_THAT(refused(sharegpt("{\"conversations\": []}")),
             Catch::Contains("s.json is an object; ShareGPT's shape is an array"));
  CHECK_THAT(refused(sharegpt("[3]")), Catch::Contains("s.json entry 1: not an object"));
  CHECK_THAT(refused(sharegpt("[{\"id\": 1}]")), Catch::Contains("entry 1: no \"conversations\""));
  CHECK_THAT(refused(sharegpt("[{\"conversations\": {}}]")),
             Catch::Contains("\"conversations\" is an object, not a list"));
  CHECK_THAT(
      refused(sharegpt(R"([{"conversations": []}, {"conversations": [{"from": "human"}]}])")),
      Catch::Contains("s.json entry 2: turn 1 is not {\"from\": ..., \"value\": \"...\"}"));
  CHECK_THAT(refused(sharegpt(R"([{"conversations": [{"value": "q"}, {"value": 5}]}])")),
             Catch::Contains("entry 1: turn 2 is not"));
  CHECK_THAT(refused(sharegpt(R"([{"conversations": [{"value": ""}]}])")),
             Catch::Contains("entry 1: the first turn (the prompt) is empty"));
  CHECK_THAT(refused(sharegpt("[]")), Catch::Contains("s.json holds no conversations"));
  CHECK_THAT(refused(sharegpt(R"([{"conversations": []}])")),
             Catch::Contains("s.json holds no conversations"));
}

TEST_CASE("the dataset's name comes from the flag or the file's extension",
          "[net][loadgen][dataset]") {
  CHECK(dataset_kind_of("", "") == dataset_kind::random);
  CHECK(dataset_kind_of("random", "") == dataset_kind::random);
  CHECK(dataset_kind_of("", "a/b.jsonl") == dataset_kind::custom);
  CHECK(dataset_kind_of("", "a/b.json") == dataset_kind::sharegpt);
  CHECK(dataset_kind_of("custom", "b.json") == dataset_kind::custom);
  CHECK(dataset_kind_of("sharegpt", "b.txt") == dataset_kind::sharegpt);
  CHECK_THAT(refused(dataset_kind_of("", "b.txt")),
             Catch::Contains("--dataset-path b.txt: name its shape with --dataset-name"));
  CHECK_THAT(refused(dataset_kind_of("sonnet", "b.txt")),
             Catch::Contains("--dataset-name takes random, custom or sharegpt, not 'sonnet'"));
  CHECK_THAT(refused(dataset_kind_of("random", "b.jsonl")),
             Catch::Contains("reads no --dataset-path"));
  CHECK_THAT(refused(dataset_kind_of("sharegpt", "")),
             Catch::Contains("--dataset-name sharegpt needs --dataset-path FILE"));
  for (auto k : {dataset_kind::random, dataset_kind::custom, dataset_kind::sharegpt})
    CHECK(dataset_kind_of(to_string(k), k == dataset_kind::random ? "" : "f") == k);
}

TEST_CASE("a dataset file is read from disk, and drawn in a seeded order",
          "[net][loadgen][dataset]") {
  test::temp_dir dir{"dataset"};
  auto path = dir.path() + "/d.jsonl";
  std::ofstream{path} << "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n";
  auto d = read_dataset(dataset_kind::custom, path);
  REQUIRE(d);
  CHECK(d->size() == 2);
  CHECK((*d)[1].source == path + " line 2");
  CHECK_THAT(refused(read_dataset(dataset_kind::custom, dir.path() + "/none.jsonl")),
             Catch::Contains("cannot open dataset file " + dir.path() + "/none.jsonl"));
  CHECK_THAT(refused(read_dataset(dataset_kind::sharegpt, path)), Catch::Contains("is not JSON"));

  auto a = dataset_order(50, 3);
  CHECK(a == dataset_order(50, 3));
  CHECK(a != dataset_order(50, 4));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<size_t> all(50);
  std::iota(all.begin(), all.end(), size_t{0});
  CHECK(sorted == all);
  CHECK(a != all);
  CHECK(dataset_order(0, 1).empty());
}

TEST_CASE("a chat request streams one user message, and its chunks carry delta.content",
          "[net][loadgen][chat]") {
  auto body = json::parse(chat_body("m", "hi \"there\"", 7, 0));
  CHECK(body == json{{"model", "m"},
                     {"messages", {{{"role", "user"}, {"content", "hi \"there\""}}}},
                     {"max_tokens", 7},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}});
  auto late = json::parse(chat_body("m", "x", 1, 250));
  CHECK(late.at("deadline_ms") == 250);
  CHECK(late.at("drop_late") == true);
  auto text = json::parse(text_completion_body("m", "caf\xc3\xa9", 2, 0));
  CHECK(text.at("prompt") == "caf\xc3\xa9");
  // Invalid UTF-8 in a dataset's text is sent replaced, never thrown.
  CHECK(json::parse(chat_body("m", "a\xff", 1, 0))["messages"][0]["content"] == "a\xef\xbf\xbd");

  auto chunk = [](json delta, json finish = nullptr) {
    return json{{"id", "chatcmpl-1"},
                {"object", "chat.completion.chunk"},
                {"choices", {{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}}}}
        .dump();
  };
  // The role chunk and the finish chunk carry no token; a content chunk does.
  CHECK(!parse_stream_event(chunk({{"role", "assistant"}, {"content", ""}})).text);
  CHECK(parse_stream_event(chunk({{"content", "Hel"}})).text);
  CHECK(!parse_stream_event(chunk(json::object(), "length")).text);
  auto e = parse_stream_event(chunk({{"content", nullptr}}));
  CHECK(!e.text);
  CHECK(e.error.empty());
  auto usage = parse_stream_event(
      R"({"object": "chat.completion.chunk", "choices": [],
          "usage": {"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26}})");
  CHECK(!usage.text);
  CHECK(usage.prompt_tokens == 21);
  CHECK(usage.completion_tokens == 5);
}
