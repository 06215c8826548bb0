#include "net/client/llm_dataset.hpp"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/numbered_lines.hpp"

namespace computron::net {

namespace {

using json = nlohmann::json;

caf::error bad(std::string why) {
  return make_error(ec::invalid_request, std::move(why));
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// A JSON type's name as a user reads it, for "is a number, not a string".
std::string type_of(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  return std::string{v.is_object() || v.is_array() ? "an " : "a "} + v.type_name();
}

}  // namespace

std::string to_string(dataset_kind k) {
  switch (k) {
    case dataset_kind::random:
      return "random";
    case dataset_kind::custom:
      return "custom";
    case dataset_kind::sharegpt:
      return "sharegpt";
  }
  return "?";
}

caf::expected<dataset_kind> dataset_kind_of(const std::string& name, const std::string& path) {
  if (name.empty() && path.empty()) return dataset_kind::random;
  dataset_kind k;
  if (name.empty()) {
    // vLLM asks for the name; the extension says it as plainly.
    if (ends_with(path, ".jsonl"))
      k = dataset_kind::custom;
    else if (ends_with(path, ".json"))
      k = dataset_kind::sharegpt;
    else
      return bad("--dataset-path " + path +
                 ": name its shape with --dataset-name custom (JSONL) or sharegpt (JSON)");
  } else if (name == "random") {
    k = dataset_kind::random;
  } else if (name == "custom") {
    k = dataset_kind::custom;
  } else if (name == "sharegpt") {
    k = dataset_kind::sharegpt;
  } else {
    return bad("--dataset-name takes random, custom or sharegpt, not '" + name + "'");
  }
  if (k == dataset_kind::random && !path.empty())
    return bad("--dataset-name random draws token ids: it reads no --dataset-path");
  if (k != dataset_kind::random && path.empty())
    return bad("--dataset-name " + name + " needs --dataset-path FILE");
  return k;
}

caf::expected<std::vector<dataset_prompt>> parse_custom_dataset(std::istream& in,
                                                                const std::string& source) {
  std::vector<dataset_prompt> out;
  numbered_lines lines{in, source};
  auto fail = [&](const std::string& why) { return lines.fail(why); };
  while (lines.next()) {
    auto& line = lines.line();
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = json::parse(line, nullptr, false);
    if (j.is_discarded()) return fail("not JSON");
    if (!j.is_object()) return fail("not a JSON object; each line is {\"prompt\": \"...\"}");
    auto p = j.find("prompt");
    if (p == j.end()) return fail("no \"prompt\"");
    if (!p->is_string()) return fail("\"prompt\" is " + type_of(*p) + ", not a string");
    dataset_prompt d;
    d.text = p->get<std::string>();
    if (d.text.empty()) return fail("the prompt is empty");
    if (auto o = j.find("output_tokens"); o != j.end() && !o->is_null()) {
      if (!o->is_number_integer() || o->get<int64_t>() < 1)
        return fail("\"output_tokens\" must be a whole number of at least 1");
      d.output_tokens = o->get<int64_t>();
    }
    d.source = lines.where();
    out.push_back(std::move(d));
  }
  if (auto err = lines.read_error()) return err;
  if (out.empty()) return bad(source + " holds no prompts");
  return out;
}

caf::expected<std::vector<dataset_prompt>> parse_sharegpt_dataset(std::istream& in,
                                                                  const std::string& source) {
  auto j = json::parse(in, nullptr, false);
  if (in.bad()) return make_error(ec::io_error, "cannot read " + source);
  if (j.is_discarded()) return bad(source + " is not JSON (ShareGPT's shape is one JSON array)");
  if (!j.is_array())
    return bad(source + " is " + type_of(j) +
               "; ShareGPT's shape is an array of {\"conversations\": [...]}");
  std::vector<dataset_prompt> out;
  for (size_t i = 0; i < j.size(); ++i) {
    auto fail = [&](const std::string& why) {
      return bad(fmt::format("{} entry {}: {}", source, i + 1, why));
    };
    auto& e = j[i];
    if (!e.is_object()) return fail("not an object");
    auto c = e.find("conversations");
    if (c == e.end()) return fail("no \"conversations\"");
    if (!c->is_array()) return fail("\"conversations\" is " + type_of(*c) + ", not a list");
    for (size_t t = 0; t < c->size(); ++t) {
      auto& turn = (*c)[t];
      auto v = turn.is_object() ? turn.find("value") : turn.end();
      if (!turn.is_object() || v == turn.end() || !v->is_string())
        return fail(fmt::format("turn {} is not {{\"from\": ..., \"value\": \"...\"}}", t + 1));
    }
    if (c->empty()) continue;  // ShareGPT's dumps hold empty conversations: nothing to ask
    dataset_prompt d;
    d.text = (*c)[0]["value"].get<std::string>();
    if (d.text.empty()) return fail("the first turn (the prompt) is empty");
    if (c->size() > 1) d.reply = (*c)[1]["value"].get<std::string>();
    d.source = fmt::format("{} entry {}", source, i + 1);
    out.push_back(std::move(d));
  }
  if (out.empty()) return bad(source + " holds no conversations");
  return out;
}

caf::expected<std::vector<dataset_prompt>> read_dataset(dataset_kind kind,
                                                        const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  if (!in) return bad("cannot open dataset file " + path);
  switch (kind) {
    case dataset_kind::custom:
      return parse_custom_dataset(in, path);
    case dataset_kind::sharegpt:
      return parse_sharegpt_dataset(in, path);
    case dataset_kind::random:
      break;
  }
  return bad("--dataset-name random reads no file");
}

std::vector<size_t> dataset_order(size_t n, uint64_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  // Its own stream, so that the arrivals and lengths of a seed stay as they were.
  std::mt19937_64 rng{seed ^ 0x64617461736574ULL};
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

}  // namespace computron::net
