#pragma once

// The serve config's section readers (serve_config.cpp calls them in the file's order), and
// one model's entry, which a repository folder's config.json shares. Each reads its keys of
// the config file `file` into `c` when present; `where` names the file in errors.
#include <filesystem>
#include <string>

#include <caf/error.hpp>
#include <nlohmann/json.hpp>

#include "serve/serve_config.hpp"

namespace computron::serve {

/// `devices`: kind, count, capacity_mb, link_gbps, reserved_mb (devices_section.cpp).
caf::error read_devices(const nlohmann::json& file, const std::string& where, serve_config& c);

/// `scheduler`: the ledger's policy, transfers, workspace, KV reserve, load timeout
/// (scheduler_section.cpp).
caf::error read_scheduler(const nlohmann::json& file, const std::string& where, serve_config& c);

/// `batching`: batch size and window, dispatch, queue, deadlines (scheduler_section.cpp).
caf::error read_batching(const nlohmann::json& file, const std::string& where, serve_config& c);

/// `frontend`: the outstanding requests admitted (scheduler_section.cpp).
caf::error read_frontend(const nlohmann::json& file, const std::string& where, serve_config& c);

/// `http`: the HTTP server (server_section.cpp).
caf::error read_http(const nlohmann::json& file, const std::string& where, serve_config& c);

/// `nodes`, `console_host`, `console_port`, `node_wait_s` and `tls`: the controller's peers
/// (server_section.cpp). Relative certificate paths resolve from `base`.
caf::error read_controller(const nlohmann::json& file, const std::string& where,
                           const std::filesystem::path& base, serve_config& c);

/// `trace_file`, `compute_threads` and `chunk_mb`: the process (server_section.cpp).
caf::error read_process(const nlohmann::json& file, const std::string& where, serve_config& c);

/// `models` (inline entries) and `repository` (models_section.cpp); `repository` (serve's
/// --repository) is served instead of the file's key.
caf::error read_models(const nlohmann::json& file, const std::string& where,
                       const std::filesystem::path& base, const std::string& repository,
                       serve_config& c);

/// One model: an entry of `models`, or a repository folder's config.json or computron.json.
/// Relative weights and tokenizer paths resolve from `base`.
caf::error read_model(const nlohmann::json& j, const std::string& where,
                      const std::filesystem::path& base, actors::model_config& m);

/// A file of a Python package in computron's Python environment ($COMPUTRON_VENV, else
/// ~/.cache/computron/venv, where scripts/setup installs them), as `python:PACKAGE/FILE`
/// names it in a config; the error names the environment and the package.
caf::expected<std::string> python_package_file(const std::string& relative);

/// The tokenizer "gpt2" names: GPT-2's files where scripts/setup installed them, else
/// "bytes"; `warn` logs the fallback.
std::string gpt2_tokenizer(bool warn = true);

}  // namespace computron::serve
