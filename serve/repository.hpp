#pragma once

// The model repository: one folder per model, read into model configs for the serve config
// (and, on request, again by the running server's repository actor).
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "actors/registry.hpp"
#include "serve/serve_config.hpp"
#include "text/text_directory.hpp"

namespace computron::serve {

/// Whether `dir` is itself one model's folder: it holds config.json.
bool is_model_folder(const std::string& dir);

/// Whether `dir` is a PEFT LoRA adapter's folder: adapter_config.json, no config.json. In a
/// repository it is served as an adapter of the model its computron.json's "base" or its
/// base_model_name_or_path names.
bool is_adapter_folder(const std::string& dir);

/// Reads a model repository: one folder per model holding config.json (the model_config
/// fields) and optionally weights.safetensors, or a Hugging Face OPT folder. Every
/// folder (or only the one named `only`; hidden ones never) comes back with its model or
/// the error that names the folder and the problem. A `dir` that is itself a model folder
/// (is_model_folder) is a repository of that one model, named after the folder; its
/// subfolders are not read; `served_name`, when given, names that one model instead (a
/// repository of several folders refuses it). `texts`: where a folder's tokenizer, chat template
/// and generation defaults are opened (read again after a change on disk); null: the tokenizer is
/// opened only for the vocabulary check. Error: `dir` is not a folder.
caf::expected<std::vector<actors::repository_folder>> read_repository(
    const std::string& dir, const std::string& only = {}, text::text_directory* texts = nullptr,
    const std::string& served_name = {});

/// One model from a GGUF file or a model folder (ours, or Hugging Face's), served as
/// `name`: what read_repository makes of one entry. `texts` as there.
caf::expected<actors::model_config> read_model_source(const std::string& path,
                                                      const std::string& name,
                                                      text::text_directory* texts = nullptr);

/// A PEFT adapter's folder as the adapter `name` of `base` (empty: the base its folder
/// names). Errors: not an adapter's folder, or the folder's own.
caf::expected<actors::model_config> read_adapter_source(const std::string& path,
                                                        const std::string& name,
                                                        const std::string& base = {});

/// read_repository, strict: the first folder that cannot be read is the error.
caf::expected<std::vector<actors::model_config>> load_repository(const std::string& dir);

/// Serves `dir` as the model repository: its readable folders join `c.models`, the
/// others are logged (the repository index lists them with their reason), and the
/// server gets model control over it. A one-model folder is served as `c.served_name`
/// where that is set. Errors: `dir` is not a folder; a folder named like a model already
/// in `c.models`; a served name for a repository of several folders.
caf::error add_repository(serve_config& c, const std::string& dir);

}  // namespace computron::serve
