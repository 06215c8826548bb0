// The model repository: a folder of model folders (ours: config.json with the model's
// fields; Hugging Face's as downloaded, with computron.json beside it), each read into a
// model config or the error that keeps it from being one.
#include "serve/repository.hpp"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_file.hpp"
#include "common/log.hpp"
#include "models/checkpoint.hpp"
#include "models/decoder_spec.hpp"
#include "models/gguf_model.hpp"
#include "serve/json_fields.hpp"
#include "serve/sections.hpp"
#include "text/tokenizer.hpp"

namespace computron::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool has_tokenizer_files(const fs::path& f) {
  return fs::exists(f / "tokenizer.json") || fs::exists(f / "vocab.json");
}

std::string name_differs(const std::string& given, const std::string& name, const fs::path& f) {
  return "name '" + given + "' differs from " +
         (name == f.filename().string() ? std::string{"its folder's"}
                                        : "the name it is served as ('" + name + "')");
}

/// A GGUF file as the model `name`: its shape, tokenizer and chat template come from the
/// file, its weights are dequantized at registration (as "auto" dtype: the file's f32
/// where the devices run it). Our settings for it would need a file of their own; the
/// defaults apply.
caf::expected<actors::model_config> read_gguf(const fs::path& f, text::text_directory* texts,
                                              const std::string& name) {
  auto g = models::read_gguf_config(f.string());
  if (!g) return g.error();
  actors::model_config m;
  m.name = name;
  m.kind = models::to_string(g->spec.family);
  m.spec = g->spec.name;
  m.arch = models::to_json(g->spec).dump();
  m.checkpoint_dtype = g->dtype;
  m.dtype = "auto";
  m.weights_path = f.string();
  m.tokenizer = f.string();
  // Read here, off the request path, as a folder's tokenizer is.
  if (texts) {
    auto t = texts->open(m.tokenizer);
    if (!t) return t.error();
  }
  return m;
}

/// A PEFT LoRA adapter's folder (adapter_config.json, adapter_model.safetensors) as the
/// adapter `name`: its base is computron.json's "base" where it has one, else PEFT's
/// base_model_name_or_path, which registration matches against the served models. Its
/// shape, kind and devices are its base's; its tensors are checked against the base when
/// it registers (models/lora_adapter.hpp), where a refusal names the field.
caf::expected<actors::model_config> read_adapter_folder(const fs::path& f,
                                                        text::text_directory* texts,
                                                        const std::string& name,
                                                        const std::string& base = {}) {
  auto peft = read_json_file(f / "adapter_config.json");
  if (!peft) return peft.error();
  actors::model_config m;
  m.name = name;
  if (auto b = peft->find("base_model_name_or_path"); b != peft->end() && b->is_string())
    m.base = b->get<std::string>();
  auto ours = f / "computron.json";
  if (fs::exists(ours)) {
    auto j = read_json_file(ours);
    if (!j) return j.error();
    if (auto e = read_model(*j, ours.string(), f, m)) return e;
    if (m.name != name) return bad(ours.string(), name_differs(m.name, name, f));
  }
  // The caller's word (--lora-modules' base_model_name) over the folder's.
  if (!base.empty()) m.base = base;
  if (m.base.empty())
    return bad((f / "adapter_config.json").string(),
               "names no base_model_name_or_path: give the base model as \"base\" in a "
               "computron.json beside it");
  m.weights_path = f.string();
  if (m.tokenizer.empty() && has_tokenizer_files(f)) m.tokenizer = f.string();
  if (texts && !m.tokenizer.empty()) (void)texts->open(m.tokenizer);
  return m;
}

/// One repository folder as the model `name` (its folder's name, or the name a one-model
/// folder is served as), or the error that keeps it from being one.
caf::expected<actors::model_config> read_folder(const fs::path& f, text::text_directory* texts,
                                                const std::string& name) {
  auto cfg_path = f / "config.json";
  actors::model_config m;
  m.name = name;
  if (models::is_hf_folder(f.string())) {
    // A Hugging Face folder as downloaded (OPT or the Llama family): its config.json
    // gives the shape and dtype; our settings, if any, sit beside it in computron.json.
    auto hf = models::read_hf_config(f.string());
    if (!hf) return hf.error();
    if (auto err = models::check_checkpoint_files(f.string())) return err;
    m.kind = models::to_string(hf->spec.family);
    m.spec = hf->spec.name;
    if (hf->spec.family == models::model_family::opt)
      m.shape = {hf->spec.hidden, hf->spec.layers, hf->spec.heads,
                 hf->spec.ffn,    hf->spec.vocab,  hf->spec.max_positions};
    else
      m.arch = models::to_json(hf->spec).dump();
    m.checkpoint_dtype = hf->dtype;
    m.dtype = "auto";
    m.weights_path = f.string();
    if (has_tokenizer_files(f)) {
      m.tokenizer = f.string();
      // Ids the tokenizer can produce must all be rows of the embedding. Read into the
      // directory the server looks text files up in, so that no request opens them; an
      // entry there is never replaced (models serving with it keep it).
      caf::expected<std::shared_ptr<const text::tokenizer>> tok{nullptr};
      if (texts) {
        auto t = texts->open(m.tokenizer);
        if (!t) return t.error();
        tok = (*t)->tok;
      } else {
        tok = text::tokenizer::open(m.tokenizer);
      }
      if (!tok) return tok.error();
      if ((*tok)->size() > hf->spec.vocab)
        return bad((f / "config.json").string(),
                   fmt::format("vocab_size {} is smaller than the tokenizer's {} ids",
                               hf->spec.vocab, (*tok)->size()));
    }
    auto ours = f / "computron.json";
    json settings = json::object();
    if (fs::exists(ours)) {
      auto j = read_json_file(ours);
      if (!j) return j.error();
      settings = *j;
    }
    if (auto e = read_model(settings, ours.string(), f, m)) return e;
    if (m.name != name) return bad(ours.string(), name_differs(m.name, name, f));
    return m;
  }
  auto j = read_json_file(cfg_path);
  if (!j) return j.error();
  if (auto e = read_model(*j, cfg_path.string(), f, m)) return e;
  if (m.name != name) return bad(cfg_path.string(), name_differs(m.name, name, f));
  if (m.weights_path.empty() && fs::exists(f / "weights.safetensors"))
    m.weights_path = (f / "weights.safetensors").string();
  if (m.tokenizer.empty() && has_tokenizer_files(f)) m.tokenizer = f.string();
  if (texts && !m.tokenizer.empty()) {
    // Opened here, off the request path; a broken tokenizer is the text requests' error.
    (void)texts->open(m.tokenizer);
  }
  return m;
}

/// `dir` without a trailing separator or dots, so that its last part is its name
/// (`./opt-125m/` and `.` name their folders).
fs::path folder_path(const std::string& dir) {
  std::error_code ec;
  auto p = fs::absolute(fs::path{dir}, ec);
  if (ec) p = fs::path{dir};
  p = p.lexically_normal();
  if (p.filename().empty() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

}  // namespace

bool is_model_folder(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path{dir} / "config.json", ec);
}

bool is_adapter_folder(const std::string& dir) {
  std::error_code ec;
  return !is_model_folder(dir) && fs::is_regular_file(fs::path{dir} / "adapter_config.json", ec);
}

caf::expected<std::vector<actors::repository_folder>> read_repository(
    const std::string& dir, const std::string& only, text::text_directory* texts,
    const std::string& served_name) {
  std::error_code ec;
  if (models::is_gguf_file(dir)) {
    // One GGUF file given as the repository: that model alone, named after the file.
    auto self = folder_path(dir);
    actors::repository_folder rf;
    rf.name = served_name.empty() ? self.stem().string() : served_name;
    if (!only.empty() && only != rf.name) return std::vector<actors::repository_folder>{};
    auto m = read_gguf(self, texts, rf.name);
    if (m)
      rf.config = std::move(*m);
    else
      rf.error = std::move(m.error());
    return std::vector<actors::repository_folder>{std::move(rf)};
  }
  if (!fs::is_directory(dir, ec))
    return make_error(ec::io_error,
                      "model repository " + dir + " is neither a folder nor a GGUF file");
  if (!served_name.empty() && !is_model_folder(dir))
    return make_error(ec::invalid_configuration,
                      "--served-model-name names the model of one folder (one that holds "
                      "config.json), and " +
                          dir + " is a repository of model folders, each served by its name");
  std::vector<fs::path> folders;
  if (is_model_folder(dir)) {
    // One model's folder given as the repository (as `vllm serve ./model` takes it): that
    // model alone, named after the folder. Its subfolders are never models of their own
    // (a Hugging Face download may carry some, e.g. original/).
    auto self = folder_path(dir);
    auto name = served_name.empty() ? self.filename().string() : served_name;
    if (only.empty() || only == name) folders.push_back(self);
  } else if (!only.empty()) {
    // A name is a folder name, never a path.
    if (only.find('/') == std::string::npos && only != "." && only != "..") {
      if (fs::is_directory(fs::path{dir} / only, ec))
        folders.push_back(fs::path{dir} / only);
      else if (models::is_gguf_file((fs::path{dir} / (only + ".gguf")).string()))
        folders.push_back(fs::path{dir} / (only + ".gguf"));
    }
  } else {
    // Model folders, and GGUF files (each a model named after the file).
    for (auto& entry : fs::directory_iterator(dir, ec))
      if (entry.is_directory(ec) ||
          (entry.path().extension() == ".gguf" && models::is_gguf_file(entry.path().string())))
        folders.push_back(entry.path());
    if (ec) return make_error(ec::io_error, "cannot list " + dir + ": " + ec.message());
  }
  std::sort(folders.begin(), folders.end());
  std::vector<actors::repository_folder> out;
  const bool single = is_model_folder(dir);
  for (auto& f : folders) {
    // Hidden folders (.git, editors' caches) are never models; a model folder given
    // itself is served whatever its name.
    if (!single && f.filename().string().rfind('.', 0) == 0) continue;
    actors::repository_folder rf;
    const bool gguf = !single && models::is_gguf_file(f.string());
    rf.name = single && !served_name.empty() ? served_name
              : gguf                         ? f.stem().string()
                                             : f.filename().string();
    auto m = gguf                            ? read_gguf(f, texts, rf.name)
             : is_adapter_folder(f.string()) ? read_adapter_folder(f, texts, rf.name)
                                             : read_folder(f, texts, rf.name);
    if (m)
      rf.config = std::move(*m);
    else
      rf.error = std::move(m.error());
    out.push_back(std::move(rf));
  }
  return out;
}

caf::expected<actors::model_config> read_model_source(const std::string& path,
                                                      const std::string& name,
                                                      text::text_directory* texts) {
  if (models::is_gguf_file(path)) return read_gguf(folder_path(path), texts, name);
  if (is_model_folder(path)) return read_folder(folder_path(path), texts, name);
  if (is_adapter_folder(path)) return read_adapter_folder(folder_path(path), texts, name);
  return make_error(ec::invalid_configuration,
                    path +
                        " is neither a GGUF file, a model's folder (one that holds "
                        "config.json) nor a LoRA adapter's (adapter_config.json)");
}

caf::expected<actors::model_config> read_adapter_source(const std::string& path,
                                                        const std::string& name,
                                                        const std::string& base) {
  if (!is_adapter_folder(path))
    return make_error(
        ec::invalid_configuration,
        path + " is not a LoRA adapter's folder (one that holds adapter_config.json)");
  return read_adapter_folder(folder_path(path), nullptr, name, base);
}

caf::expected<std::vector<actors::model_config>> load_repository(const std::string& dir) {
  auto folders = read_repository(dir);
  if (!folders) return folders.error();
  std::vector<actors::model_config> out;
  for (auto& f : *folders) {
    if (f.error) return f.error;
    out.push_back(std::move(f.config));
  }
  return out;
}

caf::error add_repository(serve_config& c, const std::string& dir) {
  auto folders = read_repository(dir, {}, nullptr, c.served_name);
  if (!folders) return folders.error();
  for (auto& f : *folders)
    for (auto& m : c.models)
      if (m.name == f.name) {
        auto why = fmt::format(
            "model {} is both in the config's models and in the repository {}: rename one", f.name,
            dir);
        return make_error(ec::invalid_configuration, why);
      }
  c.repository = dir;
  if (is_model_folder(dir))
    log::info("repository {} holds config.json: serving it as one model folder ({})", dir,
              folders->empty() ? std::string{"?"} : folders->front().name);
  for (auto& f : *folders) {
    if (f.error) {
      // Listed by the repository index as failed, with this reason; the rest serve.
      log::warn("repository folder {} is not served: {}", f.name, render(f.error));
      continue;
    }
    c.models.push_back(std::move(f.config));
  }
  return {};
}

}  // namespace computron::serve
