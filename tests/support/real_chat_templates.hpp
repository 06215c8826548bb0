#pragma once

#include <fstream>
#include <memory>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "tests/support/npm.hpp"
#include "tests/support/source_tree.hpp"
#include "text/chat_template.hpp"

/// The chat templates of real models (the npm tokenizer packages scripts/setup installs) and
/// the fixture of conversations tests/text/chat_template_oracle.mjs rendered once
/// (tests/text/data/chat_templates.json), as the oracle tests of both oracles, JavaScript
/// and Python, read them.
namespace computron::test {

/// A JSON file, keys in their order (a template's context is rendered in that order).
inline nlohmann::ordered_json read_json(const std::string& path) {
  std::ifstream in{path};
  REQUIRE(in);
  return nlohmann::ordered_json::parse(in);
}

/// tests/text/data/chat_templates.json: each template's package and source, and the
/// cases with what the JavaScript oracle rendered.
inline const nlohmann::ordered_json& chat_templates_fixture() {
  static nlohmann::ordered_json f = [] {
    auto path = source_file("tests/text/data/chat_templates.json");
    INFO("tests/text/data/chat_templates.json not found");
    REQUIRE(!path.empty());
    return read_json(path);
  }();
  return f;
}

/// One package's template with its special tokens.
struct real_template {
  std::string source;
  std::shared_ptr<const text::chat_template> parsed;
  nlohmann::ordered_json bos, eos;
  /// Whether tokenizer_config.json held the template; else (Llama 2's package ships none)
  /// it is the fixture's meta-llama Llama-2-chat template.
  bool from_package = false;
};

/// The chat_template of the package's tokenizer_config.json for the fixture's template
/// `name`, else the fixture's own; parsed.
inline real_template load_real_template(const std::string& name) {
  using ojson = nlohmann::ordered_json;
  const auto& entry = chat_templates_fixture()["templates"][name];
  auto dir = npm_package(entry["package"].get<std::string>());
  INFO(entry["package"] << " is missing under " << npm_dir() << ": run scripts/setup");
  REQUIRE(!dir.empty());
  auto config = read_json(dir + "/models/tokenizer_config.json");
  real_template t;
  auto token = [](const ojson& v) { return v.is_object() ? v["content"] : v; };
  t.bos = config.contains("bos_token") ? token(config["bos_token"]) : ojson{};
  t.eos = config.contains("eos_token") ? token(config["eos_token"]) : ojson{};
  t.from_package = config.contains("chat_template") && config["chat_template"].is_string();
  t.source = t.from_package ? config["chat_template"].get<std::string>()
                            : entry["chat_template"].get<std::string>();
  auto parsed = text::chat_template::parse(t.source);
  INFO((parsed ? "" : render(parsed.error())));
  REQUIRE(parsed);
  t.parsed = *parsed;
  return t;
}

/// What our renderer gives, in the oracles' terms: {"output": text} or {"error": message}.
inline nlohmann::ordered_json render_in_oracle_terms(const real_template& t,
                                                     const nlohmann::ordered_json& context) {
  auto out = t.parsed->render(context);
  if (out) return nlohmann::ordered_json{{"output", *out}};
  CHECK(is(out.error(), ec::invalid_request));
  auto text = render(out.error());
  const std::string prefix = "invalid_request: ";
  return nlohmann::ordered_json{
      {"error", text.rfind(prefix, 0) == 0 ? text.substr(prefix.size()) : text}};
}

/// A chat message {"role", "content"}, the keys in that order.
inline nlohmann::ordered_json chat_message(const std::string& role, const std::string& content) {
  nlohmann::ordered_json m = nlohmann::ordered_json::object();
  m["role"] = role;
  m["content"] = content;
  return m;
}

}  // namespace computron::test
