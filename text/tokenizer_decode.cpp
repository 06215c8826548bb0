// Decoding: the decoder chain tokenizer.json names, and ids through it a token at a time, so
// that a stream and a whole sequence give the same text by construction.
#include <algorithm>
#include <functional>

#include "text/tokenizer.hpp"
#include "text/tokenizer_internal.hpp"

namespace computron::text {

namespace {

using detail::decode_state;
using detail::tokenizer_data;

const char replacement_char[] = "\xEF\xBF\xBD";

bool has_metaspace(const std::vector<decode_rewrite>& steps) {
  return std::any_of(steps.begin(), steps.end(),
                     [](auto& r) { return r.k == decode_rewrite::kind::metaspace; });
}

/// Runs the rewrites that act on the joined text (from step `k` on) over the next stretch
/// of it. Each holds back what a later stretch may still change: a tail that may begin a
/// replaced string, trailing characters Strip may remove. `final` releases or drops them.
void on_text(const tokenizer_data& d, decode_state& st, size_t k, std::string_view in, bool final,
             std::string& out) {
  auto& steps = d.decoder.on_text;
  if (k == steps.size()) {
    out.append(in);
    return;
  }
  if (st.held.size() < steps.size()) {
    st.held.resize(steps.size());
    st.counted.resize(steps.size(), 0);
  }
  auto& r = steps[k];
  auto& held = st.held[k];
  std::string next;
  switch (r.k) {
    case decode_rewrite::kind::metaspace:
      // The joined text is the sequence's only token: all its markers are "first".
      next = r.apply(in, true);
      break;
    case decode_rewrite::kind::replace: {
      held.append(in);
      const auto& lit = r.pattern.literal;
      size_t pos = 0;
      for (size_t m; (m = held.find(lit, pos)) != std::string::npos; pos = m + lit.size()) {
        next.append(held, pos, m - pos);
        next += r.content;
      }
      size_t keep = 0;
      if (!final)
        for (size_t len = std::min(lit.size() - 1, held.size() - pos); len > 0; --len)
          if (held.compare(held.size() - len, len, lit, 0, len) == 0) {
            keep = len;
            break;
          }
      next.append(held, pos, held.size() - keep - pos);
      held.erase(0, held.size() - keep);
      break;
    }
    case decode_rewrite::kind::strip: {
      constexpr size_t done = static_cast<size_t>(-1);
      auto& count = st.counted[k];         // leading characters removed; `done` once past them
      if (count == done && r.stop == 0) {  // past the start, nothing to hold: pass through
        on_text(d, st, k + 1, in, final, out);
        return;
      }
      std::string marker;
      if (r.stop > 0) unicode::append_utf8(marker, r.strip_cp);
      for (size_t i = 0; i < in.size();) {
        size_t at = i;
        uint32_t cp = unicode::next_code_point(in, i);
        auto ch = in.substr(at, i - at);
        if (count != done) {
          if (cp == r.strip_cp && count < r.start) {
            ++count;
            continue;
          }
          count = done;
        }
        if (r.stop > 0 && cp == r.strip_cp) {
          held.append(ch);
          if (held.size() / marker.size() > r.stop) {
            next += marker;
            held.erase(0, marker.size());
          }
        } else {
          next += held;
          held.clear();
          next.append(ch);
        }
      }
      if (final) held.clear();  // the trailing ones Strip removes
      break;
    }
  }
  on_text(d, st, k + 1, next, final, out);
}

/// The token text `s` (already in bytes when `as_bytes`) joined to what came before.
void join(const tokenizer_data& d, decode_state& st, std::string_view s, bool as_bytes,
          std::string& out) {
  auto emit = [&](std::string_view t) {
    if (d.decoder.on_text.empty())
      out.append(t);
    else
      on_text(d, st, 0, t, false, out);
  };
  switch (d.decoder.join) {
    case decoder_chain::join_kind::concat:
      emit(s);
      return;
    case decoder_chain::join_kind::spaces:
      if (st.seen_text) emit(" ");
      st.seen_text = true;
      emit(s);
      return;
    case decoder_chain::join_kind::byte_level:
      break;
  }
  std::string converted;
  if (!as_bytes) {
    bool all = true;
    for (size_t i = 0; i < s.size() && all;) {
      int b = byte_of_alphabet(unicode::next_code_point(s, i));
      all = b >= 0;
      converted += static_cast<char>(b);
    }
    if (!all) converted.assign(s);
    s = converted;
  }
  if (st.pending.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x80;
      })) {
    emit(s);
    return;
  }
  st.pending.append(s);
  std::string t;
  unicode::drain_utf8(st.pending, false, t, d.repair);
  emit(t);
}

/// A token (or a ByteFallback run's text) that has left ByteFallback.
void after_fallback(const tokenizer_data& d, decode_state& st, std::string s, std::string& out) {
  for (auto& r : d.decoder.after_bytes) s = r.apply(s, !st.seen_piece);
  st.seen_piece = true;
  join(d, st, s, false, out);
}

/// Ends a ByteFallback run: its bytes as text if they are valid UTF-8, else one U+FFFD per
/// byte (tokenizers' ByteFallback; not one per invalid stretch).
void flush_run(const tokenizer_data& d, decode_state& st, std::string& out) {
  if (unicode::is_valid_utf8(st.run)) {
    after_fallback(d, st, std::move(st.run), out);
  } else {
    for (size_t k = 0; k < st.run.size(); ++k) after_fallback(d, st, replacement_char, out);
  }
  st.run.clear();
}

}  // namespace

using namespace tokenizer_json;
using json = nlohmann::json;

// ---- the decoder chain, as tokenizer.json gives it -------------------------------------

std::string decode_rewrite::apply(std::string_view s, bool first) const {
  switch (k) {
    case kind::replace:
      return replace_all(pattern, s, content);
    case kind::strip: {
      std::vector<std::pair<size_t, uint32_t>> chars;  // offset, code point
      for (size_t i = 0; i < s.size();) {
        size_t at = i;
        chars.emplace_back(at, unicode::next_code_point(s, i));
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start, chars.size()); ++i) {
        if (chars[i].second != strip_cp) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < std::min(stop, chars.size() - start_cut); ++i) {
        size_t index = chars.size() - i - 1;
        if (chars[index].second != strip_cp) break;
        stop_cut = index;
      }
      size_t a = start_cut < chars.size() ? chars[start_cut].first : s.size();
      size_t b = stop_cut < chars.size() ? chars[stop_cut].first : s.size();
      return std::string{s.substr(a, b - a)};
    }
    case kind::metaspace: {
      std::string out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        size_t at = i;
        uint32_t cp = unicode::next_code_point(s, i);
        if (cp != replacement_cp)
          out.append(s.substr(at, i - at));
        else if (!(first && drop_first))
          out += ' ';
      }
      return out;
    }
  }
  return std::string{s};
}

caf::expected<decoder_chain> decoder_chain::parse(const json& j) {
  decoder_chain c;
  if (j.is_null()) {
    c.join = join_kind::spaces;
    return c;
  }
  bool joined = false;
  std::vector<const json*> flat;
  std::function<caf::error(const json&)> flatten = [&](const json& d) -> caf::error {
    if (d.is_object() && d.value("type", std::string{}) == "Sequence") {
      auto list = d.find("decoders");
      if (list == d.end() || !list->is_array()) return refuse("decoder Sequence has no list");
      for (auto& e : *list)
        if (auto err = flatten(e)) return err;
      return {};
    }
    flat.push_back(&d);
    return {};
  };
  if (auto err = flatten(j)) return err;
  for (auto* dp : flat) {
    auto& d = *dp;
    if (!d.is_object() || !d.contains("type") || !d["type"].is_string())
      return unsupported("decoder", d);
    auto type = d["type"].get<std::string>();
    decode_rewrite r{};
    if (type == "ByteLevel" || type == "Fuse") {
      if (joined && type == "ByteLevel")
        return refuse("decoder ByteLevel after the tokens were joined is not supported");
      if (!joined) c.join = type == "Fuse" ? join_kind::concat : join_kind::byte_level;
      joined = true;
      continue;
    }
    if (type == "ByteFallback") {
      if (joined || c.byte_fallback)
        return refuse("decoder ByteFallback is supported once, before the tokens are joined");
      c.byte_fallback = true;
      continue;
    }
    if (type == "Replace") {
      r.k = decode_rewrite::kind::replace;
      auto p = pattern_of(d, "decoder Replace");
      if (!p) return p.error();
      r.pattern = std::move(*p);
      r.content = str_or(d, "content", "");
      if (joined && !r.pattern.is_literal)
        return refuse("decoder Replace with a regex after the tokens were joined is not supported");
      if (joined && r.pattern.literal.empty())
        return refuse("decoder Replace of an empty string after the join is not supported");
    } else if (type == "Strip") {
      r.k = decode_rewrite::kind::strip;
      auto cp = one_char(str_or(d, "content", " "), "decoder Strip: content");
      if (!cp) return cp.error();
      r.strip_cp = *cp;
      // Any non-negative integer: a parsed file holds unsigned ones, but the pipelines
      // built in code (a GGUF file's, tokenizer_vocabulary.cpp) hold signed ones, and a
      // Strip that read those as 0 kept SentencePiece's leading space when decoding.
      auto num = [&](const char* key) -> int64_t {
        auto f = d.find(key);
        return f != d.end() && f->is_number_integer() ? std::max<int64_t>(f->get<int64_t>(), 0) : 0;
      };
      r.start = static_cast<size_t>(std::min<int64_t>(num("start"), 1 << 20));
      r.stop = static_cast<size_t>(std::min<int64_t>(num("stop"), 1 << 20));
    } else if (type == "Metaspace") {
      r.k = decode_rewrite::kind::metaspace;
      r.replacement = str_or(d, "replacement", "\xE2\x96\x81");
      auto cp = one_char(r.replacement, "decoder Metaspace: replacement");
      if (!cp) return cp.error();
      r.replacement_cp = *cp;
      auto scheme = metaspace_scheme(d, "decoder Metaspace");
      if (!scheme) return scheme.error();
      r.drop_first = *scheme != "never";
    } else {
      return unsupported("decoder", d);
    }
    (joined ? c.on_text : c.byte_fallback ? c.after_bytes : c.before_bytes).push_back(std::move(r));
  }
  return c;
}

decoder_chain decoder_chain::byte_level_gpt2() {
  decoder_chain c;
  c.join = join_kind::byte_level;
  return c;
}

bool decoder_chain::first_sensitive() const {
  for (auto* list : {&before_bytes, &after_bytes})
    for (auto& r : *list)
      if (r.k == decode_rewrite::kind::metaspace) return true;
  return false;
}

int byte_fallback_value(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  // Rust's u8::from_str_radix, which tokenizers uses, also takes a '+' sign.
  if (t[3] == '+') return hex(t[4]);
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// ---- the decoder chain, a token at a time ------------------------------------------------

void tokenizer::decode_step(decode_state& st, int64_t id, bool skip_special,
                            std::string& out) const {
  auto& d = *d_;
  if (id < 0 || id >= d.size) return;
  auto f = d.flags[static_cast<size_t>(id)];
  if (!(f & tokenizer_data::known) || (skip_special && (f & tokenizer_data::special))) return;
  auto& dec = d.decoder;
  bool fast = (st.seen_token || !has_metaspace(dec.before_bytes)) &&
              (st.seen_piece || !has_metaspace(dec.after_bytes));
  if (fast) {
    // The token's piece was worked out when the files were read.
    st.seen_token = true;
    auto& piece = d.piece[static_cast<size_t>(id)];
    if (f & tokenizer_data::fallback_byte) {
      st.run += piece;
      return;
    }
    if (!st.run.empty()) flush_run(d, st, out);
    st.seen_piece = true;
    join(d, st, piece, true, out);
    return;
  }
  std::string s{d.token_text(id)};
  for (auto& r : dec.before_bytes) s = r.apply(s, !st.seen_token);
  st.seen_token = true;
  if (int b = dec.byte_fallback ? byte_fallback_value(s) : -1; b >= 0) {
    st.run += static_cast<char>(b);
    return;
  }
  if (!st.run.empty()) flush_run(d, st, out);
  after_fallback(d, st, std::move(s), out);
}

void tokenizer::decode_finish(decode_state& st, std::string& out) const {
  auto& d = *d_;
  if (!st.run.empty()) flush_run(d, st, out);
  std::string rest;
  if (!st.pending.empty()) unicode::drain_utf8(st.pending, true, rest, d.repair);
  if (d.decoder.on_text.empty())
    out += rest;
  else
    on_text(d, st, 0, rest, true, out);
}

std::string tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  detail::decode_state st;
  std::string out;
  for (auto id : ids) decode_step(st, id, skip_special_tokens, out);
  decode_finish(st, out);
  return out;
}

std::string_view tokenizer::token_bytes(int64_t id) const {
  if (id < 0 || id >= d_->size) return {};
  auto f = d_->flags[static_cast<size_t>(id)];
  if (!(f & tokenizer_data::known) || (f & tokenizer_data::special)) return {};
  return d_->piece[static_cast<size_t>(id)];
}

std::string stream_decoder::push(int64_t id) {
  std::string out;
  tok_->decode_step(state_, id, skip_special_, out);
  return out;
}

std::string stream_decoder::finish() {
  std::string out;
  tok_->decode_finish(state_, out);
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

}  // namespace computron::text
