#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/real_chat_templates.hpp"

/// Random conversations for the real chat templates, rendered by ours and by an oracle.
namespace computron::test {

/// What the texts of a conversation are made of: 1 to 12 words joined by gaps, and around
/// a text, each side 30% of the time, a pad.
struct conversation_words {
  std::vector<std::string> words, gaps, pads;
  /// How often a text is empty.
  double empty = 0;
  /// Pads around every text, not only where the caller says the template strips them the
  /// same way in both renderers.
  bool pad_everywhere = false;
};

/// For the JavaScript oracle: special characters, Unicode and template syntax, padded only
/// where @huggingface/jinja strips as Jinja2 does (it does not for Qwen3's strip('\n'), nor
/// for Unicode whitespace).
inline conversation_words javascript_safe_words() {
  return {{"hello",
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
           "\xC3\x9F"},
          {" ", " ", " ", "\n", "\n\n", ", "},
          {" ", "\n", "\t", "  \n "},
          0,
          false};
}

/// For the Python oracle, wider where the JavaScript one had to stay narrow: surrounding
/// whitespace for every template and every role (Qwen3's strip('\n') keeps spaces,
/// @huggingface/jinja strips them), Unicode whitespace (Python's str.strip and `trim` strip
/// U+0085, U+001F and U+3000 but not U+FEFF; JavaScript's trim the other way round for
/// U+0085, U+001F and U+FEFF), empty contents (Llama 2's `system_message != false` holds for
/// '' in Python, not in JavaScript). The JavaScript lists come first and in order, so that a
/// seed keeps drawing the conversations it drew before the lists were shared.
inline conversation_words python_wide_words() {
  auto w = javascript_safe_words();
  w.words.insert(w.words.end(), {"0", "</think>"});
  w.gaps.push_back("\r\n");
  w.pads.insert(w.pads.end(), {" \n", "\n ", "\r\n", "\xC2\x85", "\xC2\xA0", "\xE3\x80\x80", "\x1F",
                               "\xE2\x80\xA8", "\xEF\xBB\xBF"});
  w.empty = 0.04;
  w.pad_everywhere = true;
  return w;
}

/// Random conversations of the shapes each template expects (seeded: the same every run),
/// their texts made of `words`.
class conversation_maker {
 public:
  conversation_maker(uint32_t seed, conversation_words words)
      : rng_(seed), words_(std::move(words)) {}

  nlohmann::ordered_json make(const std::string& name, const real_template& t) {
    using ojson = nlohmann::ordered_json;
    ojson ctx = ojson::object();
    ojson messages = ojson::array();
    bool qwen = name == "qwen3";
    if (chance(0.5)) messages.push_back(chat_message("system", text(!qwen)));
    int turns = pick(1, 5);
    for (int i = 0; i < turns; ++i) {
      // Llama 2 refuses roles that do not alternate: sometimes break the rule on purpose.
      bool alternate = name != "llama2" || !chance(0.1);
      messages.push_back(chat_message("user", text(!qwen)));
      if (!alternate) messages.push_back(chat_message("user", text(false)));
      if (i + 1 == turns && chance(0.5)) break;
      if (qwen && chance(0.3)) add_tool_round(messages);
      messages.push_back(qwen ? qwen_assistant() : chat_message("assistant", text(true)));
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
  using ojson = nlohmann::ordered_json;

  bool chance(double p) { return std::uniform_real_distribution<double>{0, 1}(rng_) < p; }
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>{lo, hi}(rng_); }
  template <class T>
  const T& one_of(const std::vector<T>& v) {
    return v[static_cast<size_t>(pick(0, static_cast<int>(v.size()) - 1))];
  }

  /// A text of words_; `padded` where the template strips its surrounding whitespace the
  /// same way in both renderers. No draw is made for what words_ rules out, so the
  /// JavaScript oracle's conversations stay those of its fixed seed.
  std::string text(bool padded) {
    if (words_.empty > 0 && chance(words_.empty)) return "";
    std::string s;
    int n = pick(1, 12);
    for (int i = 0; i < n; ++i) s += (i ? one_of(words_.gaps) : "") + one_of(words_.words);
    bool pad = padded || words_.pad_everywhere;
    if (pad && chance(0.3)) s = one_of(words_.pads) + s;
    if (pad && chance(0.3)) s += one_of(words_.pads);
    return s;
  }

  ojson qwen_assistant() {
    if (chance(0.3))
      return chat_message("assistant", "<think>\n" + text(false) + "\n</think>\n\n" + text(false));
    auto m = chat_message("assistant", text(false));
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
    auto call = chat_message("assistant", chance(0.5) ? "" : text(false));
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
    for (int i = 0; i < n; ++i) messages.push_back(chat_message("tool", text(false)));
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
  conversation_words words_;
};

}  // namespace computron::test
