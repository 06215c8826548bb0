#pragma once

// Reading the text APIs' request bodies (internal to net/, shared by llm_api.cpp and
// chat_api.cpp): a strict reader of one JSON object's typed fields, and the settings every
// text API or both OpenAI routes share.
#include <cmath>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "net/http/llm_api.hpp"

namespace computron::net::detail {

using json = nlohmann::json;

/// Reads typed fields of one JSON object; the first problem wins and names its field.
class reader {
 public:
  explicit reader(const json& obj, std::string prefix = {})
      : obj_(obj), prefix_(std::move(prefix)) {}

  std::optional<request_error> error;

  /// Every key must be one of `allowed`.
  void only(const std::set<std::string>& allowed) {
    for (auto& [k, _] : obj_.items())
      if (allowed.count(k) == 0) return fail(k, "unknown parameter '" + prefix_ + k + "'");
  }

  const json* find(const char* key) const {
    auto i = obj_.find(key);
    return i == obj_.end() || i->is_null() ? nullptr : &*i;
  }

  void integer(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    auto v = find(key);
    if (!v || error) return;
    if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi)
      return fail(key, name(key) + " must be an integer in " + std::to_string(lo) + ".." +
                           std::to_string(hi));
    out = v->get<int64_t>();
  }

  void number(const char* key, double& out, double lo, double hi) {
    auto v = find(key);
    if (!v || error) return;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo ||
        v->get<double>() > hi)
      return fail(key, name(key) + " must be a number in " + fmt(lo) + ".." + fmt(hi));
    out = v->get<double>();
  }

  void boolean(const char* key, bool& out) {
    auto v = find(key);
    if (!v || error) return;
    if (!v->is_boolean()) return fail(key, name(key) + " must be true or false");
    out = v->get<bool>();
  }

  /// A string or a list of at most 4 non-empty strings.
  void stops(const char* key, std::vector<std::string>& out) {
    auto v = find(key);
    if (!v || error) return;
    if (v->is_string()) {
      if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
      return;
    }
    if (!v->is_array() || v->size() > 4)
      return fail(key, name(key) + " must be a string or a list of at most 4 strings");
    for (auto& s : *v) {
      if (!s.is_string()) return fail(key, name(key) + " must hold strings");
      if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
    }
  }

  /// The field must be absent, null or `allowed`; anything else is refused as unsupported.
  void only_value(const char* key, const json& allowed, const std::string& why) {
    auto v = find(key);
    if (!v || error || *v == allowed) return;
    fail(key, name(key) + " " + why);
  }

  void fail(const std::string& key, std::string message) {
    if (!error) error = request_error{std::move(message), prefix_ + key};
  }

 private:
  std::string name(const char* key) const { return "'" + prefix_ + key + "'"; }
  static std::string fmt(double x) {
    auto s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const json& obj_;
  std::string prefix_;
};

inline bool int_list(const json& j) {
  if (!j.is_array() || j.empty()) return false;
  for (auto& x : j)
    if (!x.is_number_integer()) return false;
  return true;
}

/// Sampling and length settings shared by the text APIs.
void read_generation(reader& r, generation_request& g, int64_t max_tokens);

/// The settings OpenAI's and vLLM's clients send to both /v1 routes.
extern const std::set<std::string> openai_shared;

/// Reads what both /v1 routes share (the model, sampling, stopping, n, stream options);
/// the route reads its own.
void read_openai(reader& r, generation_request& g, int64_t max_tokens);

}  // namespace computron::net::detail
