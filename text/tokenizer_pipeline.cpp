#include "text/tokenizer_pipeline.hpp"

#include <algorithm>

#include "common/error.hpp"

namespace computron::text {

using json = nlohmann::json;

namespace tokenizer_json {

caf::error refuse(const std::string& why) {
  return make_error(ec::invalid_configuration, why);
}

caf::error unsupported(const char* what, const json& j) {
  auto t = j.is_object() && j.contains("type") && j["type"].is_string()
               ? j["type"].get<std::string>()
               : j.dump().substr(0, 80);
  return refuse(std::string{what} + " type '" + t + "' is not supported");
}

std::string str_or(const json& j, const char* key, std::string fallback) {
  auto f = j.find(key);
  return f != j.end() && f->is_string() ? f->get<std::string>() : fallback;
}

bool bool_or(const json& j, const char* key, bool fallback) {
  auto f = j.find(key);
  return f != j.end() && f->is_boolean() ? f->get<bool>() : fallback;
}

/// The single code point of `s`, or an error naming `what`.
caf::expected<uint32_t> one_char(const std::string& s, const std::string& what) {
  size_t i = 0;
  if (s.empty()) return refuse(what + " must be one character");
  uint32_t cp = unicode::next_code_point(s, i);
  if (i != s.size()) return refuse(what + " must be one character, not '" + s + "'");
  return cp;
}

caf::expected<text_pattern> pattern_of(const json& j, const std::string& what) {
  auto p = j.find("pattern");
  if (p == j.end() || !p->is_object())
    return refuse(what + " has no pattern {\"String\": ...} or {\"Regex\": ...}");
  text_pattern out;
  std::string why, source;
  if (auto s = p->find("String"); s != p->end() && s->is_string()) {
    out.is_literal = true;
    out.literal = s->get<std::string>();
    source = out.literal;
  } else if (auto r = p->find("Regex"); r != p->end() && r->is_string()) {
    source = r->get<std::string>();
  } else {
    return refuse(what + ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
  out.re = unicode::regex::compile(source, out.is_literal, why);
  if (!out.re) return refuse(what + ": pattern '" + source + "' does not compile: " + why);
  return out;
}

}  // namespace tokenizer_json

using namespace tokenizer_json;

namespace {

struct span {
  size_t a, b;
  bool match;
};

/// The matches of `p` in `s` with the gaps between them, in order, covering `s`, as
/// tokenizers' find_matches gives them (an empty match just after another is skipped).
void find_spans(const text_pattern& p, std::string_view s, std::vector<span>& out) {
  out.clear();
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t prev = 0, pos = 0, a = 0, b = 0;
  bool any = false;
  size_t last_end = 0;
  while (pos <= s.size()) {
    bool found;
    if (p.is_literal && !p.literal.empty()) {
      a = s.find(p.literal, pos);
      found = a != std::string_view::npos;
      b = found ? a + p.literal.size() : 0;
    } else {
      found = p.re->find(s, pos, a, b);
    }
    if (!found) break;
    if (a == b && any && last_end == b) {
      if (pos >= s.size()) break;
      pos += unicode::char_length(s, pos);
      continue;
    }
    if (prev != a) out.push_back({prev, a, false});
    out.push_back({a, b, true});
    prev = b;
    any = true;
    last_end = b;
    pos = a == b ? (b < s.size() ? b + unicode::char_length(s, b) : b + 1) : b;
  }
  if (prev != s.size()) out.push_back({prev, s.size(), false});
}

/// Each character satisfying `is` as a match of its own, with the gaps between.
template <class Pred>
void find_char_spans(std::string_view s, Pred is, std::vector<span>& out) {
  out.clear();
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    uint32_t cp = unicode::next_code_point(s, i);
    if (!is(cp)) continue;
    if (last < at) out.push_back({last, at, false});
    out.push_back({at, i, true});
    last = i;
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

/// tokenizers' SplitDelimiterBehavior applied to `spans` (flags say "is a match").
void apply_behavior(std::vector<span>& spans, pre_tokenizer_chain::behavior how) {
  using b = pre_tokenizer_chain::behavior;
  thread_local std::vector<span> out;
  out.clear();
  bool prev_match = false;
  switch (how) {
    case b::isolated:
      return;
    case b::removed:
      for (auto& s : spans)
        if (!s.match) out.push_back(s);
      break;
    case b::merged_with_previous:
      for (auto& s : spans) {
        if (s.match && !prev_match && !out.empty())
          out.back().b = s.b;
        else
          out.push_back(s);
        prev_match = s.match;
      }
      break;
    case b::merged_with_next:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !out.empty())
          out.back().a = it->a;
        else
          out.push_back(*it);
        prev_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case b::contiguous:
      for (auto& s : spans) {
        if (s.match == prev_match && !out.empty())
          out.back().b = s.b;
        else
          out.push_back(s);
        prev_match = s.match;
      }
      break;
  }
  spans.swap(out);
}

const char* const gpt2_regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const std::shared_ptr<const unicode::regex>& gpt2_pattern() {
  static const std::shared_ptr<const unicode::regex> re = [] {
    std::string why;
    return unicode::regex::compile(gpt2_regex, false, why);
  }();
  return re;
}

/// Scratch strings and spans per pre-tokenizer depth, reused across words and calls.
struct depth_scratch {
  std::string text;
  std::vector<span> spans;
};
depth_scratch& scratch_at(size_t k) {
  thread_local std::vector<std::unique_ptr<depth_scratch>> levels;
  while (levels.size() <= k) levels.push_back(std::make_unique<depth_scratch>());
  return *levels[k];
}

}  // namespace

std::string tokenizer_json::replace_all(const text_pattern& p, std::string_view s,
                                        std::string_view content) {
  thread_local std::vector<span> spans;
  find_spans(p, s, spans);
  std::string out;
  out.reserve(s.size());
  for (auto& sp : spans)
    if (sp.match)
      out.append(content);
    else
      out.append(s.substr(sp.a, sp.b - sp.a));
  return out;
}

caf::expected<std::string> tokenizer_json::metaspace_scheme(const json& j,
                                                            const std::string& what) {
  if (auto s = j.find("prepend_scheme"); s != j.end() && !s->is_null()) {
    auto v = s->is_string() ? s->get<std::string>() : std::string{};
    if (v != "always" && v != "first" && v != "never")
      return refuse(what + ": prepend_scheme must be first, always or never");
    return v;
  }
  return bool_or(j, "add_prefix_space", true) ? std::string{"always"} : std::string{"never"};
}

// ---- normalizers ----------------------------------------------------------------------

caf::error normalizer_chain::add(const json& j, std::vector<step>& out) {
  if (j.is_null()) return {};
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return unsupported("normalizer", j);
  auto type = j["type"].get<std::string>();
  step s{};
  if (type == "Sequence") {
    auto list = j.find("normalizers");
    if (list == j.end() || !list->is_array()) return refuse("normalizer Sequence has no list");
    for (auto& n : *list)
      if (auto err = add(n, out)) return err;
    return {};
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    s.k = kind::unicode;
    s.form = type == "NFC"    ? unicode::unicode_form::nfc
             : type == "NFD"  ? unicode::unicode_form::nfd
             : type == "NFKC" ? unicode::unicode_form::nfkc
                              : unicode::unicode_form::nfkd;
  } else if (type == "Lowercase") {
    s.k = kind::lowercase;
  } else if (type == "Prepend") {
    s.k = kind::prepend;
    s.text = str_or(j, "prepend", "");
  } else if (type == "Replace") {
    s.k = kind::replace;
    auto p = pattern_of(j, "normalizer Replace");
    if (!p) return p.error();
    s.pattern = std::move(*p);
    s.text = str_or(j, "content", "");
  } else if (type == "Strip") {
    s.k = kind::strip;
    s.left = bool_or(j, "strip_left", false);
    s.right = bool_or(j, "strip_right", false);
  } else {
    return unsupported("normalizer", j);
  }
  out.push_back(std::move(s));
  return {};
}

caf::expected<normalizer_chain> normalizer_chain::parse(const json& j) {
  normalizer_chain c;
  if (auto err = add(j, c.steps_)) return err;
  return c;
}

std::string normalizer_chain::apply(std::string_view in) const {
  std::string cur{in}, next;
  for (auto& s : steps_) {
    next.clear();
    switch (s.k) {
      case kind::unicode:
        unicode::normalize(cur, s.form, next);
        break;
      case kind::lowercase:
        unicode::lowercase(cur, next);
        break;
      case kind::prepend:
        if (!cur.empty()) next = s.text + cur;
        break;
      case kind::replace:
        next = replace_all(s.pattern, cur, s.text);
        break;
      case kind::strip: {
        size_t a = 0, b = cur.size();
        while (s.left && a < b) {
          size_t i = a;
          if (!unicode::is_white_space(unicode::next_code_point(cur, i))) break;
          a = i;
        }
        while (s.right && b > a) {
          size_t at = b - 1;
          while (at > a && (static_cast<unsigned char>(cur[at]) & 0xC0) == 0x80) --at;
          size_t i = at;
          uint32_t cp = unicode::next_code_point(cur, i);
          if (i != b || !unicode::is_white_space(cp)) break;
          b = at;
        }
        next = cur.substr(a, b - a);
        break;
      }
    }
    cur.swap(next);
  }
  return cur;
}

// ---- pre-tokenizers -------------------------------------------------------------------

caf::error pre_tokenizer_chain::add(const json& j, std::vector<step>& out) {
  if (j.is_null()) return {};
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return unsupported("pre_tokenizer", j);
  auto type = j["type"].get<std::string>();
  step s{};
  if (type == "Sequence") {
    auto list = j.find("pretokenizers");
    if (list == j.end() || !list->is_array()) return refuse("pre_tokenizer Sequence has no list");
    for (auto& n : *list)
      if (auto err = add(n, out)) return err;
    return {};
  } else if (type == "Split") {
    s.k = kind::split;
    auto p = pattern_of(j, "pre_tokenizer Split");
    if (!p) return p.error();
    s.pattern = std::move(*p);
    auto how = str_or(j, "behavior", "");
    static const std::pair<const char*, behavior> names[] = {
        {"Isolated", behavior::isolated},
        {"Removed", behavior::removed},
        {"MergedWithPrevious", behavior::merged_with_previous},
        {"MergedWithNext", behavior::merged_with_next},
        {"Contiguous", behavior::contiguous}};
    bool known = false;
    for (auto& [name, b] : names)
      if (how == name) {
        s.how = b;
        known = true;
      }
    if (!known) return refuse("pre_tokenizer Split: behavior '" + how + "' is not supported");
    s.invert = bool_or(j, "invert", false);
  } else if (type == "ByteLevel") {
    s.k = kind::byte_level;
    s.add_prefix_space = bool_or(j, "add_prefix_space", true);
    s.use_regex = bool_or(j, "use_regex", true);
  } else if (type == "Metaspace") {
    s.k = kind::metaspace;
    s.replacement = str_or(j, "replacement", "\xE2\x96\x81");
    auto cp = one_char(s.replacement, "pre_tokenizer Metaspace: replacement");
    if (!cp) return cp.error();
    s.replacement_cp = *cp;
    auto scheme = metaspace_scheme(j, "pre_tokenizer Metaspace");
    if (!scheme) return scheme.error();
    s.scheme = *scheme == "always"  ? step::prepend::always
               : *scheme == "first" ? step::prepend::first
                                    : step::prepend::never;
    s.split = bool_or(j, "split", true);
  } else if (type == "Digits") {
    s.k = kind::digits;
    s.individual_digits = bool_or(j, "individual_digits", false);
  } else {
    return unsupported("pre_tokenizer", j);
  }
  out.push_back(std::move(s));
  return {};
}

caf::expected<pre_tokenizer_chain> pre_tokenizer_chain::parse(const json& j) {
  pre_tokenizer_chain c;
  if (auto err = add(j, c.steps_)) return err;
  return c;
}

pre_tokenizer_chain pre_tokenizer_chain::byte_level_gpt2() {
  pre_tokenizer_chain c;
  step s{};
  s.k = kind::byte_level;
  s.add_prefix_space = false;
  s.use_regex = true;
  c.steps_.push_back(s);
  return c;
}

bool pre_tokenizer_chain::byte_level() const {
  for (auto& s : steps_)
    if (s.k == kind::byte_level) return true;
  return false;
}

void pre_tokenizer_chain::apply(std::string_view piece, bool at_start,
                                const std::function<void(std::string_view)>& word) const {
  run(0, piece, at_start, word);
}

void pre_tokenizer_chain::run(size_t k, std::string_view piece, bool at_start,
                              const std::function<void(std::string_view)>& word) const {
  if (piece.empty()) return;
  if (k == steps_.size()) {
    word(piece);
    return;
  }
  auto& s = steps_[k];
  auto& scratch = scratch_at(k);
  auto& spans = scratch.spans;
  switch (s.k) {
    case kind::split: {
      find_spans(s.pattern, piece, spans);
      if (s.invert)
        for (auto& sp : spans) sp.match = !sp.match;
      apply_behavior(spans, s.how);
      for (auto& sp : spans)
        if (sp.b > sp.a) run(k + 1, piece.substr(sp.a, sp.b - sp.a), at_start && sp.a == 0, word);
      return;
    }
    case kind::byte_level: {
      auto& mapped = scratch.text;
      std::string_view src = piece;
      std::string prefixed;
      if (s.add_prefix_space && piece.front() != ' ') {
        prefixed.reserve(piece.size() + 1);
        prefixed += ' ';
        prefixed.append(piece);
        src = prefixed;
      }
      auto& alphabet = byte_alphabet();
      auto map = [&](std::string_view part) {
        mapped.clear();
        for (unsigned char c : part) mapped += alphabet[c];
        run(k + 1, mapped, at_start && part.data() == src.data(), word);
      };
      if (!s.use_regex) {
        map(src);
        return;
      }
      static const text_pattern gpt2{gpt2_pattern(), {}, false};
      find_spans(gpt2, src, spans);
      // Deeper steps use their own scratch, so this depth's spans and text stay put.
      for (auto& sp : spans)
        if (sp.b > sp.a) map(src.substr(sp.a, sp.b - sp.a));
      return;
    }
    case kind::metaspace: {
      auto& t = scratch.text;
      t.clear();
      for (char c : piece) {
        if (c == ' ')
          t += s.replacement;
        else
          t += c;
      }
      bool starts = t.compare(0, s.replacement.size(), s.replacement) == 0;
      if (!starts &&
          (s.scheme == step::prepend::always || (s.scheme == step::prepend::first && at_start)))
        t.insert(0, s.replacement);
      if (!s.split) {
        run(k + 1, t, at_start, word);
        return;
      }
      auto cp = s.replacement_cp;
      find_char_spans(
          t, [cp](uint32_t c) { return c == cp; }, spans);
      apply_behavior(spans, behavior::merged_with_next);
      for (auto& sp : spans)
        if (sp.b > sp.a)
          run(k + 1, std::string_view{t}.substr(sp.a, sp.b - sp.a), at_start && sp.a == 0, word);
      return;
    }
    case kind::digits: {
      find_char_spans(piece, unicode::is_numeric, spans);
      apply_behavior(spans, s.individual_digits ? behavior::isolated : behavior::contiguous);
      for (auto& sp : spans)
        if (sp.b > sp.a) run(k + 1, piece.substr(sp.a, sp.b - sp.a), at_start && sp.a == 0, word);
      return;
    }
  }
}

const std::array<std::string, 256>& byte_alphabet() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      unicode::append_utf8(t[b], printable ? b : next++);
    }
    return t;
  }();
  return table;
}

int byte_of_alphabet(uint32_t cp) {
  static const std::array<int16_t, 324> back = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[printable ? b : next++] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return cp < back.size() ? back[cp] : -1;
}

}  // namespace computron::text
