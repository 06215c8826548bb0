#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

/// The Python environment scripts/setup fills outside the clone (torch, transformers,
/// tokenizers, jinja2, openai, gguf: the Python oracles and clients the tests run):
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

}  // namespace computron::test
