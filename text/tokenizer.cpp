#include "text/tokenizer.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "text/tokenizer_internal.hpp"

namespace computron::text {

using detail::added_token;
using detail::tokenizer_data;

// ---- the parts ------------------------------------------------------------------------

void detail::added_matcher::build(const std::vector<added_token>& all,
                                  const std::vector<size_t>& tokens,
                                  const std::vector<std::string>& patterns) {
  all_ = &all;
  nodes_.assign(1, node{});
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (size_t k = 0; k < tokens.size(); ++k) {
    auto& p = patterns[k];
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t at = 0;
    for (unsigned char c : p) {
      auto& next = nodes_[static_cast<size_t>(at)].next;
      auto f = std::find_if(next.begin(), next.end(), [c](auto& e) { return e.first == c; });
      if (f != next.end()) {
        at = f->second;
      } else {
        auto fresh = static_cast<int32_t>(nodes_.size());
        next.emplace_back(c, fresh);
        nodes_.emplace_back();
        at = fresh;
      }
    }
    // The same text twice: the first keeps it, as aho-corasick's first pattern does.
    if (nodes_[static_cast<size_t>(at)].token < 0)
      nodes_[static_cast<size_t>(at)].token = static_cast<int64_t>(tokens[k]);
  }
}

int64_t detail::added_matcher::longest_at(std::string_view s, size_t i, size_t& len) const {
  int64_t best = -1;
  size_t at = 0;
  for (size_t k = i; k < s.size(); ++k) {
    auto& next = nodes_[at].next;
    auto c = static_cast<unsigned char>(s[k]);
    auto f = std::find_if(next.begin(), next.end(), [c](auto& e) { return e.first == c; });
    if (f == next.end()) break;
    at = static_cast<size_t>(f->second);
    if (nodes_[at].token >= 0) {
      best = nodes_[at].token;
      len = k + 1 - i;
    }
  }
  return best;
}

std::string_view tokenizer_data::token_text(int64_t id) const {
  if (auto a = added_by_id.find(id); a != added_by_id.end()) return added[a->second].content;
  return model.token_of(id);
}

std::optional<int64_t> tokenizer_data::id_of(std::string_view token) const {
  for (auto& a : added)
    if (a.content == token) return a.id;
  return model.id_of(token);
}

void tokenizer_data::index_ids(bool legacy_specials) {
  piece.assign(static_cast<size_t>(size), {});
  flags.assign(static_cast<size_t>(size), 0);
  auto rewrite = [](const std::vector<decode_rewrite>& steps, std::string s) {
    for (auto& r : steps) s = r.apply(s, false);
    return s;
  };
  for (int64_t id = 0; id < size; ++id) {
    auto text = token_text(id);
    auto& f = flags[static_cast<size_t>(id)];
    if (text.empty()) continue;
    f |= known;
    auto a = added_by_id.find(id);
    if (a != added_by_id.end() && added[a->second].special) f |= special;
    auto s = rewrite(decoder.before_bytes, std::string{text});
    if (int b = decoder.byte_fallback ? byte_fallback_value(s) : -1; b >= 0) {
      f |= fallback_byte;
      piece[static_cast<size_t>(id)] = std::string(1, static_cast<char>(b));
      continue;
    }
    s = rewrite(decoder.after_bytes, std::move(s));
    if (decoder.join == decoder_chain::join_kind::byte_level) {
      // tokenizers maps a token back to bytes only when every character is in the
      // alphabet; any other token is taken as it is.
      std::string raw;
      bool all = true;
      for (size_t i = 0; i < s.size() && all;) {
        int b = byte_of_alphabet(unicode::next_code_point(s, i));
        all = b >= 0;
        raw += static_cast<char>(b);
      }
      if (all)
        s = std::move(raw);
      else if (legacy_specials)
        f |= special;  // GPT-2's files: such tokens are specials
    }
    piece[static_cast<size_t>(id)] = std::move(s);
  }
}

std::shared_ptr<const tokenizer> detail::tokenizer_builder::wrap(
    std::unique_ptr<tokenizer_data> d) {
  std::shared_ptr<tokenizer> t{new tokenizer()};
  t->d_ = std::move(d);
  return t;
}

tokenizer::tokenizer() = default;
tokenizer::~tokenizer() = default;

// ---- GPT-2's byte-level tokenizer from a vocabulary ------------------------------------

caf::expected<std::unique_ptr<tokenizer_data>> detail::make_byte_level(
    std::unordered_map<std::string, int64_t> vocab, const std::vector<std::string>& merges,
    std::set<std::string> specials) {
  for (auto* name : {"<s>", "</s>", "<pad>", "<unk>", "<mask>", "<|endoftext|>"})
    specials.insert(name);
  if (vocab.empty()) return make_error(ec::invalid_configuration, "tokenizer: empty vocabulary");
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t k = 0; k < merges.size(); ++k) {
    auto& m = merges[k];
    auto sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() ||
        m.find(' ', sp + 1) != std::string::npos)
      return make_error(ec::invalid_configuration,
                        "tokenizer: merge " + std::to_string(k + 1) + " ('" + m +
                            "') is not two symbols separated by one space");
    pairs.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  auto d = std::make_unique<tokenizer_data>();
  bpe_options options;
  if (vocab.count("<unk>")) options.unk_token = "<unk>";
  std::vector<std::pair<std::string_view, int64_t>> tokens{vocab.begin(), vocab.end()};
  std::vector<std::pair<std::string_view, std::string_view>> rules{pairs.begin(), pairs.end()};
  auto model = bpe_model::make(tokens, rules, options);
  if (!model) return with_context(model.error(), "tokenizer");
  d->model = std::move(*model);
  d->pre = pre_tokenizer_chain::byte_level_gpt2();
  d->decoder = decoder_chain::byte_level_gpt2();
  d->repair = unicode::utf8_repair::per_byte;
  for (auto& name : specials)
    if (auto v = vocab.find(name); v != vocab.end()) {
      added_token a;
      a.content = name;
      a.id = v->second;
      a.special = true;
      d->added_by_id[a.id] = d->added.size();
      d->added.push_back(std::move(a));
    }
  d->size = d->model.size();
  auto find = [&](const char* name) -> std::optional<int64_t> {
    auto i = vocab.find(name);
    if (i == vocab.end()) return std::nullopt;
    return i->second;
  };
  if (auto s = find("</s>")) {
    // OPT: `</s>` is both BOS and EOS, and every prompt starts with it.
    d->bos = d->eos = s;
    d->prefix = {*s};
    d->bos_token = d->eos_token = "</s>";
  } else if (auto e = find("<|endoftext|>")) {
    d->bos = d->eos = e;
    d->bos_token = d->eos_token = "<|endoftext|>";
  }
  d->pad = find("<pad>");
  return d;
}

caf::expected<std::shared_ptr<const tokenizer>> tokenizer::make(
    std::unordered_map<std::string, int64_t> vocab, const std::vector<std::string>& merges,
    std::set<std::string> specials) {
  auto d = detail::make_byte_level(std::move(vocab), merges, std::move(specials));
  if (!d) return d.error();
  detail::finish(**d, true);
  return detail::tokenizer_builder::wrap(std::move(*d));
}

std::shared_ptr<const tokenizer> tokenizer::bytes() {
  static const std::shared_ptr<const tokenizer> t = [] {
    std::unordered_map<std::string, int64_t> v{{"<s>", 0}, {"<pad>", 1}, {"</s>", 2}, {"<unk>", 3}};
    auto& alphabet = byte_alphabet();
    for (int b = 0; b < 256; ++b) v.emplace(alphabet[static_cast<size_t>(b)], 4 + b);
    return *make(std::move(v), {});
  }();
  return t;
}

void detail::finish(tokenizer_data& d, bool legacy_specials) {
  d.size = std::max(d.size, d.model.size());
  for (auto& a : d.added) d.size = std::max(d.size, a.id + 1);
  d.added_by_id.clear();
  for (size_t k = 0; k < d.added.size(); ++k) d.added_by_id[d.added[k].id] = k;
  std::vector<size_t> raw, normalized;
  std::vector<std::string> raw_text, normalized_text;
  for (size_t k = 0; k < d.added.size(); ++k) {
    auto& a = d.added[k];
    if (a.special && d.split_special_tokens) continue;
    if (a.normalized) {
      normalized.push_back(k);
      normalized_text.push_back(d.normalizer.empty() ? a.content : d.normalizer.apply(a.content));
    } else {
      raw.push_back(k);
      raw_text.push_back(a.content);
    }
  }
  d.raw_matcher.build(d.added, raw, raw_text);
  d.normalized_matcher.build(d.added, normalized, normalized_text);
  d.index_ids(legacy_specials);
  if (d.eos) {
    d.eos_ids.erase(std::remove(d.eos_ids.begin(), d.eos_ids.end(), *d.eos), d.eos_ids.end());
    d.eos_ids.insert(d.eos_ids.begin(), *d.eos);
  }
}

// ---- encoding -------------------------------------------------------------------------

std::vector<int64_t> tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  auto& d = *d_;
  std::vector<int64_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), d.prefix.begin(), d.prefix.end());
  auto word = [&](std::string_view w) { d.model.encode_word(w, out); };
  std::function<void(std::string_view)> on_word = word;
  // Text between added tokens: normalized, then split again on the added tokens that
  // match normalized text, then pre-tokenized into words for the model.
  auto plain = [&](std::string_view s, bool at_start) {
    d.normalized_matcher.split(s, [&](std::string_view piece, const added_token* t, size_t at) {
      if (t)
        out.push_back(t->id);
      else
        d.pre.apply(piece, at_start && at == 0, on_word);
    });
  };
  d.raw_matcher.split(text, [&](std::string_view piece, const added_token* t, size_t at) {
    if (t) {
      out.push_back(t->id);
    } else if (d.normalizer.empty()) {
      plain(piece, at == 0);
    } else {
      auto n = d.normalizer.apply(piece);
      plain(n, at == 0);
    }
  });
  if (add_special_tokens) out.insert(out.end(), d.suffix.begin(), d.suffix.end());
  return out;
}

// ---- what the files say ---------------------------------------------------------------

int64_t tokenizer::size() const {
  return d_->size;
}
std::optional<int64_t> tokenizer::bos() const {
  return d_->bos;
}
std::optional<int64_t> tokenizer::eos() const {
  return d_->eos;
}
std::vector<int64_t> tokenizer::eos_ids() const {
  return d_->eos_ids;
}
std::optional<int64_t> tokenizer::pad() const {
  return d_->pad;
}

bool tokenizer::adds_bos() const {
  return d_->bos && !d_->prefix.empty() && d_->prefix.front() == *d_->bos;
}

bool tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < d_->size && (d_->flags[static_cast<size_t>(id)] & tokenizer_data::special);
}

std::optional<int64_t> tokenizer::token_id(std::string_view token) const {
  return d_->id_of(token);
}

const std::optional<std::string>& tokenizer::bos_token() const {
  return d_->bos_token;
}
const std::optional<std::string>& tokenizer::eos_token() const {
  return d_->eos_token;
}

std::optional<std::string> tokenizer::chat_template(std::string_view name) const {
  for (auto& [n, t] : d_->chat_templates)
    if (n == name) return t;
  return std::nullopt;
}

std::vector<std::string> tokenizer::chat_template_names() const {
  std::vector<std::string> names;
  for (auto& [n, _] : d_->chat_templates) names.push_back(n);
  return names;
}

}  // namespace computron::text
