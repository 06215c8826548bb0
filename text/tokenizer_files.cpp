// tokenizer::open: tokenizer.json (or GPT-2's vocab.json + merges.txt), then
// tokenizer_config.json and generation_config.json beside it.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <simdjson.h>

#include "common/error.hpp"
#include "common/json_file.hpp"
#include "text/tokenizer.hpp"
#include "text/tokenizer_internal.hpp"

namespace computron::text {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::added_token;
using detail::tokenizer_data;

caf::error bad_file(const fs::path& p, const std::string& why) {
  return make_error(ec::invalid_configuration, "tokenizer " + p.string() + ": " + why);
}

caf::expected<std::unordered_map<std::string, int64_t>> vocab_of(const json& j,
                                                                 const fs::path& where) {
  if (!j.is_object()) return bad_file(where, "the vocabulary must be an object of ids");
  std::unordered_map<std::string, int64_t> v;
  v.reserve(j.size());
  for (auto& [k, id] : j.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24))
      return bad_file(where, "token '" + k + "' has no valid id");
    v.emplace(k, id.get<int64_t>());
  }
  return v;
}

/// A boolean option: absent or null gives `fallback`; another type is an error.
caf::expected<bool> flag(const json& j, const char* key, bool fallback, const fs::path& where,
                         const std::string& what) {
  auto f = j.find(key);
  if (f == j.end() || f->is_null()) return fallback;
  if (!f->is_boolean()) return bad_file(where, what + ": " + key + " must be true or false");
  return f->get<bool>();
}

/// What tokenizer_config.json says, where it is there.
struct config {
  bool present = false;
  std::optional<std::string> bos, eos, pad, unk;
  std::optional<bool> add_bos, add_eos, split_special;
  std::vector<std::string> additional;
  std::vector<std::pair<std::string, std::string>> templates;
};

/// A token the config names: a string, an AddedToken object {"content": ...}, or null.
caf::expected<std::optional<std::string>> token_name(const json& v, const std::string& key,
                                                     const fs::path& where) {
  if (v.is_null()) return std::optional<std::string>{};
  if (v.is_string()) return std::optional<std::string>{v.get<std::string>()};
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return std::optional<std::string>{v["content"].get<std::string>()};
  return bad_file(where, key + " must be a string, {\"content\": ...} or null");
}

caf::expected<config> read_config(const fs::path& dir) {
  config c;
  auto file = dir / "tokenizer_config.json";
  std::error_code err;
  if (fs::exists(file, err)) {
    auto j = read_json_file(file);
    if (!j) return j.error();
    if (!j->is_object()) return bad_file(file, "not a JSON object");
    c.present = true;
    for (auto [key, slot] : {std::pair{"bos_token", &c.bos}, std::pair{"eos_token", &c.eos},
                             std::pair{"pad_token", &c.pad}, std::pair{"unk_token", &c.unk}})
      if (auto f = j->find(key); f != j->end()) {
        auto name = token_name(*f, key, file);
        if (!name) return name.error();
        *slot = *name;
      }
    for (auto [key, slot] :
         {std::pair{"add_bos_token", &c.add_bos}, std::pair{"add_eos_token", &c.add_eos},
          std::pair{"split_special_tokens", &c.split_special}})
      if (auto f = j->find(key); f != j->end() && !f->is_null()) {
        if (!f->is_boolean()) return bad_file(file, std::string{key} + " must be true or false");
        *slot = f->get<bool>();
      }
    if (auto f = j->find("additional_special_tokens"); f != j->end() && !f->is_null()) {
      if (!f->is_array()) return bad_file(file, "additional_special_tokens must be a list");
      for (auto& e : *f) {
        auto name = token_name(e, "additional_special_tokens", file);
        if (!name) return name.error();
        if (*name) c.additional.push_back(**name);
      }
    }
    if (auto f = j->find("chat_template"); f != j->end() && !f->is_null()) {
      if (f->is_string()) {
        c.templates.emplace_back("default", f->get<std::string>());
      } else if (f->is_array()) {
        for (auto& e : *f) {
          if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
              !e.contains("template") || !e["template"].is_string())
            return bad_file(file, "chat_template list entries must be {name, template}");
          c.templates.emplace_back(e["name"].get<std::string>(), e["template"].get<std::string>());
        }
      } else {
        return bad_file(file, "chat_template must be a string or a list of {name, template}");
      }
    }
  }
  // Newer folders keep the template in its own file.
  auto jinja = dir / "chat_template.jinja";
  bool has_default = std::any_of(c.templates.begin(), c.templates.end(),
                                 [](auto& t) { return t.first == "default"; });
  if (!has_default && fs::exists(jinja, err)) {
    std::ifstream in{jinja};
    std::stringstream s;
    s << in.rdbuf();
    if (!in) return make_error(ec::io_error, "tokenizer: cannot read " + jinja.string());
    c.templates.emplace_back("default", s.str());
  }
  return c;
}

/// generation_config.json's eos_token_id: an id or a list of them.
caf::expected<std::vector<int64_t>> read_generation_eos(const fs::path& dir) {
  auto file = dir / "generation_config.json";
  std::error_code err;
  std::vector<int64_t> ids;
  if (!fs::exists(file, err)) return ids;
  auto j = read_json_file(file);
  if (!j) return j.error();
  if (!j->is_object()) return bad_file(file, "not a JSON object");
  auto f = j->find("eos_token_id");
  if (f == j->end() || f->is_null()) return ids;
  auto add = [&](const json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return false;
    if (std::find(ids.begin(), ids.end(), v.get<int64_t>()) == ids.end())
      ids.push_back(v.get<int64_t>());
    return true;
  };
  bool ok = f->is_array() ? std::all_of(f->begin(), f->end(), add) : add(*f);
  if (!ok) return bad_file(file, "eos_token_id must be an id or a list of ids");
  return ids;
}

/// The ids a post-processor puts before and after a single text.
caf::error post_processor(const json& j, std::vector<int64_t>& prefix, std::vector<int64_t>& suffix,
                          const fs::path& where) {
  if (j.is_null()) return {};
  auto type = j.is_object() ? j.value("type", std::string{}) : std::string{};
  if (type == "ByteLevel") return {};  // offsets only
  if (type == "Sequence") {
    auto list = j.find("processors");
    if (list == j.end() || !list->is_array())
      return bad_file(where, "post_processor Sequence has no list");
    // Each processor wraps what the ones before it made.
    for (auto& p : *list) {
      std::vector<int64_t> pre, post;
      if (auto err = post_processor(p, pre, post, where)) return err;
      prefix.insert(prefix.begin(), pre.begin(), pre.end());
      suffix.insert(suffix.end(), post.begin(), post.end());
    }
    return {};
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key) -> std::optional<int64_t> {
      auto f = j.find(key);
      if (f == j.end() || !f->is_array() || f->size() != 2 || !(*f)[1].is_number_integer())
        return std::nullopt;
      return (*f)[1].get<int64_t>();
    };
    auto cls = id_of("cls"), sep = id_of("sep");
    if (!cls || !sep) return bad_file(where, "post_processor " + type + " needs cls and sep");
    prefix = {*cls};
    suffix = {*sep};
    return {};
  }
  if (type != "TemplateProcessing") {
    auto t = j.is_object() && j.contains("type") ? j["type"].dump() : j.dump().substr(0, 80);
    return bad_file(where, "post_processor type " + t + " is not supported");
  }
  auto single = j.find("single");
  auto specials = j.find("special_tokens");
  if (single == j.end() || !single->is_array())
    return bad_file(where, "TemplateProcessing has no single template");
  bool seen_a = false;
  for (auto& item : *single) {
    if (item.is_object() && item.contains("Sequence")) {
      auto& s = item["Sequence"];
      if (!s.is_object() || s.value("id", std::string{}) != "A" || seen_a)
        return bad_file(where, "TemplateProcessing's single template must hold sequence A once");
      seen_a = true;
    } else if (item.is_object() && item.contains("SpecialToken") &&
               item["SpecialToken"].is_object()) {
      auto name = item["SpecialToken"].value("id", std::string{});
      const json* entry = nullptr;
      if (specials != j.end() && specials->is_object() && specials->contains(name))
        entry = &(*specials)[name];
      if (!entry || !entry->is_object() || !entry->contains("ids") || !(*entry)["ids"].is_array())
        return bad_file(where, "TemplateProcessing names '" + name + "' without its ids");
      for (auto& id : (*entry)["ids"]) {
        if (!id.is_number_integer())
          return bad_file(where, "TemplateProcessing: ids of '" + name + "'");
        (seen_a ? suffix : prefix).push_back(id.get<int64_t>());
      }
    } else {
      return bad_file(where,
                      "TemplateProcessing holds an item that is neither SpecialToken "
                      "nor Sequence");
    }
  }
  if (!seen_a) return bad_file(where, "TemplateProcessing's single template has no sequence A");
  return {};
}

/// tokenizer.json, read with simdjson: the vocabulary and the merges (nearly all of the file)
/// as views into the parsed document, everything else as nlohmann JSON for the parts above.
struct tokenizer_file {
  simdjson::dom::parser parser;  // holds the strings the views point into
  json rest = json::object();    // the file without model.vocab and model.merges
  bool has_vocab = false;
  std::vector<std::pair<std::string_view, int64_t>> vocab;
  std::vector<std::pair<std::string_view, std::string_view>> merges;
};

caf::error load(const fs::path& tj, tokenizer_file& f) {
  simdjson::padded_string bytes;
  if (simdjson::padded_string::load(tj.string()).get(bytes))
    return make_error(ec::io_error, "tokenizer: cannot read " + tj.string());
  simdjson::dom::element doc;
  if (auto err = f.parser.parse(bytes).get(doc))
    return bad_file(tj, std::string{"is not valid JSON ("} + simdjson::error_message(err) + ")");
  simdjson::dom::object top;
  if (doc.get(top)) return bad_file(tj, "not a JSON object");
  auto small = [](simdjson::dom::element e) { return json::parse(simdjson::minify(e)); };
  for (auto [key, value] : top) {
    simdjson::dom::object model;
    if (key != "model" || value.get(model)) {
      f.rest[std::string{key}] = small(value);
      continue;
    }
    f.rest["model"] = json::object();
    for (auto [mkey, mvalue] : model) {
      if (mkey == "vocab" && mvalue.is_object()) {
        f.has_vocab = true;
        for (auto [tok, id] : simdjson::dom::object(mvalue)) {
          int64_t n = -1;
          if (id.get(n) || n < 0 || n >= (1 << 24))
            return bad_file(tj, "token '" + std::string{tok} + "' has no valid id");
          f.vocab.emplace_back(tok, n);
        }
      } else if (mkey == "merges" && mvalue.is_array()) {
        for (auto m : simdjson::dom::array(mvalue)) {
          std::string_view line, a, b;
          simdjson::dom::array pair;
          if (!m.get(line)) {
            auto sp = line.find(' ');
            if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
                line.find(' ', sp + 1) != std::string_view::npos)
              return bad_file(tj, "merge " + std::to_string(f.merges.size() + 1) + " ('" +
                                      std::string{line} +
                                      "') is not two symbols separated by one space");
            f.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
          } else if (!m.get(pair) && pair.size() == 2 && !pair.at(0).get(a) && !pair.at(1).get(b)) {
            f.merges.emplace_back(a, b);
          } else {
            return bad_file(tj, "model.merges holds something that is not a pair");
          }
        }
      } else {
        f.rest["model"][std::string{mkey}] = small(mvalue);
      }
    }
  }
  return {};
}

caf::expected<std::vector<added_token>> added_tokens_of(const json& j, const fs::path& where,
                                                        bool special_by_default) {
  std::vector<added_token> out;
  auto added = j.find("added_tokens");
  if (added == j.end() || added->is_null()) return out;
  if (!added->is_array()) return bad_file(where, "added_tokens must be a list");
  for (auto& a : *added) {
    if (!a.is_object() || !a.contains("content") || !a["content"].is_string() ||
        !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() >= (1 << 24))
      return bad_file(where, "added_tokens: each needs a content and an id (0 .. 2^24)");
    added_token t;
    t.content = a["content"].get<std::string>();
    t.id = a["id"].get<int64_t>();
    auto special = flag(a, "special", special_by_default, where, "added_tokens");
    if (!special) return special.error();
    t.special = *special;
    for (auto [key, slot] : {std::pair{"lstrip", &t.lstrip}, std::pair{"rstrip", &t.rstrip},
                             std::pair{"single_word", &t.single_word}}) {
      auto v = flag(a, key, false, where, "added_tokens");
      if (!v) return v.error();
      *slot = *v;
    }
    auto normalized = flag(a, "normalized", !t.special, where, "added_tokens");
    if (!normalized) return normalized.error();
    t.normalized = *normalized;
    if (!t.content.empty()) out.push_back(std::move(t));
  }
  return out;
}

/// tokenizer.json. `legacy`: set when it names no pipeline at all (an old export), which
/// then reads as GPT-2's byte-level one.
caf::expected<std::unique_ptr<tokenizer_data>> build_tokenizer(const tokenizer_file& f,
                                                               const fs::path& tj, bool& legacy) {
  const json& j = f.rest;
  auto model = j.find("model");
  if (model == j.end() || !model->is_object()) return bad_file(tj, "no 'model' object");
  auto type = model->contains("type") ? (*model)["type"] : json("BPE");
  if (!type.is_string() || type.get<std::string>() != "BPE")
    return bad_file(tj, "model type " + type.dump() + " is not supported (only BPE)");
  if (!f.has_vocab) return bad_file(tj, "no model.vocab object");
  legacy = !j.contains("normalizer") && !j.contains("pre_tokenizer") &&
           !j.contains("post_processor") && !j.contains("decoder");
  auto added = added_tokens_of(j, tj, legacy);
  if (!added) return added.error();
  if (legacy) {
    std::unordered_map<std::string, int64_t> vocab;
    for (auto& [tok, id] : f.vocab) vocab[std::string{tok}] = id;
    std::set<std::string> specials;
    std::vector<std::string> lines;
    for (auto& a : *added) {
      vocab.emplace(a.content, a.id);
      if (a.special) specials.insert(a.content);
    }
    for (auto& [a, b] : f.merges) lines.push_back(std::string{a} + " " + std::string{b});
    auto d = detail::make_byte_level(std::move(vocab), lines, std::move(specials));
    if (!d) return with_context(d.error(), tj.string());
    return d;
  }
  auto d = std::make_unique<tokenizer_data>();
  bpe_options options;
  for (auto [key, slot] : {std::pair{"byte_fallback", &options.byte_fallback},
                           std::pair{"fuse_unk", &options.fuse_unk},
                           std::pair{"ignore_merges", &options.ignore_merges}}) {
    auto f = flag(*model, key, false, tj, "model");
    if (!f) return f.error();
    *slot = *f;
  }
  if (auto u = model->find("unk_token"); u != model->end() && !u->is_null()) {
    if (!u->is_string()) return bad_file(tj, "model.unk_token must be a string or null");
    options.unk_token = u->get<std::string>();
  }
  if (auto p = model->find("dropout"); p != model->end() && !p->is_null())
    if (!p->is_number() || p->get<double>() != 0.0)
      return bad_file(tj, "model.dropout (random BPE) is not supported");
  for (auto* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto p = model->find(key); p != model->end() && !p->is_null())
      if (!p->is_string() || !p->get<std::string>().empty())
        return bad_file(tj, std::string{"model."} + key + " is not supported");
  auto bpe = bpe_model::make(f.vocab, f.merges, options);
  if (!bpe) return with_context(bpe.error(), "tokenizer " + tj.string());
  d->model = std::move(*bpe);
  auto part = [&](const char* key) -> const json& {
    static const json null;
    auto f = j.find(key);
    return f == j.end() ? null : *f;
  };
  auto normalizer = normalizer_chain::parse(part("normalizer"));
  if (!normalizer) return with_context(normalizer.error(), "tokenizer " + tj.string());
  d->normalizer = std::move(*normalizer);
  auto pre = pre_tokenizer_chain::parse(part("pre_tokenizer"));
  if (!pre) return with_context(pre.error(), "tokenizer " + tj.string());
  d->pre = std::move(*pre);
  auto decoder = decoder_chain::parse(part("decoder"));
  if (!decoder) return with_context(decoder.error(), "tokenizer " + tj.string());
  d->decoder = std::move(*decoder);
  if (auto err = post_processor(part("post_processor"), d->prefix, d->suffix, tj)) return err;
  d->added = std::move(*added);
  return d;
}

caf::expected<std::unique_ptr<tokenizer_data>> read_tokenizer_json(const fs::path& tj,
                                                                   bool& legacy) {
  tokenizer_file f;
  if (auto err = load(tj, f)) return err;
  return build_tokenizer(f, tj, legacy);
}

/// GPT-2's own files: vocab.json + merges.txt, or encoder.json + vocab.bpe.
caf::expected<std::unique_ptr<tokenizer_data>> read_vocab_merges(const fs::path& p,
                                                                 const std::string& path) {
  fs::path vj = p / "vocab.json", mt = p / "merges.txt";
  std::error_code err;
  if (!fs::exists(vj, err) && fs::exists(p / "encoder.json", err)) {
    vj = p / "encoder.json";
    mt = p / "vocab.bpe";
  }
  if (!fs::exists(vj, err))
    return make_error(ec::io_error,
                      "tokenizer: " + path + " has no tokenizer.json, vocab.json or encoder.json");
  auto j = read_json_file(vj);
  if (!j) return j.error();
  auto vocab = vocab_of(*j, vj);
  if (!vocab) return vocab.error();
  std::ifstream in{mt};
  if (!in) return make_error(ec::io_error, "tokenizer: cannot read " + mt.string());
  std::vector<std::string> merges;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  auto d = detail::make_byte_level(std::move(*vocab), merges, {});
  if (!d) return with_context(d.error(), path);
  return d;
}

/// tokenizer_config.json and generation_config.json applied to `d`.
void apply_configs(tokenizer_data& d, const config& cfg, const std::vector<int64_t>& gen_eos,
                   bool legacy) {
  d.chat_templates = cfg.templates;
  if (cfg.present) {
    // Tokens the config names are special tokens (transformers adds them so) when the
    // vocabulary has them and they are not added tokens already.
    std::vector<std::string> named = cfg.additional;
    for (auto* n : {&cfg.bos, &cfg.eos, &cfg.pad, &cfg.unk})
      if (*n) named.push_back(**n);
    for (auto& name : named) {
      bool added =
          std::any_of(d.added.begin(), d.added.end(), [&](auto& a) { return a.content == name; });
      auto id = d.model.id_of(name);
      if (!added && id && !name.empty()) {
        added_token t;
        t.content = name;
        t.id = *id;
        t.special = true;
        d.added.push_back(std::move(t));
      }
    }
    auto id = [&](const std::optional<std::string>& n) -> std::optional<int64_t> {
      return n ? d.id_of(*n) : std::nullopt;
    };
    // GPT-2's own files keep their guesses where the config is silent.
    if (!legacy || cfg.bos) {
      d.bos_token = cfg.bos;
      d.bos = id(cfg.bos);
    }
    if (!legacy || cfg.eos) {
      d.eos_token = cfg.eos;
      d.eos = id(cfg.eos);
    }
    if (!legacy || cfg.pad) d.pad = id(cfg.pad);
    // split_special_tokens: special tokens written in the text are text like any other.
    d.split_special_tokens = cfg.split_special.value_or(false);
    // transformers (TokenizersBackend): either flag in the config replaces the single
    // template with [bos] $A [eos], a flag it does not give counting as false.
    if (cfg.add_bos || cfg.add_eos) {
      d.prefix.clear();
      d.suffix.clear();
      if (cfg.add_bos.value_or(false) && d.bos) d.prefix.push_back(*d.bos);
      if (cfg.add_eos.value_or(false) && d.eos) d.suffix.push_back(*d.eos);
    }
  } else if (!legacy) {
    // No config: the template's lone token is BOS; EOS and padding by their usual names.
    d.bos = d.prefix.size() == 1 ? std::optional<int64_t>{d.prefix[0]} : d.id_of("<s>");
    for (auto* name : {"</s>", "<|endoftext|>"})
      if (!d.eos) d.eos = d.id_of(name);
    d.pad = d.id_of("<pad>");
    if (d.bos) d.bos_token = std::string{d.token_text(*d.bos)};
    if (d.eos) d.eos_token = std::string{d.token_text(*d.eos)};
  }
  d.eos_ids = gen_eos;
  if (!d.eos && !d.eos_ids.empty()) {
    d.eos = d.eos_ids.front();
    if (!d.eos_token) d.eos_token = std::string{d.token_text(*d.eos)};
  }
}

}  // namespace

caf::expected<std::shared_ptr<const tokenizer>> detail::from_parts(const tokenizer_parts& p) {
  try {
    tokenizer_file f;
    f.rest = p.rest;
    f.has_vocab = true;
    f.vocab = p.vocab;
    f.merges = p.merges;
    bool legacy = false;
    auto d = build_tokenizer(f, fs::path{p.source}, legacy);
    if (!d) return d.error();
    config cfg;
    cfg.present = true;
    cfg.bos = p.bos;
    cfg.eos = p.eos;
    cfg.pad = p.pad;
    cfg.unk = p.unk;
    cfg.add_bos = p.add_bos;
    cfg.add_eos = p.add_eos;
    cfg.templates = p.templates;
    apply_configs(**d, cfg, p.eos_ids, legacy);
    detail::finish(**d, legacy);
    return detail::tokenizer_builder::wrap(std::move(*d));
  } catch (const std::exception& e) {
    return make_error(ec::invalid_configuration, "tokenizer " + p.source + ": " + e.what());
  }
}

caf::expected<std::shared_ptr<const tokenizer>> tokenizer::open(const std::string& path) {
  try {
    fs::path p{path};
    std::error_code err;
    if (fs::is_regular_file(p, err)) {
      std::ifstream in{p, std::ios::binary};
      char magic[4] = {};
      if (in.read(magic, 4) && std::string_view{magic, 4} == "GGUF") {
        auto v = read_gguf_vocabulary(path);
        if (!v) return v.error();
        return from_vocabulary(*v);
      }
    }
    bool dir = fs::is_directory(p, err);
    fs::path tj = dir ? p / "tokenizer.json" : p;
    // The small files first: a mistake there is found before the large one is read.
    auto cfg = read_config(dir ? p : p.parent_path());
    if (!cfg) return cfg.error();
    auto gen_eos = read_generation_eos(dir ? p : p.parent_path());
    if (!gen_eos) return gen_eos.error();
    std::unique_ptr<tokenizer_data> d;
    bool legacy = true;
    if (fs::is_regular_file(tj, err)) {
      auto got = read_tokenizer_json(tj, legacy);
      if (!got) return got.error();
      d = std::move(*got);
    } else {
      if (!dir)
        return make_error(ec::io_error, "tokenizer: " + path + " is neither a folder nor a file");
      auto got = read_vocab_merges(p, path);
      if (!got) return got.error();
      d = std::move(*got);
    }
    apply_configs(*d, *cfg, *gen_eos, legacy);
    detail::finish(*d, legacy);
    return detail::tokenizer_builder::wrap(std::move(d));
  } catch (const std::exception& e) {
    // A JSON value of an unexpected type that a check above missed: an error, not a crash.
    return make_error(ec::invalid_configuration, "tokenizer " + path + ": " + e.what());
  }
}

}  // namespace computron::text
