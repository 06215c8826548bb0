#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/child_process.hpp"
#include "common/error.hpp"
#include "models/chat_template.hpp"
#include "tests/support/npm.hpp"
#include "tests/support/temp_files.hpp"

// The chat templates of real models (the npm tokenizer packages scripts/setup installs)
// against Hugging Face's JavaScript Jinja: a fixture of its outputs made once by
// tests/models/chat_template_oracle.mjs, and (tag [chat_template_oracle]) the oracle run live.

using namespace computron;
using namespace computron::models;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

/// A file of the source tree, looked for upward from the working directory and from the
/// test binary (ctest runs it in the build tree); empty when neither finds it.
std::string source_file(const std::string& relative) {
  std::vector<fs::path> starts{fs::current_path()};
  std::error_code ec;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  for (auto& start : starts)
    for (auto p = start;; p = p.parent_path()) {
      if (fs::exists(p / relative)) return (p / relative).string();
      if (p == p.parent_path()) break;
    }
  return {};
}

ojson read_json(const std::string& path) {
  std::ifstream in{path};
  REQUIRE(in);
  return ojson::parse(in);
}

const ojson& fixture() {
  static ojson f = [] {
    auto path = source_file("tests/models/data/chat_templates.json");
    INFO("tests/models/data/chat_templates.json not found");
    REQUIRE(!path.empty());
    return read_json(path);
  }();
  return f;
}

/// One package's template with its special tokens.
struct real_template {
  std::string source;
  std::shared_ptr<const chat_template> parsed;
  ojson bos, eos;
};

/// The chat_template of a package's tokenizer_config.json; Llama 2's package ships its
/// config without one, so the fixture holds meta-llama's Llama-2-chat template for it.
real_template load(const std::string& name) {
  const auto& entry = fixture()["templates"][name];
  auto dir = test::npm_package(entry["package"].get<std::string>());
  INFO(entry["package"] << " is missing under " << test::npm_dir() << ": run scripts/setup");
  REQUIRE(!dir.empty());
  auto config = read_json(dir + "/models/tokenizer_config.json");
  real_template t;
  auto token = [](const ojson& v) { return v.is_object() ? v["content"] : v; };
  t.bos = config.contains("bos_token") ? token(config["bos_token"]) : ojson{};
  t.eos = config.contains("eos_token") ? token(config["eos_token"]) : ojson{};
  if (config.contains("chat_template") && config["chat_template"].is_string()) {
    t.source = config["chat_template"].get<std::string>();
    INFO(
        "the package's template differs from the one the fixture was made with: run "
        "node tests/models/chat_template_oracle.mjs generate "
        "tests/models/data/chat_templates.json");
    CHECK(t.source == entry["chat_template"].get<std::string>());
  } else {
    CHECK(name == "llama2");
    t.source = entry["chat_template"].get<std::string>();
  }
  auto parsed = chat_template::parse(t.source);
  INFO((parsed ? "" : render(parsed.error())));
  REQUIRE(parsed);
  t.parsed = *parsed;
  return t;
}

std::map<std::string, real_template>& templates() {
  static std::map<std::string, real_template> all = [] {
    std::map<std::string, real_template> m;
    for (auto& [name, entry] : fixture()["templates"].items()) m.emplace(name, load(name));
    return m;
  }();
  return all;
}

/// Random conversations of the shapes each template expects (seeded: the same every run).
class conversation_maker {
 public:
  explicit conversation_maker(uint32_t seed) : rng_(seed) {}

  ojson make(const std::string& name, const real_template& t) {
    ojson ctx = ojson::object();
    ojson messages = ojson::array();
    bool qwen = name == "qwen3";
    if (chance(0.5)) messages.push_back(message("system", text(!qwen)));
    int turns = pick(1, 5);
    for (int i = 0; i < turns; ++i) {
      // Llama 2 refuses roles that do not alternate: sometimes break the rule on purpose.
      bool alternate = name != "llama2" || !chance(0.1);
      messages.push_back(message("user", text(!qwen)));
      if (!alternate) messages.push_back(message("user", text(false)));
      if (i + 1 == turns && chance(0.5)) break;
      if (qwen && chance(0.3)) add_tool_round(messages);
      messages.push_back(qwen ? qwen_assistant() : message("assistant", text(true)));
    }
    ctx["messages"] = messages;
    ctx["add_generation_prompt"] = chance(0.5);
    ctx["bos_token"] = t.bos;
    ctx["eos_token"] = t.eos;
    if (qwen && chance(0.3)) ctx["tools"] = tools();
    if (qwen && chance(0.3)) ctx["enable_thinking"] = chance(0.5);
    return ctx;
  }

 private:
  bool chance(double p) { return std::uniform_real_distribution<double>{0, 1}(rng_) < p; }
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>{lo, hi}(rng_); }
  template <class T>
  const T& one_of(const std::vector<T>& v) {
    return v[static_cast<size_t>(pick(0, static_cast<int>(v.size()) - 1))];
  }

  /// Words with special characters, unicode and template syntax; surrounding whitespace
  /// only where the template strips it the same way in Python and in the oracle.
  std::string text(bool padded) {
    static const std::vector<std::string> words = {"hello",
                                                   "world",
                                                   "Caf\xC3\xA9",
                                                   "\xE4\xB8\xAD\xE6\x96\x87",
                                                   "\xF0\x9F\x98\x80",
                                                   "x",
                                                   "it's",
                                                   "\"quoted\"",
                                                   "back\\slash",
                                                   "{{ x }}",
                                                   "{% if y %}",
                                                   "<|im_end|>",
                                                   "</s>",
                                                   "[INST]",
                                                   "tab\there",
                                                   "42",
                                                   "3.14",
                                                   "-",
                                                   "...",
                                                   "<tool_call>",
                                                   "\xC3\x9F"};
    static const std::vector<std::string> gaps = {" ", " ", " ", "\n", "\n\n", ", "};
    static const std::vector<std::string> pads = {" ", "\n", "\t", "  \n "};
    std::string s;
    int n = pick(1, 12);
    for (int i = 0; i < n; ++i) s += (i ? one_of(gaps) : "") + one_of(words);
    if (padded && chance(0.3)) s = one_of(pads) + s;
    if (padded && chance(0.3)) s += one_of(pads);
    return s;
  }

  static ojson message(const std::string& role, const std::string& content) {
    ojson m = ojson::object();
    m["role"] = role;
    m["content"] = content;
    return m;
  }

  ojson qwen_assistant() {
    if (chance(0.3))
      return message("assistant", "<think>\n" + text(false) + "\n</think>\n\n" + text(false));
    auto m = message("assistant", text(false));
    if (chance(0.2)) m["reasoning_content"] = text(false);
    return m;
  }

  ojson arguments() {
    ojson args = ojson::object();
    args["query"] = text(false);
    if (chance(0.5)) args["limit"] = pick(1, 100);
    if (chance(0.3))
      args["nested"] = ojson{{"flag", chance(0.5)}, {"ratio", 0.5}, {"none", nullptr}};
    return args;
  }

  void add_tool_round(ojson& messages) {
    auto call = message("assistant", chance(0.5) ? "" : text(false));
    ojson calls = ojson::array();
    int n = pick(1, 2);
    for (int i = 0; i < n; ++i) {
      ojson fn = ojson::object();
      fn["name"] = one_of(std::vector<std::string>{"search", "get_weather", "lookup"});
      fn["arguments"] = chance(0.7) ? arguments() : ojson(arguments().dump());
      calls.push_back(chance(0.8) ? ojson{{"type", "function"}, {"function", fn}} : fn);
    }
    call["tool_calls"] = calls;
    messages.push_back(call);
    for (int i = 0; i < n; ++i) messages.push_back(message("tool", text(false)));
  }

  ojson tools() {
    ojson all = ojson::array();
    int n = pick(1, 2);
    for (int i = 0; i < n; ++i) {
      ojson params = ojson::parse(R"({"type": "object", "properties": {
          "query": {"type": "string", "description": "What to look for, \"exactly\""},
          "limit": {"type": "integer", "minimum": 1, "default": 10},
          "filters": {"type": "array", "items": {"type": "string", "enum": ["a", "b\u00e9"]}}},
          "required": ["query"]})");
      ojson fn = ojson::object();
      fn["name"] = "tool_" + std::to_string(i);
      fn["description"] = text(false);
      fn["parameters"] = params;
      all.push_back(ojson{{"type", "function"}, {"function", fn}});
    }
    return all;
  }

  std::mt19937 rng_;
};

/// What our renderer gives, in the oracle's terms: {"output": text} or {"error": message}.
ojson ours(const real_template& t, const ojson& context) {
  auto out = t.parsed->render(context);
  if (out) return ojson{{"output", *out}};
  CHECK(is(out.error(), ec::invalid_request));
  auto text = render(out.error());
  const std::string prefix = "invalid_request: ";
  return ojson{{"error", text.rfind(prefix, 0) == 0 ? text.substr(prefix.size()) : text}};
}

}  // namespace

TEST_CASE("the real templates render the fixed conversations exactly as the oracle did",
          "[models][chat_template][npm]") {
  std::map<std::string, int> counted;
  for (auto& c : fixture()["cases"]) {
    auto name = c["template"].get<std::string>();
    auto& t = templates().at(name);
    INFO(name << ": " << c["name"].get<std::string>());
    auto got = ours(t, c["context"]);
    if (c.contains("expected"))
      CHECK(got == ojson{{"output", c["expected"]}});
    else
      CHECK(got == ojson{{"error", c["error"]}});
    ++counted[name];
  }
  CHECK(counted.size() == 3);
  for (auto& [name, n] : counted) {
    INFO(name);
    CHECK(n >= 12);
  }
}

TEST_CASE("a conversation of thousands of messages renders within the work budget",
          "[models][chat_template][npm]") {
  ojson messages = ojson::array();
  std::string expected = "<|im_start|>system\nbe brief<|im_end|>\n";
  messages.push_back(ojson{{"role", "system"}, {"content", "be brief"}});
  // Ends with a user message: Qwen3 adds empty think tags to assistant turns after the last.
  for (int i = 0; i <= 5000; ++i) {
    auto role = i % 2 ? "assistant" : "user";
    messages.push_back(ojson{{"role", role}, {"content", "message " + std::to_string(i)}});
    expected +=
        std::string{"<|im_start|>"} + role + "\nmessage " + std::to_string(i) + "<|im_end|>\n";
  }
  auto out = templates().at("qwen3").parsed->render(
      ojson{{"messages", messages}, {"add_generation_prompt", false}});
  INFO((out ? "" : render(out.error())));
  REQUIRE(out);
  CHECK(*out == expected);
}

TEST_CASE("mutated templates are parsed or refused, then rendered or refused, never a crash",
          "[models][chat_template]") {
  std::vector<std::string> sources;
  for (auto& [name, t] : templates()) sources.push_back(t.source);
  sources.push_back(
      "{% macro m(a, b=[1, {'k': (2,)}]) %}{{ a ~ b | tojson(indent=2) }}{% endmacro %}"
      "{% for k, v in d.items() if v is not none %}{{ m(k) }}{{ loop.index }}{% else %}-{% endfor "
      "%}"
      "{% set ns = namespace(x=0) %}{{ ns.x if ns.x > 0 else 'z'[::-1] | upper }}{#- c -#}");
  static const std::vector<std::string> pieces = {
      "{%",   "%}",   "{{",   "}}",   "{#",     "#}",    "-",          "+",      "(",     ")",
      "[",    "]",    "{",    "}",    "'",      "\"",    "|",          ".",      ",",     ":",
      "=",    "not ", " in ", " is ", "endfor", "endif", "else",       "\\",     "\n",    " ",
      "loop", "ns",   "**",   "//",   "0",      "-1",    "9999999999", "range(", "'\xC3", "\xFF"};
  std::mt19937 rng{1234};
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>{0, n - 1}(rng); };
  ojson ctx = ojson::parse(R"({"messages": [{"role": "system", "content": "s"},
      {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
      "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "d": {"a": 1}})");
  int parsed = 0, rendered = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = sources[pick(sources.size())];
    int edits = 1 + static_cast<int>(pick(4));
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t at = pick(s.size());
      switch (pick(3)) {
        case 0:
          s.erase(at, 1 + pick(20));
          break;
        case 1:
          s.insert(at, pieces[pick(pieces.size())]);
          break;
        default:
          s.insert(at, s.substr(pick(s.size()), pick(40)));
      }
    }
    auto t = chat_template::parse(s);
    if (!t) {
      CHECK(is(t.error(), ec::invalid_configuration));
      CHECK_THAT(render(t.error()), Catch::Contains("chat template line "));
      continue;
    }
    ++parsed;
    auto out = (*t)->render(ctx);
    if (out) ++rendered;
  }
  CHECK(parsed > 100);
  CHECK(rendered > 50);
}

TEST_CASE("the real templates render as the live oracle does, over random conversations",
          "[.][chat_template_oracle][npm]") {
  auto script = source_file("tests/models/chat_template_oracle.mjs");
  REQUIRE(!script.empty());
  ojson input = ojson::array();
  std::vector<std::string> names;
  for (auto& c : fixture()["cases"]) {
    names.push_back(c["template"].get<std::string>());
    input.push_back(
        ojson{{"template", templates().at(names.back()).source}, {"context", c["context"]}});
  }
  conversation_maker maker{20240601};
  for (int i = 0; i < 200; ++i) {
    for (auto& [name, t] : templates()) {
      names.push_back(name);
      input.push_back(ojson{{"template", t.source}, {"context", maker.make(name, t)}});
    }
  }
  auto in = test::temp_path("oracle-in.json"), out = test::temp_path("oracle-out.json");
  std::ofstream{in} << input.dump();
  child_process node{{"/usr/bin/env", "node", script, "render", in, out}};
  auto line = node.read_line(std::chrono::seconds(120));
  REQUIRE(line);
  REQUIRE(*line == "done");
  auto expected = read_json(out);
  fs::remove(in);
  fs::remove(out);
  REQUIRE(expected.size() == input.size());
  int errors = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    INFO(names[i] << " case " << i << ": " << input[i]["context"].dump());
    CHECK(ours(templates().at(names[i]), input[i]["context"]) == expected[i]);
    errors += expected[i].contains("error") ? 1 : 0;
  }
  // Some random Llama 2 conversations break the alternation its template demands.
  CHECK(errors > 0);
  CHECK(errors < static_cast<int>(input.size()) / 10);
}
