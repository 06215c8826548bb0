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
#include "tests/support/random_conversations.hpp"
#include "tests/support/real_chat_templates.hpp"
#include "tests/support/source_tree.hpp"
#include "tests/support/temp_files.hpp"
#include "text/chat_template.hpp"

// The chat templates of real models (the npm tokenizer packages scripts/setup installs)
// against Hugging Face's JavaScript Jinja: a fixture of its outputs made once by
// tests/text/chat_template_oracle.mjs, and (tag [chat_template_oracle]) the oracle run live.

using namespace computron;
using namespace computron::text;
using test::real_template;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

/// A package's template, checked against the one the fixture was made with: the fixture's
/// outputs hold only for that template.
real_template load(const std::string& name) {
  auto t = test::load_real_template(name);
  if (t.from_package) {
    INFO(
        "the package's template differs from the one the fixture was made with: run "
        "node tests/text/chat_template_oracle.mjs generate "
        "tests/text/data/chat_templates.json");
    CHECK(t.source ==
          test::chat_templates_fixture()["templates"][name]["chat_template"].get<std::string>());
  } else {
    CHECK(name == "llama2");
  }
  return t;
}

std::map<std::string, real_template>& templates() {
  static std::map<std::string, real_template> all = [] {
    std::map<std::string, real_template> m;
    for (auto& [name, entry] : test::chat_templates_fixture()["templates"].items())
      m.emplace(name, load(name));
    return m;
  }();
  return all;
}

}  // namespace

TEST_CASE("the real templates render the fixed conversations exactly as the oracle did",
          "[models][chat_template][npm]") {
  std::map<std::string, int> counted;
  for (auto& c : test::chat_templates_fixture()["cases"]) {
    auto name = c["template"].get<std::string>();
    auto& t = templates().at(name);
    INFO(name << ": " << c["name"].get<std::string>());
    auto got = test::render_in_oracle_terms(t, c["context"]);
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
  auto script = test::source_file("tests/text/chat_template_oracle.mjs");
  REQUIRE(!script.empty());
  ojson input = ojson::array();
  std::vector<std::string> names;
  for (auto& c : test::chat_templates_fixture()["cases"]) {
    names.push_back(c["template"].get<std::string>());
    input.push_back(
        ojson{{"template", templates().at(names.back()).source}, {"context", c["context"]}});
  }
  test::conversation_maker maker{20240601, test::javascript_safe_words()};
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
  auto expected = test::read_json(out);
  fs::remove(in);
  fs::remove(out);
  REQUIRE(expected.size() == input.size());
  int errors = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    INFO(names[i] << " case " << i << ": " << input[i]["context"].dump());
    CHECK(test::render_in_oracle_terms(templates().at(names[i]), input[i]["context"]) ==
          expected[i]);
    errors += expected[i].contains("error") ? 1 : 0;
  }
  // Some random Llama 2 conversations break the alternation its template demands.
  CHECK(errors > 0);
  CHECK(errors < static_cast<int>(input.size()) / 10);
}
