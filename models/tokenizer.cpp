#include "models/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cwctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <locale.h>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "models/json_file.hpp"

namespace computron::models {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

const std::string replacement = "\xEF\xBF\xBD";

/// Moves the valid UTF-8 at the front of `pending` into `out`; an invalid byte becomes
/// U+FFFD. An incomplete character at the end stays in `pending` unless `final`. The
/// same bytes give the same text however they were split across calls.
void drain_utf8(std::string& pending, bool final, std::string& out) {
  size_t i = 0;
  const size_t n = pending.size();
  auto byte = [&](size_t k) { return static_cast<unsigned char>(pending[k]); };
  while (i < n) {
    unsigned char c = byte(i);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    if (len == 0 || (len == 2 && c < 0xC2) || (len == 4 && c > 0xF4)) {
      out += replacement;
      ++i;
      continue;
    }
    if (len == 1) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // The second byte's range rules out overlong forms, surrogates and > U+10FFFF.
    auto second_ok = [&](unsigned char b) {
      if ((b & 0xC0) != 0x80) return false;
      if (c == 0xE0) return b >= 0xA0;
      if (c == 0xED) return b < 0xA0;
      if (c == 0xF0) return b >= 0x90;
      if (c == 0xF4) return b < 0x90;
      return true;
    };
    size_t have = std::min(len, n - i);
    bool ok = true;
    for (size_t k = 1; k < have && ok; ++k)
      ok = k == 1 ? second_ok(byte(i + 1)) : (byte(i + k) & 0xC0) == 0x80;
    if (!ok) {
      out += replacement;
      ++i;
      continue;
    }
    if (have < len) {
      if (!final) break;  // may complete with the next token
      out += replacement;
      ++i;
      continue;
    }
    out.append(pending, i, len);
    i += len;
  }
  pending.erase(0, i);
}

/// GPT-2's reversible map of bytes to printable code points (the vocabulary's alphabet).
const std::array<uint32_t, 256>& byte_to_unicode() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

const std::unordered_map<uint32_t, unsigned char>& unicode_to_byte() {
  static const std::unordered_map<uint32_t, unsigned char> table = [] {
    std::unordered_map<uint32_t, unsigned char> t;
    for (uint32_t b = 0; b < 256; ++b) t[byte_to_unicode()[b]] = static_cast<unsigned char>(b);
    return t;
  }();
  return table;
}

/// Decodes one code point at `i` (advancing it); invalid bytes read as themselves.
uint32_t next_code_point(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + len > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

// The classes of GPT-2's pre-tokenizer regex ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+) without a regex engine: JavaScript's \s, \p{N} from a
// table of the number ranges in use, \p{L} from the C.UTF-8 locale's alphabetic class
// (which also counts other scripts' digits, so numbers are tested first).
bool is_space(uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000 || c == 0xFEFF;
}

bool is_number(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  static constexpr std::pair<uint32_t, uint32_t> ranges[] = {
      {0xB2, 0xB3},     {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},    {0x6F0, 0x6F9},
      {0x7C0, 0x7C9},   {0x966, 0x96F},   {0x9E6, 0x9EF},   {0xA66, 0xA6F},    {0xAE6, 0xAEF},
      {0xB66, 0xB6F},   {0xBE6, 0xBF2},   {0xC66, 0xC6F},   {0xCE6, 0xCEF},    {0xD66, 0xD78},
      {0xDE6, 0xDEF},   {0xE50, 0xE59},   {0xED0, 0xED9},   {0xF20, 0xF33},    {0x1040, 0x1049},
      {0x1369, 0x137C}, {0x16EE, 0x16F0}, {0x17E0, 0x17E9}, {0x1810, 0x1819},  {0x2070, 0x2070},
      {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189},  {0x2460, 0x249B},
      {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x3007, 0x3007}, {0x3021, 0x3029},  {0x3038, 0x303A},
      {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F},  {0x3280, 0x3289},
      {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xFF10, 0xFF19}, {0x1D7CE, 0x1D7FF}};
  for (auto& [lo, hi] : ranges)
    if (c >= lo && c <= hi) return true;
  return false;
}

bool is_letter(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (is_number(c) || is_space(c)) return false;
  static locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  if (!utf8) return true;  // no locale data: other scripts count as letters
  return iswalpha_l(static_cast<wint_t>(c), utf8) != 0;
}

enum class cls { letter, number, space, other };

cls class_of(uint32_t c) {
  if (is_space(c)) return cls::space;
  if (is_number(c)) return cls::number;
  if (is_letter(c)) return cls::letter;
  return cls::other;
}

/// Splits text into the pieces GPT-2's regex finds (byte offsets).
std::vector<std::string_view> pre_tokenize(std::string_view text) {
  std::vector<uint32_t> cps;
  std::vector<size_t> at;
  for (size_t i = 0; i < text.size();) {
    at.push_back(i);
    cps.push_back(next_code_point(text, i));
  }
  at.push_back(text.size());
  const size_t n = cps.size();
  std::vector<std::string_view> out;
  auto emit = [&](size_t from, size_t to) {
    out.push_back(text.substr(at[from], at[to] - at[from]));
  };
  auto run_of = [&](size_t j, cls c) {
    while (j < n && class_of(cps[j]) == c) ++j;
    return j;
  };
  size_t i = 0;
  while (i < n) {
    if (cps[i] == '\'' && i + 1 < n) {
      auto c1 = cps[i + 1];
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < n && ((c1 == 'r' && cps[i + 2] == 'e') || (c1 == 'v' && cps[i + 2] == 'e') ||
                        (c1 == 'l' && cps[i + 2] == 'l'))) {
        emit(i, i + 3);
        i += 3;
        continue;
      }
    }
    size_t start = i;
    size_t j = i;
    if (cps[j] == ' ' && j + 1 < n && class_of(cps[j + 1]) != cls::space) ++j;
    auto c = class_of(cps[j]);
    if (c != cls::space) {
      size_t end = run_of(j, c);
      emit(start, end);
      i = end;
      continue;
    }
    // Whitespace: a run followed by a non-space leaves its last character to the next
    // piece (\s+(?!\S)), unless the run is that one character (\s+).
    size_t end = run_of(i, cls::space);
    if (end < n && end - i >= 2) --end;
    emit(i, end);
    i = end;
  }
  return out;
}

std::string to_alphabet(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) append_utf8(s, byte_to_unicode()[b]);
  return s;
}

caf::error bad_file(const fs::path& p, const std::string& why) {
  return make_error(ec::invalid_configuration, "tokenizer " + p.string() + ": " + why);
}

caf::expected<std::unordered_map<std::string, int64_t>> vocab_of(const json& j,
                                                                 const fs::path& where) {
  if (!j.is_object()) return bad_file(where, "the vocabulary must be an object of ids");
  std::unordered_map<std::string, int64_t> v;
  for (auto& [k, id] : j.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24))
      return bad_file(where, "token '" + k + "' has no valid id");
    v.emplace(k, id.get<int64_t>());
  }
  return v;
}

}  // namespace

caf::expected<std::shared_ptr<const tokenizer>> tokenizer::make(
    std::unordered_map<std::string, int64_t> vocab, const std::vector<std::string>& merges,
    std::set<std::string> specials) {
  for (auto* name : {"<s>", "</s>", "<pad>", "<unk>", "<mask>", "<|endoftext|>"})
    specials.insert(name);
  if (vocab.empty()) return make_error(ec::invalid_configuration, "tokenizer: empty vocabulary");
  std::shared_ptr<tokenizer> t{new tokenizer()};
  int64_t top = 0;
  for (auto& [_, id] : vocab) top = std::max(top, id);
  t->bytes_of_.assign(static_cast<size_t>(top + 1), {});
  t->special_.assign(static_cast<size_t>(top + 1), false);
  auto& back = unicode_to_byte();
  for (auto& [tok, id] : vocab) {
    // Special tokens (<s>, <pad> ...), and any outside the byte alphabet, never come out
    // of BPE and decode to nothing.
    std::string raw;
    bool in_alphabet = true;
    for (size_t i = 0; i < tok.size() && in_alphabet;) {
      auto cp = next_code_point(tok, i);
      auto b = back.find(cp);
      if (b == back.end())
        in_alphabet = false;
      else
        raw += static_cast<char>(b->second);
    }
    auto& slot = t->bytes_of_[static_cast<size_t>(id)];
    if (in_alphabet && specials.count(tok) == 0)
      slot = std::move(raw);
    else
      t->special_[static_cast<size_t>(id)] = true;
  }
  int32_t rank = 0;
  for (auto& m : merges) {
    auto sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() ||
        m.find(' ', sp + 1) != std::string::npos)
      return make_error(ec::invalid_configuration,
                        "tokenizer: merge " + std::to_string(rank + 1) + " ('" + m +
                            "') is not two symbols separated by one space");
    t->ranks_.emplace(m, rank++);
  }
  auto find = [&](const char* name) -> std::optional<int64_t> {
    auto i = vocab.find(name);
    if (i == vocab.end()) return std::nullopt;
    return i->second;
  };
  if (auto s = find("</s>")) {
    // OPT: `</s>` is both BOS and EOS, and every prompt starts with it.
    t->bos_ = t->eos_ = s;
    t->add_bos_ = true;
  } else if (auto e = find("<|endoftext|>")) {
    t->bos_ = t->eos_ = e;
  }
  t->pad_ = find("<pad>");
  t->vocab_ = std::move(vocab);
  return std::shared_ptr<const tokenizer>{std::move(t)};
}

std::shared_ptr<const tokenizer> tokenizer::bytes() {
  static const std::shared_ptr<const tokenizer> t = [] {
    std::unordered_map<std::string, int64_t> v{{"<s>", 0}, {"<pad>", 1}, {"</s>", 2}, {"<unk>", 3}};
    for (int b = 0; b < 256; ++b)
      v.emplace(to_alphabet(std::string(1, static_cast<char>(b))), 4 + b);
    return *make(std::move(v), {});
  }();
  return t;
}

caf::expected<std::shared_ptr<const tokenizer>> tokenizer::open(const std::string& path) {
  fs::path p{path};
  std::error_code err;
  fs::path tj = fs::is_directory(p, err) ? p / "tokenizer.json" : p;
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> merges;
  std::set<std::string> specials;
  if (fs::is_regular_file(tj, err)) {
    auto j = read_json_file(tj);
    if (!j) return j.error();
    auto model = j->find("model");
    if (model == j->end() || !model->is_object()) return bad_file(tj, "no 'model' object");
    if (model->value("type", std::string{"BPE"}) != "BPE")
      return bad_file(tj, "model type '" + model->value("type", std::string{}) +
                              "' is not supported (only byte-level BPE)");
    auto v = model->find("vocab");
    if (v == model->end()) return bad_file(tj, "no model.vocab");
    auto got = vocab_of(*v, tj);
    if (!got) return got.error();
    vocab = std::move(*got);
    if (auto m = model->find("merges"); m != model->end() && m->is_array()) {
      for (auto& e : *m) {
        if (e.is_string())
          merges.push_back(e.get<std::string>());
        else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string())
          merges.push_back(e[0].get<std::string>() + " " + e[1].get<std::string>());
        else
          return bad_file(tj, "model.merges holds something that is not a pair");
      }
    }
    if (auto added = j->find("added_tokens"); added != j->end() && added->is_array())
      for (auto& a : *added)
        if (a.is_object() && a.contains("content") && a["content"].is_string() &&
            a.contains("id") && a["id"].is_number_integer()) {
          auto content = a["content"].get<std::string>();
          vocab.emplace(content, a["id"].get<int64_t>());
          auto special = a.find("special");
          if (special != a.end() && !special->is_boolean())
            return bad_file(tj, "added_tokens: special must be true or false");
          if (special == a.end() || special->get<bool>()) specials.insert(content);
        }
  } else {
    if (!fs::is_directory(p, err))
      return make_error(ec::io_error, "tokenizer: " + path + " is neither a folder nor a file");
    fs::path vj = p / "vocab.json", mt = p / "merges.txt";
    if (!fs::exists(vj) && fs::exists(p / "encoder.json")) {
      vj = p / "encoder.json";
      mt = p / "vocab.bpe";
    }
    if (!fs::exists(vj))
      return make_error(ec::io_error, "tokenizer: " + path +
                                          " has no tokenizer.json, vocab.json or encoder.json");
    auto j = read_json_file(vj);
    if (!j) return j.error();
    auto got = vocab_of(*j, vj);
    if (!got) return got.error();
    vocab = std::move(*got);
    std::ifstream in{mt};
    if (!in) return make_error(ec::io_error, "tokenizer: cannot read " + mt.string());
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line.rfind("#version", 0) == 0) continue;
      merges.push_back(line);
    }
  }
  auto t = make(std::move(vocab), merges, std::move(specials));
  if (!t) return with_context(t.error(), path);
  // tokenizer_config.json may say whether prompts start with BOS.
  auto tc = (fs::is_directory(p, err) ? p : p.parent_path()) / "tokenizer_config.json";
  if (fs::exists(tc)) {
    auto j = read_json_file(tc);
    if (j && j->is_object())
      if (auto a = j->find("add_bos_token"); a != j->end() && a->is_boolean()) {
        auto copy = std::shared_ptr<tokenizer>{new tokenizer(**t)};
        copy->add_bos_ = a->get<bool>() && copy->bos_.has_value();
        return std::shared_ptr<const tokenizer>{std::move(copy)};
      }
  }
  return t;
}

void tokenizer::bpe(const std::string& word, std::vector<int64_t>& out) const {
  std::vector<std::string> syms;
  for (size_t i = 0; i < word.size();) {
    size_t from = i;
    next_code_point(word, i);
    syms.push_back(word.substr(from, i - from));
  }
  while (syms.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t k = 0; k + 1 < syms.size(); ++k) {
      auto r = ranks_.find(syms[k] + " " + syms[k + 1]);
      if (r != ranks_.end() && r->second < best) {
        best = r->second;
        at = k;
      }
    }
    if (best == INT32_MAX) break;
    auto a = syms[at], b = syms[at + 1];
    std::vector<std::string> merged;
    for (size_t k = 0; k < syms.size(); ++k) {
      if (k + 1 < syms.size() && syms[k] == a && syms[k + 1] == b) {
        merged.push_back(a + b);
        ++k;
      } else {
        merged.push_back(std::move(syms[k]));
      }
    }
    syms = std::move(merged);
  }
  for (auto& s : syms) {
    if (auto v = vocab_.find(s); v != vocab_.end()) {
      out.push_back(v->second);
      continue;
    }
    // A vocabulary missing a merge result or a byte: fall back to single characters,
    // then to <unk>.
    for (size_t i = 0; i < s.size();) {
      size_t from = i;
      next_code_point(s, i);
      if (auto v = vocab_.find(s.substr(from, i - from)); v != vocab_.end())
        out.push_back(v->second);
      else if (auto u = vocab_.find("<unk>"); u != vocab_.end())
        out.push_back(u->second);
    }
  }
}

std::vector<int64_t> tokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out;
  if (add_bos_ && bos_) out.push_back(*bos_);
  for (auto piece : pre_tokenize(text)) bpe(to_alphabet(piece), out);
  return out;
}

std::string_view tokenizer::token_bytes(int64_t id) const {
  if (id < 0 || id >= size()) return {};
  return bytes_of_[static_cast<size_t>(id)];
}

bool tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < size() && special_[static_cast<size_t>(id)];
}

std::string tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string pending, out;
  for (auto id : ids) {
    pending += token_bytes(id);
    drain_utf8(pending, false, out);
  }
  drain_utf8(pending, true, out);
  return out;
}

std::string stream_decoder::push(int64_t id) {
  std::string out;
  pending_ += tok_->token_bytes(id);
  drain_utf8(pending_, false, out);
  return out;
}

std::string stream_decoder::finish() {
  std::string out;
  drain_utf8(pending_, true, out);
  return out;
}

std::optional<size_t> stop_matcher::find(std::string_view text, size_t grown_from) const {
  std::optional<size_t> best;
  for (auto& s : stops) {
    if (s.empty()) continue;
    // A match new since `grown_from` ends past it, so it starts at most s.size() - 1
    // bytes before it.
    auto from = grown_from >= s.size() ? grown_from - (s.size() - 1) : 0;
    auto at = text.find(s, std::min(from, text.size()));
    if (at != std::string_view::npos && (!best || at < *best)) best = at;
  }
  return best;
}

size_t stop_matcher::safe_prefix(std::string_view text) const {
  size_t hold = 0;
  for (auto& s : stops)
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), text.size()); k > hold; --k)
      if (text.substr(text.size() - k) == std::string_view{s}.substr(0, k)) {
        hold = k;
        break;
      }
  size_t cut = text.size() - hold;
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  return cut;
}

}  // namespace computron::models
