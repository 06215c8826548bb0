// tokenizer::from_vocabulary: a GGUF file's tokenizer (tokenizer.ggml.*) as the parts a
// tokenizer.json and tokenizer_config.json would give, with the pipeline transformers'
// GGUF converters build for the same file, so both encode a text to the same ids.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/gguf.hpp"
#include "text/tokenizer.hpp"
#include "text/tokenizer_internal.hpp"

namespace computron::text {

namespace {

using json = nlohmann::json;

// GGUF's token types (llama.cpp's llama_token_type).
constexpr int32_t type_unknown = 2, type_control = 3, type_user_defined = 4;

caf::error bad(const vocabulary& v, const std::string& why) {
  return make_error(ec::invalid_configuration, "tokenizer of " + v.source + ": " + why);
}

/// The pipeline around the BPE model: byte-level for "gpt2", SentencePiece's for "llama"
/// (a space becomes U+2581, one is prepended, unknown bytes fall back to <0xNN> tokens).
json pipeline(const vocabulary& v) {
  json rest = json::object();
  if (v.model == "gpt2") {
    json byte_level{{"type", "ByteLevel"},
                    {"add_prefix_space", false},
                    {"trim_offsets", false},
                    {"use_regex", true}};
    rest["model"] = {{"type", "BPE"}};
    rest["pre_tokenizer"] = byte_level;
    rest["decoder"] = byte_level;
    if (v.pre == "qwen2") {
      // Qwen's own tokenizer.json, which transformers' GGUF converter builds for qwen2 and
      // qwen3 files too: NFC, then a regex that splits digits one by one and keeps
      // punctuation with the word after it, then the bytes without GPT-2's regex.
      auto bytes = byte_level;
      bytes["use_regex"] = false;
      rest["normalizer"] = {{"type", "NFC"}};
      rest["pre_tokenizer"] = {
          {"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern",
              {{"Regex",
                R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            bytes}}};
    }
    return rest;
  }
  rest["model"] = {{"type", "BPE"}, {"byte_fallback", true}, {"fuse_unk", true}};
  if (v.unk) rest["model"]["unk_token"] = v.tokens[static_cast<size_t>(*v.unk)];
  rest["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "\u2581"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};
  rest["decoder"] = {{"type", "Sequence"},
                     {"decoders",
                      {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                       {{"type", "ByteFallback"}},
                       {{"type", "Fuse"}},
                       {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  return rest;
}

}  // namespace

std::vector<std::pair<std::string_view, std::string_view>> merges_from_scores(const vocabulary& v) {
  if (v.scores.size() != v.tokens.size()) return {};  // from_vocabulary names this
  // transformers keys the scores by piece (a dict): a piece listed twice keeps its first
  // place and takes its last score. The same here, so that even such a file agrees.
  struct piece_info {
    size_t first;
    float score;
  };
  std::unordered_map<std::string_view, piece_info> pieces;
  pieces.reserve(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    auto [it, fresh] = pieces.try_emplace(v.tokens[i], piece_info{i, v.scores[i]});
    if (!fresh) it->second.score = v.scores[i];
  }
  struct candidate {
    std::string_view left, right;
    float score, left_score, right_score;
    size_t piece;  // the merged piece's place, which orders equal scores
  };
  // Two hash lookups per character boundary of each piece, so Llama 2's 32k pieces take
  // milliseconds (transformers' own loop tests membership in the token list, a scan of
  // the whole vocabulary per split).
  std::vector<candidate> found;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    std::string_view piece = v.tokens[i];
    const auto& self = pieces.find(piece)->second;
    if (self.first != i) continue;  // listed before: its merges are there already
    for (size_t k = 1; k < piece.size(); ++k) {
      // Python splits a str between characters, never inside one's UTF-8 bytes.
      if ((static_cast<unsigned char>(piece[k]) & 0xC0) == 0x80) continue;
      auto l = pieces.find(piece.substr(0, k));
      if (l == pieces.end()) continue;
      auto r = pieces.find(piece.substr(k));
      if (r == pieces.end()) continue;
      found.push_back(
          {piece.substr(0, k), piece.substr(k), self.score, l->second.score, r->second.score, i});
    }
  }
  // transformers sorts each piece's splits by the parts' scores, highest first, then all
  // of them by the merged piece's score, highest first; both sorts are stable, so ties
  // keep the vocabulary's order and, within a piece, the split's position. One stable
  // sort on the combined key gives the same order.
  std::stable_sort(found.begin(), found.end(), [](const candidate& a, const candidate& b) {
    return std::tie(b.score, a.piece, b.left_score, b.right_score) <
           std::tie(a.score, b.piece, a.left_score, a.right_score);
  });
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  merges.reserve(found.size());
  for (auto& c : found) merges.emplace_back(c.left, c.right);
  return merges;
}

caf::expected<std::shared_ptr<const tokenizer>> tokenizer::from_vocabulary(const vocabulary& v) {
  if (v.model != "gpt2" && v.model != "llama")
    return bad(v, fmt::format("tokenizer.ggml.model '{}' is not supported (gpt2: byte-level "
                              "BPE, llama: SentencePiece BPE)",
                              v.model));
  if (v.tokens.empty()) return bad(v, "no tokens");
  if (v.tokens.size() >= (1u << 24)) return bad(v, "more than 2^24 tokens");
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size())
    return bad(v,
               fmt::format("{} token types for {} tokens", v.token_types.size(), v.tokens.size()));
  // Without merges, a SentencePiece vocabulary has them built from its scores, as
  // transformers does (llama.cpp's converter writes Llama 2's and Mistral's files so). A
  // byte-level one always comes with its merges (llama.cpp writes them): without, refused.
  const bool derive = v.merges.empty();
  if (derive) {
    if (v.model != "llama") return bad(v, "no merges (tokenizer.ggml.merges)");
    if (v.scores.empty())
      return bad(v,
                 "neither merges (tokenizer.ggml.merges) nor scores to build them from "
                 "(tokenizer.ggml.scores)");
    if (v.scores.size() != v.tokens.size())
      return bad(v, fmt::format("{} scores for {} tokens", v.scores.size(), v.tokens.size()));
    // A NaN compares neither way, so the merges would have no order.
    for (size_t i = 0; i < v.scores.size(); ++i)
      if (std::isnan(v.scores[i]))
        return bad(v, fmt::format("the score of token {} ('{}') is not a number", i, v.tokens[i]));
  }
  const auto n = static_cast<int64_t>(v.tokens.size());
  for (auto [id, what] : {std::pair{v.bos, "bos"}, std::pair{v.eos, "eos"},
                          std::pair{v.pad, "padding"}, std::pair{v.unk, "unknown"}})
    if (id && (*id < 0 || *id >= n))
      return bad(v, fmt::format("the {} token id {} is outside the {} tokens", what, *id, n));
  detail::tokenizer_parts p;
  p.source = v.source;
  p.rest = pipeline(v);
  // Control and unknown tokens are special (never produced by BPE, left out when
  // decoding); user-defined ones are added tokens matched in the text.
  json added = json::array();
  p.vocab.reserve(v.tokens.size());
  for (int64_t id = 0; id < n; ++id) {
    const auto& tok = v.tokens[static_cast<size_t>(id)];
    p.vocab.emplace_back(tok, id);
    auto type = v.token_types.empty() ? 1 : v.token_types[static_cast<size_t>(id)];
    if (type == type_control || type == type_unknown || type == type_user_defined)
      added.push_back({{"id", id},
                       {"content", tok},
                       {"special", type != type_user_defined},
                       {"normalized", false}});
  }
  p.rest["added_tokens"] = std::move(added);
  if (derive) p.merges = merges_from_scores(v);
  p.merges.reserve(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    std::string_view m = v.merges[i];
    auto sp = m.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == m.size() ||
        m.find(' ', sp + 1) != std::string_view::npos)
      return bad(
          v, fmt::format("merge {} ('{}') is not two symbols separated by one space", i + 1, m));
    p.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  auto name = [&](const std::optional<int64_t>& id) -> std::optional<std::string> {
    if (!id) return std::nullopt;
    return v.tokens[static_cast<size_t>(*id)];
  };
  p.bos = name(v.bos);
  p.eos = name(v.eos);
  p.pad = name(v.pad);
  p.unk = name(v.unk);
  p.add_bos = v.add_bos;
  p.add_eos = v.add_eos;
  if (v.chat_template) p.templates.emplace_back("default", *v.chat_template);
  if (v.eos) p.eos_ids.push_back(*v.eos);
  return detail::from_parts(p);
}

caf::expected<vocabulary> read_gguf_vocabulary(const std::string& path) {
  auto f = gguf_file::open(path);
  if (!f) return f.error();
  vocabulary v;
  v.source = path;
  auto model = f->get_string("tokenizer.ggml.model");
  if (!model) return with_context(model.error(), "tokenizer");
  v.model = std::string{*model};
  if (f->find("tokenizer.ggml.pre")) {
    auto pre = f->get_string("tokenizer.ggml.pre");
    if (!pre) return with_context(pre.error(), "tokenizer");
    v.pre = std::string{*pre};
  }
  auto tokens = f->get_strings("tokenizer.ggml.tokens");
  if (!tokens) return with_context(tokens.error(), "tokenizer");
  v.tokens.assign(tokens->begin(), tokens->end());
  if (f->find("tokenizer.ggml.token_type")) {
    auto types = f->get_ints("tokenizer.ggml.token_type");
    if (!types) return with_context(types.error(), "tokenizer");
    for (auto t : *types) v.token_types.push_back(static_cast<int32_t>(t));
  }
  if (f->find("tokenizer.ggml.merges")) {
    auto merges = f->get_strings("tokenizer.ggml.merges");
    if (!merges) return with_context(merges.error(), "tokenizer");
    v.merges.assign(merges->begin(), merges->end());
  }
  if (f->find("tokenizer.ggml.scores")) {
    auto scores = f->get_floats("tokenizer.ggml.scores");
    if (!scores) return with_context(scores.error(), "tokenizer");
    v.scores = std::move(*scores);
  }
  for (auto [key, slot] : {std::pair{"tokenizer.ggml.bos_token_id", &v.bos},
                           std::pair{"tokenizer.ggml.eos_token_id", &v.eos},
                           std::pair{"tokenizer.ggml.padding_token_id", &v.pad},
                           std::pair{"tokenizer.ggml.unknown_token_id", &v.unk}})
    if (f->find(key)) {
      auto id = f->get_int(key);
      if (!id) return with_context(id.error(), "tokenizer");
      *slot = *id;
    }
  for (auto [key, slot] : {std::pair{"tokenizer.ggml.add_bos_token", &v.add_bos},
                           std::pair{"tokenizer.ggml.add_eos_token", &v.add_eos}})
    if (f->find(key)) {
      auto b = f->get_bool(key);
      if (!b) return with_context(b.error(), "tokenizer");
      *slot = *b;
    }
  if (f->find("tokenizer.chat_template")) {
    auto c = f->get_string("tokenizer.chat_template");
    if (!c) return with_context(c.error(), "tokenizer");
    v.chat_template = std::string{*c};
  }
  return v;
}

}  // namespace computron::text
